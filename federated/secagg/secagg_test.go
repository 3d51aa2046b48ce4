package secagg

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func seedOf(name string) [32]byte { return sha256.Sum256([]byte(name)) }

func TestShamirRoundTrip(t *testing.T) {
	secret := []byte("thirty-two bytes of a mask seed!")
	xs := []byte{1, 2, 3, 4, 5}
	coeffs := bytes.Repeat([]byte{0x5a, 0xc3}, 32)
	shares, err := split(secret, 3, xs, coeffs)
	if err != nil {
		t.Fatal(err)
	}
	for _, pick := range [][]int{{0, 1, 2}, {4, 2, 0}, {1, 3, 4}} {
		var px []byte
		var ps [][]byte
		for _, i := range pick {
			px, ps = append(px, xs[i]), append(ps, shares[i])
		}
		got, err := combine(px, ps, 3)
		if err != nil || !bytes.Equal(got, secret) {
			t.Fatalf("shares %v: %q %v", pick, got, err)
		}
	}
	// Two shares (below the threshold) give a wrong secret.
	got, _ := combine(xs[:2], shares[:2], 2)
	if bytes.Equal(got, secret) {
		t.Fatal("two shares of a threshold-3 secret rebuilt it")
	}
}

func TestFixedPoint(t *testing.T) {
	f, err := FractionBits(10, 1)
	if err != nil || f != 24 {
		t.Fatalf("10 clients, bound 1: %d %v", f, err)
	}
	if f, _ := FractionBits(1000, 4); float64(1000)*4*math.Ldexp(1, f) >= math.Ldexp(1, 31) || float64(1000)*4*math.Ldexp(1, f+1) < math.Ldexp(1, 31)-1 {
		t.Fatalf("F=%d is not the largest that fits", f)
	}
	if _, err := Encode([]float32{1.5}, 1, 20); !errors.Is(err, ErrRange) {
		t.Fatalf("a value past the bound: %v", err)
	}
	// The sum of n values at the bound decodes exactly (no wrap-around).
	n := 300
	f, _ = FractionBits(n, 2)
	var sum []uint32 = make([]uint32, 2)
	for range n {
		e, _ := Encode([]float32{-2, 2}, 2, f)
		sum[0] += e[0]
		sum[1] += e[1]
	}
	if d := Decode(sum, f); d[0] != float32(-2*n) || d[1] != float32(2*n) {
		t.Fatalf("sum at the bound: %v", d)
	}
}

// round runs a secure aggregation of inputs among clients 1..len(inputs)
// with threshold t; clients in dropAfterShare vanish after sending their
// shares (before their masked input).
func round(t *testing.T, inputs [][]float32, threshold int, dropAfterShare map[ID]bool, bound float64) ([]float32, map[ID][]uint32) {
	return roundK(t, inputs, threshold, 0, dropAfterShare, bound)
}

