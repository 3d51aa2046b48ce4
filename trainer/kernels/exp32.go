package kernels

import "math"

// exp32 is eˣ in float32 arithmetic, within 2 ulp of the exact value over
// the whole float32 range (0 below −103.3 where the exact value is not
// even subnormal, +Inf past 88.72, NaN for NaN). It is what the softmaxes
// use on WebAssembly, where math.Exp's float64 reduction and scaling
// (expmulti, Ldexp) took a fifth of a training step under V8; natively
// math.Exp is assembly and stays (softmaxExp).
//
// The method is the usual one: eˣ = 2ⁿ·eʳ with n = round(x/ln 2) and
// |r| ≤ ln 2/2, ln 2 split in a short high part (exact in the product n·hi)
// and a low remainder, eʳ by a degree-6 polynomial fitted for float32 on
// that interval (the coefficients of Cephes' expf), and 2ⁿ built from its
// exponent bits in two factors so that results near the float32 limits
// neither overflow nor flush early.
func exp32(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 88.72284:
		return float32(math.Inf(1))
	case x < -103.97208:
		return 0
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	fn := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - fn*ln2hi - fn*ln2lo
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	n := int32(fn)
	// 2ⁿ as 2^(n/2)·2^(n−n/2): each half is a normal float32 for every n
	// this range gives (−150 … 128).
	h := n / 2
	return y * math.Float32frombits(uint32(h+127)<<23) * math.Float32frombits(uint32(n-h+127)<<23)
}
