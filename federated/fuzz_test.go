package federated

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// newTestSigner is the key pair a name stands for, the same in every run of the
// tests (chain.Keypair already signs as federated.Signer asks).
func newTestSigner(name string) *chain.Keypair {
	return chain.KeypairFromSeed(sha256.Sum256([]byte(name)))
}

// TestRequestLayout checks the offsets table of wire_request.go and
// wire_update.go.
func TestRequestLayout(t *testing.T) {
	s := newTestSigner("a")
	payload := EncodeUpdate(&UpdatePayload{Base: 7, Steps: 3, Delta: []float32{1, -2}})
	if len(payload) != updateHeaderSize+8 || payload[0] != 7 || payload[8] != 3 || payload[16] != 2 {
		t.Fatalf("update payload layout: % x", payload)
	}
	b, err := EncodeRequest(KindUpdate, "run", 9, payload, s)
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "PSFR" || b[4] != RequestVersion || b[5] != byte(KindUpdate) || string(b[8:11]) != "run" || b[40] != 9 ||
		b[48] != byte(len(payload)) || !bytes.Equal(b[52:52+len(payload)], payload) || len(b) != 52+len(payload)+96 {
		t.Fatalf("request layout: % x", b)
	}
	r, err := DecodeRequest(b)
	if err != nil || r.Signer != s.Public() || r.Sequence != 9 || r.RunIDString() != "run" || r.Kind != KindUpdate {
		t.Fatalf("decode: %+v %v", r, err)
	}
	b[60] ^= 1 // a payload byte
	if _, err := DecodeRequest(b); !errors.Is(err, ErrSignature) {
		t.Fatalf("tampered request: %v", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	s := newTestSigner("a")
	for _, p := range [][]byte{nil, EncodeUpdate(&UpdatePayload{Base: 1, Steps: 1, Delta: []float32{1}}), EncodeConfig(&Config{Capacity: 1, RoundDuration: 1})} {
		b, _ := EncodeRequest(KindUpdate, "r", 1, p, s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			return
		}
		if len(r.Payload) > MaxPayload || len(b) > MaxRequest {
			t.Fatalf("accepted %d bytes of payload", len(r.Payload))
		}
	})
}

func FuzzDecodeUpdate(f *testing.F) {
	f.Add(EncodeUpdate(&UpdatePayload{Base: 1, Steps: 2, Delta: []float32{1, 2, 3}}))
	f.Add(EncodeUpdate(&UpdatePayload{Base: 1, Steps: 2, Frame: []byte("PSDF...")}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeUpdate(b)
		if err != nil {
			return
		}
		if again := EncodeUpdate(u); !bytes.Equal(again, b) {
			t.Fatalf("round trip: % x became % x", b, again)
		}
	})
}

func FuzzDecodeModel(f *testing.F) {
	f.Add(EncodeModel(3, []float32{1, 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		round, params, err := DecodeModel(b)
		if err != nil {
			return
		}
		if again := EncodeModel(round, params); !bytes.Equal(again, b) {
			t.Fatalf("round trip differs")
		}
	})
}

func FuzzDecodeConfig(f *testing.F) {
	f.Add(EncodeConfig(&Config{Capacity: 3, RoundDuration: 5, Clip: 1, NoiseMultiplier: 1.1, Delta: 1e-5}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeConfig(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("decoded an invalid config: %v", err)
		}
		if again := EncodeConfig(c); !bytes.Equal(again, b) {
			t.Fatalf("round trip differs")
		}
	})
}

func sampleState() *State {
	a, b := newTestSigner("a").Public(), newTestSigner("b").Public()
	return &State{Config: Config{Capacity: 3, RoundDuration: 2, Clip: 1, NoiseMultiplier: 0.5}, Round: 4, Contributions: 12,
		Model: []float32{1, 2, 3}, Seqs: map[coordinator.Pubkey]uint64{a: 5, b: 9}, Members: map[coordinator.Pubkey]bool{a: true, b: true},
		Buffer:      []Update{{Client: a, Base: 4, Steps: 2, Delta: []float32{0.5, 0, -1}}},
		Contributed: map[coordinator.Pubkey]uint64{b: 3}}
}

func TestStateRoundTrip(t *testing.T) {
	s := sampleState()
	b := EncodeState(s)
	got, err := DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if Describe(got, nil) != Describe(s, nil) || got.Seqs[newTestSigner("b").Public()] != 9 || !slices.Equal(got.Model, s.Model) ||
		!got.IsMember(newTestSigner("a").Public()) || len(got.Members) != 2 ||
		len(got.Contributed) != 1 || !got.Contributor(newTestSigner("b").Public()) || got.Contributor(newTestSigner("a").Public()) {
		t.Fatalf("round trip:\n%s\nwant\n%s", Describe(got, nil), Describe(s, nil))
	}
	// A version 2 file (no contributors section) reads with its members
	// and no contributors.
	contributors := 4 + 40*len(s.Contributed)
	v2 := slices.Clone(b[:len(b)-32-contributors])
	v2[4] = 2
	sum2 := sha256.Sum256(v2)
	old2, err := DecodeState(append(v2, sum2[:]...))
	if err != nil || len(old2.Members) != 2 || len(old2.Contributed) != 0 {
		t.Fatalf("a version 2 file: %v", err)
	}
	// A version 1 file (no members section) still reads: its replay table
	// stays, and it has no members (its clients join again).
	v1 := slices.Clone(b[:len(b)-32-contributors-4-32*len(s.Members)])
	v1[4] = 1
	sum := sha256.Sum256(v1)
	old, err := DecodeState(append(v1, sum[:]...))
	if err != nil {
		t.Fatalf("a version 1 file: %v", err)
	}
	if len(old.Members) != 0 || old.Seqs[newTestSigner("b").Public()] != 9 {
		t.Fatalf("a version 1 file: %d members, replay %v", len(old.Members), old.Seqs)
	}
	b[len(b)/2] ^= 1
	if _, err := DecodeState(b); err == nil {
		t.Fatal("a corrupted state file was read")
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add(EncodeState(sampleState()))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeState(b)
		if err != nil {
			return
		}
		if _, err := Restore(s); err != nil {
			t.Fatalf("decoded a state that cannot be restored: %v", err)
		}
		again := EncodeState(s)
		if b[4] == StateVersion && !bytes.Equal(again, b) {
			t.Fatalf("round trip differs")
		}
		// A version 1 file is rewritten as the current version, which
		// then reads back the same.
		if s2, err := DecodeState(again); err != nil || !bytes.Equal(EncodeState(s2), again) {
			t.Fatalf("the re-encoded state does not round trip: %v", err)
		}
	})
}

// TestCombineMeanIsTheAverage checks the optimized aggregation against the
// definition on random inputs.
func TestCombineMeanIsTheAverage(t *testing.T) {
	cfg := &Config{Capacity: 3, RoundDuration: 1}
	buf := []Update{{Delta: []float32{1, 2}}, {Delta: []float32{3, 4}}, {Delta: []float32{-1, 0}}}
	got := Combine(cfg, 0, buf, 2, [32]byte{})
	if math.Abs(float64(got[0])-1) > 1e-6 || math.Abs(float64(got[1])-2) > 1e-6 {
		t.Fatalf("mean: %v", got)
	}
}
