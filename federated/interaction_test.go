package federated

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/transcript"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the transcripts in testdata/ with the actual output")

// TestTranscripts replays testdata/*.txt. Commands:
//
//	new capacity=2 staleness=0 agg=mean clip=0 noise=0 lr=1 rounds=0 model=0,0,0 members=a,b
//	                                          (members: clients that joined before)
//	join client=a seq=1
//	push client=a seq=1 base=0 steps=1 delta=1,2,3 seed=0
//	config signer=admin seq=1 capacity=1 ...   (the keys of new, without model)
//	sumpush clients=a,b base=0 mean=1,2,3 seed=0   (a secure aggregation round's mean)
//	state
//	restart                                   (encode, decode and restore the state)
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, *rewrite, func(t *testing.T) func(a *transcript.Args) string {
		h := &harness{names: map[coordinator.Pubkey]string{}}
		return func(a *transcript.Args) string { return h.run(t, a) }
	})
}

type harness struct {
	m     *Machine
	names map[coordinator.Pubkey]string
}

func (h *harness) key(name string) coordinator.Pubkey {
	k := coordinator.Pubkey(sha256.Sum256([]byte("client:" + name)))
	h.names[k] = name
	return k
}

func (h *harness) name(k coordinator.Pubkey) string { return h.names[k] }

func parseFloats(t *testing.T, s string) []float32 {
	var v []float32
	for _, f := range strings.Split(s, ",") {
		x, err := strconv.ParseFloat(f, 32)
		if err != nil {
			t.Fatalf("bad number %q", f)
		}
		v = append(v, float32(x))
	}
	return v
}

func parseConfig(t *testing.T, args *transcript.Args) Config {
	c := Config{Capacity: 2, RoundDuration: 1}
	num := func(k string, dst *uint32) {
		if v, ok := args.Lookup(k); ok {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				t.Fatalf("%s=%q", k, v)
			}
			*dst = uint32(n)
		}
	}
	flt := func(k string, dst *float32) {
		if v, ok := args.Lookup(k); ok {
			f, err := strconv.ParseFloat(v, 32)
			if err != nil {
				t.Fatalf("%s=%q", k, v)
			}
			*dst = float32(f)
		}
	}
	num("capacity", &c.Capacity)
	num("staleness", &c.MaxStaleness)
	num("rounds", &c.Rounds)
	num("population", &c.Population)
	flt("clip", &c.Clip)
	flt("noise", &c.NoiseMultiplier)
	flt("lr", &c.ServerLR)
	flt("localnoise", &c.LocalNoiseMultiplier)
	num("threshold", &c.SecAggThreshold)
	if args.Get("secagg") == "true" {
		c.SecAgg = true
	}
	if v, ok := args.Lookup("agg"); ok {
		a, err := ParseAggregation(v)
		if err != nil {
			t.Fatal(err)
		}
		c.Aggregation = a
	}
	return c
}

func (h *harness) run(t *testing.T, args *transcript.Args) string {
	cmd := args.Cmd
	u := func(k string) uint64 {
		n, err := strconv.ParseUint(args.Get(k), 10, 64)
		if err != nil {
			t.Fatalf("%s: %s=%q", cmd, k, args.Get(k))
		}
		return n
	}
	var err error
	switch cmd {
	case "new":
		h.m, err = New(parseConfig(t, args), parseFloats(t, args.Get("model")))
		if err != nil {
			return "error: " + err.Error()
		}
		if ms, ok := args.Lookup("members"); ok {
			for _, n := range strings.Split(ms, ",") {
				h.m.s.Members[h.key(n)] = true
			}
		}
		h.m.Advance()
		return Describe(h.m.State(), h.name)
	case "join":
		err = h.m.Step(Join{Client: h.key(args.Get("client")), Seq: u("seq")})
	case "push":
		steps := uint64(1)
		if _, ok := args.Lookup("steps"); ok {
			steps = u("steps")
		}
		var seed [32]byte
		if s, ok := args.Lookup("seed"); ok {
			seed[0] = s[0]
		}
		err = h.m.Step(Push{Client: h.key(args.Get("client")), Seq: u("seq"), Base: u("base"), Steps: uint32(steps),
			Delta: parseFloats(t, args.Get("delta")), Noise: seed})
	case "sumpush":
		var clients []coordinator.Pubkey
		for _, n := range strings.Split(args.Get("clients"), ",") {
			clients = append(clients, h.key(n))
		}
		var seed [32]byte
		if s, ok := args.Lookup("seed"); ok {
			seed[0] = s[0]
		}
		err = h.m.Step(SumPush{Clients: clients, Base: u("base"), Mean: parseFloats(t, args.Get("mean")), Noise: seed})
	case "config":
		err = h.m.Step(Configure{Signer: h.key(args.Get("signer")), Seq: u("seq"), Config: parseConfig(t, args)})
	case "state":
		return Describe(h.m.State(), h.name)
	case "privacy":
		c, l, err := h.m.State().Privacy()
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("central ε=%.4f local ε=%.4f (δ=%g)", c, l, h.m.State().Config.DeltaOrDefault())
	case "restart":
		s, err := DecodeState(EncodeState(h.m.State()))
		if err != nil {
			return "error: " + err.Error()
		}
		if h.m, err = Restore(s); err != nil {
			return "error: " + err.Error()
		}
		return Describe(h.m.State(), h.name)
	default:
		t.Fatalf("unknown command %q", cmd)
	}
	var out strings.Builder
	if err != nil {
		var stale *StaleError
		if errors.As(err, &stale) {
			fmt.Fprintf(&out, "refused (stale): %v\n", err)
		} else {
			fmt.Fprintf(&out, "refused: %v\n", err)
		}
	} else {
		out.WriteString("ok\n")
	}
	out.WriteString(DescribeReady(h.m.Ready(), h.name))
	h.m.Advance()
	return out.String()
}
