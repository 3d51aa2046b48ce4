package distro

// Snapshot is a copy of parameter tensors whose buffers are kept from one
// Save to the next. An engine's Try restores with it the very bits it saved,
// without allocating a model's worth each round.
type Snapshot struct {
	saved [][]float32
}

// Save copies params, allocating the buffers on the first call (params must
// keep their shapes from one Save to the next).
func (s *Snapshot) Save(params [][]float32) {
	if s.saved == nil {
		s.saved = make([][]float32, len(params))
		for i, p := range params {
			s.saved[i] = make([]float32, len(p))
		}
	}
	for i, p := range params {
		copy(s.saved[i], p)
	}
}

// Restore copies the last Save back into params.
func (s *Snapshot) Restore(params [][]float32) {
	for i, p := range params {
		copy(p, s.saved[i])
	}
}
