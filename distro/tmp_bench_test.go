package distro

import (
	"math/rand/v2"
	"testing"
)

func BenchmarkFwd64(b *testing.B) {
	p := newDCT2(64, 64)
	x := randomTile(rand.New(rand.NewPCG(1, 1)), 4096)
	tmp := make([]float32, 4096)
	b.SetBytes(4096)
	for b.Loop() {
		p.forward(x, tmp)
	}
}
func BenchmarkInv64(b *testing.B) {
	p := newDCT2(64, 64)
	x := randomTile(rand.New(rand.NewPCG(1, 1)), 4096)
	tmp := make([]float32, 4096)
	b.SetBytes(4096)
	for b.Loop() {
		p.inverse(x, tmp)
	}
}
