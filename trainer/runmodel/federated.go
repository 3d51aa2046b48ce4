package runmodel

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
)

// FederatedDistro is the DisTrO configuration a federated run's clients
// and server share for its model (see federated/fedserver): the run's compression settings, with no weight decay or
// clipping (a federated update is not a gradient step).
func FederatedDistro(m *coordinator.Model) (*distro.DeMo, []int, error) {
	o, err := Distro(m, 1)
	if err != nil {
		return nil, nil, err
	}
	o.WeightDecay, o.ClipGradNorm = 0, 0
	cfg, err := GPT(m)
	if err != nil {
		return nil, nil, err
	}
	var shapes [][]int
	var sizes []int
	for _, s := range cfg.Specs() {
		shapes = append(shapes, s.Shape)
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		sizes = append(sizes, n)
	}
	d, err := distro.NewDeMo(shapes, o)
	if err != nil {
		return nil, nil, err
	}
	return d, sizes, nil
}
