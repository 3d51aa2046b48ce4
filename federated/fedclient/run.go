package fedclient

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// ForRun builds what a client of a run whose model is m trains with: a
// trainer of m's shape on text (named name in messages), batch sequences a
// step, at the run's learning rate (1e-3 where it names none) and gradient
// clipping, its batches picked by a seed from the client's key (two
// clients on the same text draw different batches), and the options a
// DisTrO run's compressed updates need.
func ForRun(m *coordinator.Model, name string, text []byte, batch int, key coordinator.Pubkey) (*Trainer, Options, error) {
	gcfg, err := modelspec.GPT(m)
	if err != nil {
		return nil, Options{}, err
	}
	d, err := NewLocalData(name, text, gcfg.Context)
	if err != nil {
		return nil, Options{}, err
	}
	lr := m.LR.BaseLR
	if lr == 0 {
		lr = 1e-3
	}
	seed := uint64(0)
	for _, x := range key {
		seed = seed*131 + uint64(x)
	}
	t, err := NewTrainer(gcfg, d, batch, gcfg.Context, lr, m.Optimizer.ClipGradNorm, seed)
	if err != nil {
		return nil, Options{}, err
	}
	var o Options
	if m.Optimizer.Kind == coordinator.OptimizerDistro {
		if o.Distro, _, err = federated.Distro(m); err != nil {
			return nil, Options{}, err
		}
	}
	return t, o, nil
}
