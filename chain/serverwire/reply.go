package serverwire

// Result is the reply to a request.
type Result struct {
	Changed     bool   `json:"changed"`
	From        string `json:"from"`
	To          string `json:"to"`
	Nonce       uint64 `json:"nonce"`
	Incarnation uint64 `json:"incarnation"` // the run's (after init_coordinator: the new one)
}

// Failure is the reply to a rejected request.
type Failure struct {
	Code  uint32 `json:"code,omitempty"` // coordinator error code, if any
	Name  string `json:"name"`
	Error string `json:"error"`
}