// roundK is round with a masking graph of degree k.
func roundK(t *testing.T, inputs [][]float32, threshold, k int, dropAfterShare map[ID]bool, bound float64) ([]float32, map[ID][]uint32) {
	t.Helper()
	n := len(inputs[0])
	f, err := FractionBits(len(inputs), bound)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(threshold, k, n)
	if err != nil {
		t.Fatal(err)
	}
	clients := map[ID]*Client{}
	for i := range inputs {
		id := ID(i + 1)
		c, err := NewClient(id, threshold, k, seedOf(string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		clients[id] = c
		if err := srv.Advertise(c.Advertise()); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := srv.CloseAdvertise()
	if err != nil {
		t.Fatal(err)
	}
	for id, c := range clients {
		cts, err := c.Share(keys)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Shares(id, cts); err != nil {
			t.Fatal(err)
		}
	}
	inbox, err := srv.CloseShares()
	if err != nil {
		t.Fatal(err)
	}
	masked := map[ID][]uint32{}
	for id, c := range clients {
		if dropAfterShare[id] {
			continue
		}
		x, err := Encode(inputs[id-1], bound, f)
		if err != nil {
			t.Fatal(err)
		}
		y, err := c.Mask(x, inbox[id])
		if err != nil {
			t.Fatal(err)
		}
		masked[id] = y
		if err := srv.Masked(id, y); err != nil {
			t.Fatal(err)
		}
	}
	survivors, err := srv.CloseMasked()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range survivors {
		r, err := clients[id].Unmask(survivors)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Unmask(r); err != nil {
			t.Fatal(err)
		}
		// A second reveal is refused: a client answers once.
		if _, err := clients[id].Unmask(survivors[:threshold]); !errors.Is(err, ErrPhase) {
			t.Fatalf("a second reveal: %v", err)
		}
	}
	sum, err := srv.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return Decode(sum, f), masked
}

// TestSumWithADropout: five clients, threshold 3; client 4 vanishes after
// sending its shares, mid-round. The server's sum equals the plain sum of
// the other four within fixed-point error.
func TestSumWithADropout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 1000
	var inputs [][]float32
	for range 5 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.Float64()*2 - 1)
		}
		inputs = append(inputs, x)
	}
	for _, drop := range []map[ID]bool{nil, {4: true}, {2: true, 5: true}} {
		got, _ := round(t, inputs, 3, drop, 1)
		f, _ := FractionBits(5, 1)
		tol := 5 * math.Ldexp(1, -f-1)
		for i := range got {
			var want float64
			for c, x := range inputs {
				if !drop[ID(c+1)] {
					want += float64(x[i])
				}
			}
			if math.Abs(float64(got[i])-want) > tol+1e-6 {
				t.Fatalf("dropouts %v, value %d: %v, want %v (tolerance %g)", drop, i, got[i], want, tol)
			}
		}
	}
}

func TestTooManyDropouts(t *testing.T) {
	srv, _ := NewServer(3, 0, 4)
	for i := range 2 {
		c, _ := NewClient(ID(i+1), 3, 0, seedOf("x"))
		_ = srv.Advertise(c.Advertise())
	}
	if _, err := srv.CloseAdvertise(); !errors.Is(err, ErrTooFew) {
		t.Fatalf("two clients, threshold 3: %v", err)
	}
}

// TestMaskedInputLooksUniform: a masked input on its own is
// indistinguishable from uniform noise: a chi-square test of its values'
// top bytes, for an input that is all zeros and one that is all the same
// large value, accepts uniformity (fixed seeds: the test is deterministic),
// while the unmasked encoding fails it.
func TestMaskedInputLooksUniform(t *testing.T) {
	const n = 1 << 16
	chi2 := func(v []uint32) float64 {
		var counts [256]float64
		for _, x := range v {
			counts[x>>24]++
		}
		exp := float64(len(v)) / 256
		var s float64
		for _, c := range counts {
			s += (c - exp) * (c - exp) / exp
		}
		return s
	}
	// 255 degrees of freedom: P(χ² > 330.5) = 0.001.
	const critical = 330.5
	for _, value := range []float32{0, 0.75} {
		inputs := make([][]float32, 3)
		for i := range inputs {
			inputs[i] = make([]float32, n)
			for j := range inputs[i] {
				inputs[i][j] = value
			}
		}
		_, masked := round(t, inputs, 2, nil, 1)
		for id, y := range masked {
			if c := chi2(y); c > critical {
				t.Errorf("input %v, client %d: χ² = %.1f > %.1f: the masked input is not uniform", value, id, c, critical)
			}
		}
		f, _ := FractionBits(3, 1)
		plain, _ := Encode(inputs[0], 1, f)
		if c := chi2(plain); c < critical {
			t.Errorf("the unmasked input passes as uniform (χ² = %.1f): the test cannot tell", c)
		}
	}
}

