package simscale

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// small is a fast config: a 4 MB result (what a 1B model's frame is) over
// the target links, four rounds.
func small(n int) Config {
	c := DefaultConfig(n)
	c.Rounds, c.PayloadBytes = 5, 4<<20
	return c
}

func TestRun(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cfg   Config
		bound func(*testing.T, *Report)
	}{
		{"4 trainers, compute-bound", small(4), func(t *testing.T, r *Report) {
			// Three 4 MB fetches at 1 Gbit/s take ~0.1 s: training ahead
			// hides them behind the 0.734 s step.
			if r.Overhead > 100*time.Millisecond {
				t.Errorf("overhead %v at 4 trainers, want the network hidden behind compute", r.Overhead)
			}
		}},
		{"16 trainers", small(16), func(t *testing.T, r *Report) {
			// Every trainer downloads 15 results: no round is shorter than
			// that at its downlink.
			floor := time.Duration(float64(15*r.PayloadBytes) / (1e9 / 8) * float64(time.Second))
			if r.RoundTime < floor {
				t.Errorf("round %v, shorter than the download floor %v", r.RoundTime, floor)
			}
			if r.RecvBytes < float64(15*r.PayloadBytes) {
				t.Errorf("received %.0f bytes a round, want at least the 15 results", r.RecvBytes)
			}
		}},
		{"16 trainers, ring order", func() Config { c := small(16); c.FetchOrder = FetchRing; return c }(), nil},
		{"8 trainers, internet", func() Config { c := small(8); c.Rounds, c.Network = 4, Internet; return c }(), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Run(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := tt.cfg.Trainers
			if r.Rounds != tt.cfg.Rounds-2 {
				t.Errorf("%d rounds measured, want %d", r.Rounds, tt.cfg.Rounds-2)
			}
			// A trainer trains ahead before the coordinator starts the
			// round, so one round may end a hair early; none is shorter
			// than its compute by more than the clock's resolution.
			if r.RoundTime < r.Compute-10*time.Millisecond {
				t.Errorf("round %v shorter than its compute %v", r.RoundTime, r.Compute)
			}
			if want := float64(min(n, coordinator.MaxWitnesses)); r.WitnessReports != want {
				t.Errorf("%.1f witness reports a round, want %.0f", r.WitnessReports, want)
			}
			if r.HealthDrops != 0 || r.QuorumMisses != 0 || r.MissingResults != 0 {
				t.Errorf("an honest run dropped %d, missed %d, applied without %d", r.HealthDrops, r.QuorumMisses, r.MissingResults)
			}
			if !(r.Published <= r.LastResultIn && r.LastResultIn <= r.RoundTime+time.Second) {
				t.Errorf("parts out of order: published %v, last result %v, round %v", r.Published, r.LastResultIn, r.RoundTime)
			}
			if r.ComputeUnits <= 0 || r.Instructions["witness"] == 0 {
				t.Errorf("instructions %v, %.0f CU", r.Instructions, r.ComputeUnits)
			}
			if tt.bound != nil {
				tt.bound(t, r)
			}
		})
	}
}

// The same seed gives the same report; another seed draws other links.
func TestDeterministic(t *testing.T) {
	cfg := small(8)
	cfg.Rounds, cfg.Network = 4, Internet
	a, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two runs of one seed differ:\n%+v\n%+v", a, b)
	}
	cfg.Seed++
	c, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a, c) {
		t.Error("another seed gave the same report")
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"past the account", func(c *Config) { c.Trainers = coordinator.MaxClients + 1 }, "holds 1 to 256 clients"},
		{"too few rounds", func(c *Config) { c.Rounds = 2 }, "at least 3"},
		{"no payload", func(c *Config) { c.PayloadBytes = 0 }, "payload"},
		{"fetch order", func(c *Config) { c.FetchOrder = "random" }, "fetch order"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := small(4)
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// The program costs embed scripts/bench-program's table whole.
func TestProgramCosts(t *testing.T) {
	costs, err := parseCosts(programCosts)
	if err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{"witness", "health_check", costLabel("tick", "RoundWitness", "RoundTrain"), costLabel("tick", "RoundTrain", "RoundWitness")} {
		row, ok := costs[label]
		if !ok {
			t.Fatalf("no row %q", label)
		}
		if got := row.at(64); got != row[1] {
			t.Errorf("%s at 64 clients: %v, want the measured %v", label, got, row[1])
		}
		if lo, mid, hi := row.at(4), row.at(16), row.at(64); mid < min(lo, hi) || mid > max(lo, hi) {
			t.Errorf("%s at 16 clients: %v, not between %v and %v", label, mid, lo, hi)
		}
	}
}

// A frame's typical size is the encoding's, within its bound, and grows
// with top-k.
func TestFrameSize(t *testing.T) {
	shapes := [][]int{{256, 128}, {128}, {2, 64, 64}}
	prev := int64(0)
	for _, k := range []int{4, 12, 32} {
		typical, largest, err := FrameSize(shapes, 64, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		if typical <= prev || typical > largest {
			t.Errorf("top-k %d: %d bytes (largest %d, previous %d)", k, typical, largest, prev)
		}
		prev = typical
	}
}

// The flow model shares a link fairly and caps a flow by its window.
func TestFlows(t *testing.T) {
	var s sched
	n := &network{s: &s, step: time.Millisecond}
	for range 3 {
		n.hosts = append(n.hosts, host{Link: Link{Up: 1e6, Down: 1e6, Half: 0}})
	}
	var done []time.Duration
	// Two flows into host 2 share its downlink: 1 MB each at 0.5 MB/s.
	n.transfer(0, 2, 1e6, nil, func() { done = append(done, s.now) })
	n.transfer(1, 2, 1e6, nil, func() { done = append(done, s.now) })
	s.run(func() bool { return false }, time.Hour)
	for _, d := range done {
		if d < 1990*time.Millisecond || d > 2010*time.Millisecond {
			t.Errorf("flow done at %v, want 2 s", d)
		}
	}
	n.hosts[0].Half, n.hosts[2].Half = 50*time.Millisecond, 50*time.Millisecond
	n.hosts[0].Up, n.hosts[2].Down = 1e9, 1e9
	if c := n.flowCap(0, 2); c != maxWindow/0.2 {
		t.Errorf("window cap %v, want %v", c, maxWindow/0.2)
	}
}
