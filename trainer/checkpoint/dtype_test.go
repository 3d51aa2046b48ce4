package checkpoint

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
)

// TestF16RoundTrip checks F32ToF16 against the widening decoder on every one
// of the 65536 binary16 values (each must survive float32 and back
// unchanged) and on random float32s, which must round to the nearest
// binary16 value (ties to even).
func TestF16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := f16ToF32(uint16(h))
		got := F32ToF16(f)
		if f != f { // NaN: any quiet NaN of the same sign will do
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 || got&0x8000 != uint16(h)&0x8000 {
				t.Fatalf("NaN %#04x -> %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, got)
		}
	}
	r := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 200000; i++ {
		v := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-28)))
		checkNearest(t, "F16", v, f16ToF32(F32ToF16(v)), func(h uint16) float32 { return f16ToF32(h) }, F32ToF16(v))
	}
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{65504, 0x7bff}, {65520, 0x7c00}, {65519, 0x7bff}, {-1e9, 0xfc00}, {5.960464477539063e-08, 0x0001},
		{2.98e-08, 0x0000}, {2.99e-08, 0x0001}, {1, 0x3c00}, {float32(math.Inf(-1)), 0xfc00},
	} {
		if got := F32ToF16(tc.in); got != tc.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

func TestBF16Rounding(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for i := 0; i < 200000; i++ {
		v := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(200)-100)))
		h := F32ToBF16(v)
		checkNearest(t, "BF16", v, math.Float32frombits(uint32(h)<<16), func(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }, h)
	}
	for _, tc := range []struct {
		in   uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, {0x3f808001, 0x3f81}, {0x7f7fffff, 0x7f80}, {0x7fc00001, 0x7fc0}, {0x7f800001, 0x7fc0},
	} {
		if got := F32ToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

// checkNearest fails unless got (the rounding of v, bits h) is at least as
// close to v as its neighbours h±1, and on a tie has an even last bit.
func checkNearest(t *testing.T, name string, v, got float32, widen func(uint16) float32, h uint16) {
	t.Helper()
	d := math.Abs(float64(got) - float64(v))
	for _, n := range []uint16{h - 1, h + 1} {
		if n&0x7fff >= 0x7c00 && name == "F16" || n&0x7f80 == 0x7f80 && name == "BF16" {
			continue
		}
		w := widen(n)
		if dn := math.Abs(float64(w) - float64(v)); dn < d || (dn == d && h&1 == 1) {
			t.Fatalf("%s(%g) = %g (%#04x), but %g (%#04x) is nearer", name, v, got, h, w, n)
		}
	}
}

// TestSaveDTypes writes one tensor in each dtype and reads back what the
// rounding gives.
func TestSaveDTypes(t *testing.T) {
	data := []float32{1, -2.5, 3.14159, 1e-3, 70000}
	for _, dt := range []string{"", "F32", "F16", "BF16"} {
		b, err := Encode([]Tensor{{Name: "w", Shape: []int{5}, Data: data, DType: dt}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := c.Tensor("w", []int{5})
		want := dt
		if want == "" {
			want = "F32"
		}
		if c.DType("w") != want {
			t.Errorf("%q: stored as %s", dt, c.DType("w"))
		}
		for i, v := range data {
			var w float32
			switch want {
			case "F32":
				w = v
			case "F16":
				w = f16ToF32(F32ToF16(v))
			case "BF16":
				w = math.Float32frombits(uint32(F32ToBF16(v)) << 16)
			}
			if got[i] != w {
				t.Errorf("%s[%d] = %g, want %g", want, i, got[i], w)
			}
		}
	}
	if err := Save(context.Background(), t.TempDir()+"/x", []Tensor{{Name: "w", Shape: []int{1}, Data: []float32{1}, DType: "F64"}}, nil); err == nil {
		t.Error("saved an F64 tensor")
	}
}