func TestTamperedShareIsRefused(t *testing.T) {
	a, _ := NewClient(1, 2, 0, seedOf("a"))
	b, _ := NewClient(2, 2, 0, seedOf("b"))
	keys := []Keys{a.Advertise(), b.Advertise()}
	cts, err := a.Share(keys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Share(keys); err != nil {
		t.Fatal(err)
	}
	cts[0].Box[3] ^= 1
	if _, err := b.Mask([]uint32{1}, cts); !errors.Is(err, ErrDecrypt) {
		t.Fatalf("a tampered share: %v", err)
	}
}

func FuzzDecodeSharePair(f *testing.F) {
	f.Add(encodeSharePair(&sharePair{From: 1, To: 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeSharePair(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeSharePair(p), b) {
			t.Fatal("round trip differs")
		}
	})
}

func FuzzDecodeMessages(f *testing.F) {
	f.Add(byte(0), EncodeAdvertisement(&Advertisement{Base: 1}))
	f.Add(byte(1), EncodeShares(1, 2, []Ciphertext{{From: 2, To: 1, Box: make([]byte, boxSize)}}))
	f.Add(byte(2), EncodeMasked(1, 2, []uint32{1, 2}))
	f.Add(byte(3), EncodeReveal(1, &Reveal{From: 1, B: map[ID][32]byte{1: {}, 2: {}}, S: map[ID][32]byte{3: {}}}))
	f.Fuzz(func(t *testing.T, kind byte, b []byte) {
		var again []byte
		switch kind % 4 {
		case 0:
			a, err := DecodeAdvertisement(b)
			if err != nil {
				return
			}
			again = EncodeAdvertisement(a)
		case 1:
			base, from, cts, err := DecodeShares(b)
			if err != nil {
				return
			}
			again = EncodeShares(base, from, cts)
		case 2:
			base, from, y, err := DecodeMasked(b)
			if err != nil {
				return
			}
			again = EncodeMasked(base, from, y)
		case 3:
			base, r, err := DecodeReveal(b)
			if err != nil {
				return
			}
			again = EncodeReveal(base, r)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip of kind %d differs", kind%4)
		}
	})
}

// TestSecAggPlusGraph: twelve clients on SecAgg+'s ring graph of degree 4
// (each masks with and shares to 4 others, threshold 3); two that are not
// neighbors drop after their shares. The sum is the plain sum of the other
// ten within fixed-point error, and each client sent 4 shares, not 11.
func TestSecAggPlusGraph(t *testing.T) {
	ids := []ID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if got := Neighbors(ids, 4, 1); len(got) != 4 || got[0] != 2 || got[3] != 12 {
		t.Fatalf("neighbors of 1: %v", got)
	}
	for _, u := range ids {
		for _, v := range Neighbors(ids, 4, u) {
			if !slices.Contains(Neighbors(ids, 4, v), u) {
				t.Fatalf("%d neighbors %d but not the reverse", u, v)
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	var inputs [][]float32
	for range ids {
		x := make([]float32, 64)
		for i := range x {
			x[i] = float32(r.Float64() - 0.5)
		}
		inputs = append(inputs, x)
	}
	drop := map[ID]bool{3: true, 8: true}
	got, _ := roundK(t, inputs, 3, 4, drop, 1)
	f, _ := FractionBits(len(ids), 1)
	for i := range got {
		var want float64
		for c, x := range inputs {
			if !drop[ID(c+1)] {
				want += float64(x[i])
			}
		}
		if math.Abs(float64(got[i])-want) > float64(len(ids))*math.Ldexp(1, -f-1)+1e-5 {
			t.Fatalf("value %d: %v, want %v", i, got[i], want)
		}
	}
	c, _ := NewClient(1, 3, 4, seedOf("a"))
	var keys []Keys
	for _, id := range ids {
		k := c.Advertise()
		if id != 1 {
			o, _ := NewClient(id, 3, 4, seedOf(string(rune('a'+int(id)))))
			k = o.Advertise()
		}
		keys = append(keys, k)
	}
	cts, err := c.Share(keys)
	if err != nil || len(cts) != 4 {
		t.Fatalf("%d shares, %v", len(cts), err)
	}
}
