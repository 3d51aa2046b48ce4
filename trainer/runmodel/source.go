package runmodel

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
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

// revisionLen is the hex digits of a model hash in a run's revision: they
// fill the account's 32-byte field, so a revision holds the first 16 bytes
// of the SHA-256 (128 bits: no one finds another model with the same ones).
const revisionLen = coordinator.RevisionLen

// Revision is what a run records as the revision of model: the first 16
// bytes of its hash (Model.Hash) as 32 lowercase hex digits.
func Revision(model Model) string {
	sum := model.Hash()
	return hex.EncodeToString(sum[:revisionLen/2])
}

// IsHash reports whether a run's revision is a model hash (exactly 32
// lowercase hex digits), which trainers check, rather than a free label
// (empty, "v1", a commit name), which they do not.
func IsHash(revision string) bool {
	if len(revision) != revisionLen {
		return false
	}
	for _, c := range revision {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ErrRevision means a loaded model is not the one the run records.
var ErrRevision = errors.New("runmodel: the model's hash is not the run's revision")

// RevisionError is a model whose hash differs from the run's revision. It
// matches ErrRevision.
type RevisionError struct {
	From      string // where the model came from
	Got, Want string // its revision, and the run's
}

func (e *RevisionError) Error() string {
	return fmt.Sprintf("the model from %s has hash %s, the run records %s", e.From, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrRevision) hold.
func (e *RevisionError) Is(target error) bool { return target == ErrRevision }

// CheckRevision applies the run's revision rule to a model loaded from the
// run's checkpoint URL from: a revision that is a hash (IsHash) must be the
// model's (a *RevisionError otherwise); any other revision is a label and
// is not checked.
func CheckRevision(model Model, from, revision string) error {
	if !IsHash(revision) {
		return nil
	}
	w, err := HostWeights(model)
	if err != nil {
		return err
	}
	return w.CheckRevision(context.Background(), from, revision)
}

// CheckRevision is CheckRevision for weights wherever they are held, read
// and hashed a piece at a time (a seed's drawn as they are read).
func (w Weights) CheckRevision(ctx context.Context, from, revision string) error {
	if !IsHash(revision) || !w.Drawn() {
		// Not a model hash, or a seeded transformers run, whose revision
		// is its config's hash (LoadTransformersConfig).
		return nil
	}
	got, err := w.Revision(ctx)
	if err != nil {
		return err
	}
	if got != revision {
		return &RevisionError{From: from, Got: got, Want: revision}
	}
	return nil
}
