package federated

import (
	"errors"
	"fmt"
	"math"
)

// Aggregation is how a buffer's updates combine.
type Aggregation uint8

const (
	// Mean is the (staleness-weighted) average of the updates.
	Mean Aggregation = iota
	// ClippedMean clips each update to the median of the buffer's norms,
	// then averages: one client cannot steer the model further than a
	// typical one.
	ClippedMean
	// Median is the coordinate-wise median, which ignores a minority of
	// arbitrary updates (the robust rule).
	Median
)

var aggregationNames = []string{"mean", "clipped-mean", "median"}

func (a Aggregation) String() string {
	if int(a) < len(aggregationNames) {
		return aggregationNames[a]
	}
	return fmt.Sprintf("Aggregation(%d)", a)
}

// ParseAggregation reads an aggregation name; "robust" is the median.
func ParseAggregation(s string) (Aggregation, error) {
	if s == "robust" {
		return Median, nil
	}
	for i, n := range aggregationNames {
		if n == s {
			return Aggregation(i), nil
		}
	}
	return 0, fmt.Errorf("%w: aggregation %q: want mean, clipped-mean, median or robust", ErrConfig, s)
}

// Limits on configs and messages (production values: the fuzz targets and
// the HTTP body limits use the same).
const (
	MaxParams        = 1 << 24 // values in a model or update (64 MiB of float32)
	MaxCapacity      = 1024
	MaxRoundDuration = 1 << 20
	// MaxUpdateValue bounds every value of an update, clipped or not. An
	// update is a change of weights of order one; a value past 10⁴ is no
	// training step but a push towards float32's overflow (two rounds of
	// 3.4·10³⁸ made a weight +Inf). Combined by any rule, updates so
	// bounded move a weight by at most ServerLR·10⁴ a round.
	MaxUpdateValue = 1e4
	// MaxMembers bounds a run's members: an open run
	// (no join authority) takes this many keys, whoever holds them; a run
	// with a join authority, only those it signed for.
	MaxMembers = 1 << 16
	// MaxServerLR bounds ServerLR.
	MaxServerLR = 100
	// DefaultClip is the run file's clip when its [federated] section
	// leaves it out: it bounds what one client moves the model in a round
	// (an honest update of a small model measures ~1–5), and clip = 0 must
	// be asked for.
	DefaultClip = 10
)

// Config is a federated run's settings (the run file's [federated]
// section).
type Config struct {
	// Capacity is the updates the buffer collects before it aggregates
	// (1..MaxCapacity; Disco.js's default is the number of clients).
	Capacity uint32
	// MaxStaleness is how many rounds behind the server an update may have
	// been trained and still count (0: only the current round, Disco.js's
	// rule). A stale update that is accepted is weighted 1/√(1+staleness),
	// as FedBuff does.
	MaxStaleness uint32
	// RoundDuration is the local steps (batches) a client trains per round
	// (1..MaxRoundDuration).
	RoundDuration uint32
	// Rounds ends the run after this many aggregations (0: never).
	Rounds uint32
	// Aggregation combines a buffer's updates.
	Aggregation Aggregation
	// ServerLR scales the aggregated update before it is added to the model
	// (0 means 1: FedAvg).
	ServerLR float32
	// Clip bounds each update's L2 norm (0: no clipping). Differential
	// privacy needs it: it is the sensitivity the noise is scaled to.
	Clip float32
	// NoiseMultiplier is central DP's σ: the server adds N(0, (σ·Clip/k)²)
	// to each coordinate of the mean of k clipped updates (0: none).
	NoiseMultiplier float32
	// LocalNoiseMultiplier is local DP's σ: each client adds
	// N(0, (σ·Clip)²) to its clipped update before sending it (0: none).
	LocalNoiseMultiplier float32
	// Population is the number of clients the run draws on, for the
	// accountant's sampling rate q = Capacity/Population (0: q = 1).
	Population uint32
	// Delta is the δ of the reported (ε, δ) (0 means 1e-5).
	Delta float64
	// SecAgg makes clients mask their updates (federated/secagg) so that the
	// server learns only the sum; SecAggThreshold is how many of a round's
	// clients must survive for the round to complete.
	SecAgg          bool
	SecAggThreshold uint32
	// SecAggNeighbors is SecAgg+'s masking graph degree: each client
	// masks with and shares its secrets to this many others (a ring;
	// secagg.Neighbors), so a round costs O(n·k) instead of O(n²); 0 is
	// every other client (SecAgg). With k > 0 the threshold must be at
	// most k+1.
	SecAggNeighbors uint32
	// SecAggTimeout is how long, in seconds, a secure aggregation phase
	// waits for the clients that have not answered before it goes on with
	// those that have, if they are at least the threshold (0 means 30).
	SecAggTimeout uint32
}

