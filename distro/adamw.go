package distro

import (
	"fmt"
	"math"
)

// AdamW is plain AdamW with decoupled weight decay (Loshchilov & Hutter), the
// single-node baseline that DisTrO is compared with.
type AdamW struct {
	Beta1, Beta2, Epsilon, WeightDecay float32
	ClipGradNorm                       float32 // 0: off
	m, v                               [][]float32
	t                                  int
}

// NewAdamW returns a zero AdamW state for tensors of the given sizes.
func NewAdamW(sizes []int, beta1, beta2, eps, weightDecay float32) *AdamW {
	a := &AdamW{Beta1: beta1, Beta2: beta2, Epsilon: eps, WeightDecay: weightDecay}
	for _, n := range sizes {
		a.m = append(a.m, make([]float32, n))
		a.v = append(a.v, make([]float32, n))
	}
	return a
}

// Steps is the number of steps taken.
func (a *AdamW) Steps() int { return a.t }

// Step updates params with grads at learning rate lr.
func (a *AdamW) Step(params, grads [][]float32, lr float32) error {
	if len(params) != len(a.m) || len(grads) != len(a.m) {
		return fmt.Errorf("distro: adamw has %d tensors, got %d params and %d grads", len(a.m), len(params), len(grads))
	}
	for i := range params {
		if len(params[i]) != len(a.m[i]) || len(grads[i]) != len(a.m[i]) {
			return fmt.Errorf("distro: adamw tensor %d: sizes %d/%d, want %d", i, len(params[i]), len(grads[i]), len(a.m[i]))
		}
		if !allFinite(grads[i]) {
			return ErrNonFinite
		}
	}
	scale := float32(1)
	if a.ClipGradNorm > 0 {
		if norm := GradNorm(grads); norm > float64(a.ClipGradNorm) {
			scale = float32(float64(a.ClipGradNorm) / norm)
		}
	}
	a.t++
	bc1 := float32(1 - math.Pow(float64(a.Beta1), float64(a.t)))
	bc2 := float32(math.Sqrt(1 - math.Pow(float64(a.Beta2), float64(a.t))))
	step := lr / bc1
	keep := 1 - lr*a.WeightDecay
	for i, p := range params {
		g, m, v := grads[i][:len(p)], a.m[i][:len(p)], a.v[i][:len(p)]
		for j := range p {
			gj := g[j] * scale
			m[j] = a.Beta1*m[j] + (1-a.Beta1)*gj
			v[j] = a.Beta2*v[j] + (1-a.Beta2)*gj*gj
			denom := float32(math.Sqrt(float64(v[j])))/bc2 + a.Epsilon
			p[j] = p[j]*keep - step*m[j]/denom
		}
	}
	return nil
}
