package federated

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Distro is the DisTrO configuration a federated run's clients and server
// share for its model, with the size of each of its tensors: the run's
// compression settings, with no weight decay or clipping (a federated
// update is not a gradient step). Both sides build it from the run's
// account alone, so an update's DisTrO frame (wire_update.go) decodes the
// same on each.
func Distro(m *coordinator.Model) (*distro.DeMo, []int, error) {
	o, err := modelspec.Distro(m, 1)
	if err != nil {
		return nil, nil, err
	}
	o.WeightDecay, o.ClipGradNorm = 0, 0
	cfg, err := modelspec.GPT(m)
	if err != nil {
		return nil, nil, err
	}
	var shapes [][]int
	var sizes []int
	for _, s := range cfg.Specs() {
		shapes = append(shapes, s.Shape)
		sizes = append(sizes, modelspec.Size(s.Shape))
	}
	d, err := distro.NewDeMo(shapes, o)
	if err != nil {
		return nil, nil, err
	}
	return d, sizes, nil
}