// DeltaOrDefault is δ with its default.
func (c *Config) DeltaOrDefault() float64 {
	if c.Delta == 0 {
		return 1e-5
	}
	return c.Delta
}

// SamplingRate is the accountant's q.
func (c *Config) SamplingRate() float64 {
	if c.Population == 0 || c.Population <= c.Capacity {
		return 1
	}
	return float64(c.Capacity) / float64(c.Population)
}

// Validate reports every rule the config breaks.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Capacity < 1 || c.Capacity > MaxCapacity {
		bad("capacity = %d: want 1..%d", c.Capacity, MaxCapacity)
	}
	if c.RoundDuration < 1 || c.RoundDuration > MaxRoundDuration {
		bad("round_duration = %d: want 1..%d", c.RoundDuration, MaxRoundDuration)
	}
	if int(c.Aggregation) >= len(aggregationNames) {
		bad("aggregation = %d: unknown", c.Aggregation)
	}
	for name, v := range map[string]float32{"server_lr": c.ServerLR, "clip": c.Clip, "noise_multiplier": c.NoiseMultiplier,
		"local_noise_multiplier": c.LocalNoiseMultiplier} {
		if !(v >= 0) || math.IsInf(float64(v), 0) {
			bad("%s = %v: want a finite number ≥ 0", name, v)
		}
	}
	if c.ServerLR > MaxServerLR {
		bad("server_lr = %v: want at most %d", c.ServerLR, MaxServerLR)
	}
	if (c.NoiseMultiplier > 0 || c.LocalNoiseMultiplier > 0) && c.Clip == 0 {
		bad("noise needs clip > 0: the noise is scaled to the clipping bound")
	}
	// The central noise is scaled to one client's share of a plain mean,
	// clip/capacity: staleness weights or another rule change that share.
	if c.NoiseMultiplier > 0 && (c.Aggregation != Mean || c.MaxStaleness != 0) {
		bad("central noise needs aggregation = mean and max_staleness = 0 (its scale, clip/capacity, is one client's share of a plain mean)")
	}
	if !(c.Delta >= 0 && c.Delta < 1) {
		bad("delta = %v: want 0 ≤ δ < 1", c.Delta)
	}
	if c.SecAgg {
		if c.SecAggThreshold < 2 || c.SecAggThreshold > c.Capacity {
			bad("secagg_threshold = %d: want 2..capacity (%d)", c.SecAggThreshold, c.Capacity)
		}
		if c.Aggregation != Mean {
			bad("secure aggregation reveals only the sum: aggregation must be mean, not %s", c.Aggregation)
		}
		if c.MaxStaleness != 0 {
			bad("secure aggregation sums one round's updates: max_staleness must be 0")
		}
		if c.Clip == 0 {
			bad("secure aggregation needs clip > 0: the fixed-point encoding is sized for it")
		}
		if c.SecAggNeighbors > 0 && c.SecAggThreshold > c.SecAggNeighbors+1 {
			bad("secagg_threshold = %d: at most secagg_neighbors+1 (%d): a client's secrets are shared with its neighbors only", c.SecAggThreshold, c.SecAggNeighbors+1)
		}
		if c.Capacity > 255 {
			bad("secure aggregation takes at most 255 clients a round, not capacity %d", c.Capacity)
		}
	} else if c.SecAggThreshold != 0 || c.SecAggTimeout != 0 || c.SecAggNeighbors != 0 {
		bad("secagg_threshold, secagg_neighbors or secagg_timeout without secagg")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w:\n%w", ErrConfig, err)
	}
	return nil
}
