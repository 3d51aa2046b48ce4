package node

// WithCorruptResults makes the node publish corrupt(payload) instead of its
// result: a trainer gone bad, for fault-injection tests.
func WithCorruptResults(corrupt func([]byte) []byte) Option {
	return func(c *config) error { c.corrupt = corrupt; return nil }
}
