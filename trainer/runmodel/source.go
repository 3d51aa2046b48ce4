package runmodel

import (
	"context"
	"encoding/hex"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

// Init builds the run's model with the initial weights drawn from seed
// (the architecture's initialiser, which depends on the config and the seed
// only).
func Init(m *coordinator.Model, seed uint64, be kernels.Backend) (Model, error) {
	cfg, err := modelspec.ModelConfig(m)
	if err != nil {
		return nil, err
	}
	return New(cfg, seed, be)
}

// Revision is what a run records as the revision of model: the first 16
// bytes of its hash (Model.Hash) as 32 lowercase hex digits.
func Revision(model Model) string {
	sum := model.Hash()
	return hex.EncodeToString(sum[:coordinator.RevisionLen/2])
}

// CheckRevision applies the run's revision rule to a model loaded from the
// run's checkpoint URL from: a revision that is a hash (weights.IsHash) must be
// the model's (a *weights.RevisionError otherwise); any other revision is a label and
// is not checked.
func CheckRevision(model Model, from, revision string) error {
	if !weights.IsHash(revision) {
		return nil
	}
	w, err := HostWeights(model)
	if err != nil {
		return err
	}
	return w.CheckRevision(context.Background(), from, revision)
}
