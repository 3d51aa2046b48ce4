package federated

// The JSON a federated service answers with (its byte formats are in the
// wire_*.go files).

// Info is the answer to GET /v1/runs/{id}/federated.
type Info struct {
	Run                  string  `json:"run"`
	Round                uint64  `json:"round"`
	Contributions        uint64  `json:"contributions"`
	Buffered             int     `json:"buffered"`
	Capacity             uint32  `json:"capacity"`
	MaxStaleness         uint32  `json:"max_staleness"`
	RoundDuration        uint32  `json:"round_duration"`
	Rounds               uint32  `json:"rounds"`
	Aggregation          string  `json:"aggregation"`
	Params               int     `json:"params"`
	Clip                 float32 `json:"clip"`
	NoiseMultiplier      float32 `json:"noise_multiplier"`
	LocalNoiseMultiplier float32 `json:"local_noise_multiplier"`
	SamplingRate         float64 `json:"sampling_rate"`
	SecAgg               bool    `json:"secagg"`
	SecAggThreshold      uint32  `json:"secagg_threshold,omitempty"`
	SecAggNeighbors      uint32  `json:"secagg_neighbors,omitempty"`
	// Epsilon is the central (ε, Delta) guarantee so far; nil where there
	// is none (no noise or no clipping). EpsilonLocal is each client's
	// guarantee from its local noise.
	Epsilon      *float64 `json:"epsilon"`
	EpsilonLocal *float64 `json:"epsilon_local"`
	Delta        float64  `json:"delta"`
	Paused       bool     `json:"paused"`
	Finished     bool     `json:"finished"`
}

// PushResult is the answer to an accepted update.
type PushResult struct {
	Round    uint64 `json:"round"`    // the server's round after the update
	Buffered int    `json:"buffered"` // updates waiting
	Capacity uint32 `json:"capacity"`
}

// Failure is the answer to a refused request.
type Failure struct {
	Name  string `json:"name"` // Stale, Paused, Shape, Replay, Finished, BadRequest, Forbidden, RunNotFound, NotFederated, Storage
	Error string `json:"error"`
	Round uint64 `json:"round,omitempty"` // Stale: the server's round
}

// InfoOf summarizes a state.
func InfoOf(run string, s *State, paused bool) Info {
	c := &s.Config
	in := Info{Run: run, Round: s.Round, Contributions: s.Contributions, Buffered: len(s.Buffer), Capacity: c.Capacity,
		MaxStaleness: c.MaxStaleness, RoundDuration: c.RoundDuration, Rounds: c.Rounds, Aggregation: c.Aggregation.String(),
		Params: len(s.Model), Clip: c.Clip, NoiseMultiplier: c.NoiseMultiplier, LocalNoiseMultiplier: c.LocalNoiseMultiplier,
		SamplingRate: c.SamplingRate(), SecAgg: c.SecAgg, SecAggThreshold: c.SecAggThreshold, SecAggNeighbors: c.SecAggNeighbors, Delta: c.DeltaOrDefault(), Paused: paused, Finished: s.Finished()}
	if central, local, err := s.Privacy(); err == nil {
		if central < 1e300 {
			in.Epsilon = &central
		}
		if local < 1e300 {
			in.EpsilonLocal = &local
		}
	}
	return in
}
