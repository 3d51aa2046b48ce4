package localrun

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// Run is a local run's definition: what its admin creates (Create).
type Run struct {
	ID     string
	Name   string // the run's metadata name (empty: no metadata)
	Config coordinator.Config
	Model  coordinator.Model
}

// NewRun defines run id for trainers trainers that each train perTrainer
// sequences a round: every trainer needed to start, one fewer to go on,
// timeouts of seconds (rounds end as soon as every witness has reported;
// the training limit only passes when a trainer is gone or its result is
// refused), and a small GPT (about 30k parameters) trained with DisTrO.
// The edits, in order, change what their user's run differs in.
func NewRun(id string, trainers, perTrainer int, edits ...func(*coordinator.Config, *coordinator.Model)) Run {
	batch := uint16(trainers * perTrainer)
	r := Run{ID: id,
		Config: coordinator.Config{WarmupTime: 5, CooldownTime: 6, MaxRoundTrainTime: 7, RoundWitnessTime: 1, EpochTime: 8,
			WaitingForMembersExtraTime: 1, TotalSteps: 1000, GlobalBatchSizeStart: batch, GlobalBatchSizeEnd: batch,
			InitMinClients: uint16(trainers), MinClients: uint16(max(1, trainers-1))},
		Model: coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
			MaxSeqLen: 32, VocabSize: 256, DModel: 32, NLayers: 1, NHeads: 2,
			LR:        coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 4e-3},
			Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64, Quantize1Bit: true}},
	}
	for _, edit := range edits {
		edit(&r.Config, &r.Model)
	}
	return r
}

// Files are what a local run trains on: a token file on this machine and
// the seed its initial model is drawn from.
type Files struct {
	Tokens    string         // the token file's path (the trainers read it)
	TokenSize int            // its bytes per token
	Seed      uint64         // the run starts from seed:Seed, which every trainer draws itself
	Initial   runmodel.Model // that model, drawn here too (nil: not drawn, and the run names no revision)
}

// WriteFiles writes tokens to a token file in dir (tokenSize bytes each)
// and draws model's initial weights from seed as the trainers will: the
// run's revision is their hash, which each trainer checks.
func WriteFiles(ctx context.Context, dir string, model *coordinator.Model, tokens []uint32, tokenSize int, seed uint64) (Files, error) {
	f := Files{Tokens: filepath.Join(dir, "train.tokens"), TokenSize: tokenSize, Seed: seed}
	if err := data.WriteTokenFile(ctx, f.Tokens, tokens, tokenSize); err != nil {
		return f, err
	}
	cfg, err := modelspec.ModelConfig(model)
	if err != nil {
		return f, err
	}
	if cfg.Arch == coordinator.ArchTransformers {
		// Only an engine draws it (the trainers' torch workers, from
		// seed and the config its source names): Initial holds the
		// config, and the revision stays the config's hash. A run that
		// starts from a checkpoint directory keeps it: Initial holds its
		// weights.
		t, err := runmodel.LoadRunTransformers(model)
		if err == nil {
			t.Seed = seed
		}
		f.Initial = t
		return f, err
	}
	f.Initial, err = runmodel.New(cfg, seed, nil)
	return f, err
}

// UseFiles points the run's model at f: its checkpoint is seed:f.Seed (with
// the initial model's revision), as in a run file with url = "seed:N", and
// its data the local token file. A transformers run that starts from a
// checkpoint directory keeps it, with the model's hash as revision.
func (r *Run) UseFiles(f Files) error {
	m := &r.Model
	m.Checkpoint.Kind = coordinator.CheckpointHub
	url := modelspec.SeedURL(f.Seed)
	src, srcErr := modelspec.ParseSource(coordinator.FixedString(m.Checkpoint.Source.URL[:]))
	_, transformers := f.Initial.(*runmodel.Transformers)
	fromDir := transformers && srcErr == nil && src.Kind == modelspec.FromFile
	switch {
	case fromDir:
		url = src.URL
	case srcErr == nil && src.Config != "":
		url = modelspec.SeedConfigURL(f.Seed, src.Config)
	}
	if err := coordinator.SetFixedString(m.Checkpoint.Source.URL[:], url); err != nil {
		return fmt.Errorf("checkpoint url %s: %w", url, err)
	}
	if transformers && !fromDir {
		// A seeded transformers run's revision is its config's hash,
		// which the run already names: every trainer draws the weights
		// itself.
	} else if f.Initial != nil {
		_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], runmodel.Revision(f.Initial)) // 32 bytes: fits
	}
	m.DataKind, m.TokenSize = coordinator.DataLocal, uint8(f.TokenSize)
	if err := coordinator.SetFixedString(m.DataLocation[:], f.Tokens); err != nil {
		return fmt.Errorf("data location %s: %w", f.Tokens, err)
	}
	return nil
}

// Instructions are what admin sends to create the run: InitCoordinator,
// an Update with its config and model, and SetPaused to start it.
func (r Run) Instructions(admin coordinator.Pubkey) ([]coordinator.Instruction, error) {
	id, err := coordinator.ParseRunID(r.ID)
	if err != nil {
		return nil, err
	}
	cfg, model := r.Config, r.Model
	up := &coordinator.Update{Config: &cfg, Model: &model}
	if r.Name != "" {
		var meta coordinator.Metadata
		if err := coordinator.SetFixedString(meta.Name[:], r.Name); err != nil {
			return nil, fmt.Errorf("the run's name %q: %w", r.Name, err)
		}
		up.Metadata = &meta
	}
	return []coordinator.Instruction{&coordinator.InitCoordinator{MainAuthority: admin, RunID: id}, up, &coordinator.SetPaused{}}, nil
}

// Create creates the run on b and starts it, sending its Instructions as
// admin.
func Create(ctx context.Context, b chain.Backend, r Run, admin *chain.Keypair) error {
	ixs, err := r.Instructions(admin.Public())
	if err != nil {
		return err
	}
	for _, ix := range ixs {
		if _, err := b.Send(ctx, r.ID, admin, nil, ix); err != nil {
			return fmt.Errorf("%s: %w", ix.Name(), err)
		}
	}
	return nil
}
