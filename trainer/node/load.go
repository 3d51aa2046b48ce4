package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// load makes the model, optimizer and data of w's epoch ready, the model
// from the source the machine chose (machine/load.go). A source that did
// not give the model answers a *drive.NotLoaded that says why; the
// machine decides what next.
func (n *Node) load(ctx context.Context, w *machine.LoadWork) error {
	began := time.Now()
	n.dropAhead()
	s := w.State
	m := &s.Model
	// The data first: a server that does not answer yet (429 under load)
	// makes the load wait for the next try, and no model is loaded for
	// nothing meanwhile.
	loc := coordinator.FixedString(m.DataLocation[:])
	if n.data == nil || n.dataLoc != loc {
		p, err := data.Open(ctx, loc, int(m.TokenSize), int(m.MaxSeqLen), n.dataOptions(m)...)
		if err != nil {
			n.logNoData(ctx, err, "the model waits for it", "data", data.Describe(loc))
			return n.notLoaded(machine.LoadNotYet, fmt.Errorf("the run's data cannot be opened yet: %w", err))
		}
		n.cfg.log.Info("training data opened", "data", data.Describe(loc), "source", p.Source(),
			"tokens", p.NumTokens(), "sequences", p.NumSequences())
		n.data, n.dataLoc = p, loc
	}
	cfg, err := modelspec.ModelConfig(m)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	opts, err := modelspec.Distro(m, n.cfg.workers)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.checkStore(ctx, m.Store)
	source := w.Source
	if source == machine.LoadKeep {
		held := n.engine()
		if held == nil || held.Config() != cfg {
			return n.notLoaded(machine.LoadNotYet, errors.New("the model this node held is gone"))
		}
		// A kept model follows the run's options: its rule may have
		// changed while the run was paused, and every trainer must
		// combine a round the same way.
		if p := n.runPlan(); p.Options() != opts {
			if p, err = distro.NewPlan(p.Shapes(), opts); err != nil {
				return fmt.Errorf("node: %w", err)
			}
			n.setEngine(held, p)
		}
		return nil
	}
	var (
		model weights.Weights
		from  string
	)
	switch source {
	case machine.LoadPeers:
		model, from, err = n.loadPeers(ctx, s, cfg)
	case machine.LoadRecorded:
		model, from, err = n.loadRecorded(ctx, s, cfg)
	case machine.LoadOffer:
		model, from, err = n.loadOffered(ctx, s, cfg)
	default:
		return fmt.Errorf("node: no load from %s", source)
	}
	if err != nil {
		return err
	}
	// The host model is the engine's from here on (the Go engine keeps it;
	// another copies it to where it computes and drops it).
	n.setEngine(nil, nil)
	op := n.cfg.engine
	if op == nil {
		op = goengine.New(n.cfg.kernels)
	}
	eng, err := op.Open(ctx, engine.Spec{Weights: model, Optimizer: opts, Timeout: engineTimeout(s)})
	// The engine holds the model now (or failed to): the files it was
	// read from are done with.
	if cerr := model.Close(); cerr != nil {
		n.cfg.log.Warn("closing the loaded checkpoint", "err", cerr)
	}
	if err != nil {
		return fmt.Errorf("node: opening the %s engine on the model: %w", op.Name(), err)
	}
	// An engine that computes elsewhere (a PyTorch worker) copied a host
	// model it was opened on and let it go: give its pages back to the
	// system now. The collector would otherwise wait until the heap
	// doubled again, and a model of gigabytes would stay in this process's
	// memory beside the worker's copy (a Go engine keeps the model, and
	// this costs one collection).
	model = weights.Weights{}
	debug.FreeOSMemory()
	// The run's plan is cut from the engine's tensors (a transformers
	// model's shapes are the engine's to say).
	plan, err := distro.NewPlan(eng.Shapes(), opts)
	if err != nil {
		eng.Close()
		return fmt.Errorf("node: %w", err)
	}
	n.setEngine(eng, plan)
	// No honest result of this model is larger: bigger announcements are
	// refused before anything is fetched.
	n.net.SetMaxPayload(plan.MaxFrameBytes())
	n.cfg.log.Info("model loaded", "from", from, "params", cfg.NumParams(), "engine", eng.Name(),
		"took", time.Since(began).Round(time.Millisecond))
	return nil
}

// notLoaded is the error of a load whose source did not give the model.
func (n *Node) notLoaded(why machine.LoadFailure, err error) error {
	return &drive.NotLoaded{Why: why, At: uint64(n.cfg.clock.Now().Unix()), Err: err}
}

// loadPeers loads the model the previous epoch's clients hold.
func (n *Node) loadPeers(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (weights.Weights, string, error) {
	w, err := n.loadFromPeers(ctx, s, cfg)
	if err != nil {
		return weights.Weights{}, "", n.peersFailed(err)
	}
	const from = "the previous epoch's clients"
	return w, from, checkShape(w.Config, &s.Model, from)
}

// peersFailed is what a failed load from peers tells the machine.
func (n *Node) peersFailed(err error) error {
	switch {
	case errors.Is(err, p2p.ErrNoHolder) || errors.Is(err, errNoOtherHolder):
		return n.notLoaded(machine.LoadNoHolder, err)
	case errors.Is(err, errLoadLater):
		return n.notLoaded(machine.LoadNotYet, err)
	}
	return err
}

// loadRecorded loads the run's recorded checkpoint from its own source,
// checks it is the recorded model, and offers a file or store checkpoint
// to the epoch's other trainers.
func (n *Node) loadRecorded(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (weights.Weights, string, error) {
	m := &s.Model
	url := coordinator.FixedString(m.Checkpoint.Source.URL[:])
	rev := coordinator.FixedString(m.Checkpoint.Source.Revision[:])
	if m.Checkpoint.Kind == coordinator.CheckpointP2P {
		// The full-restart rule: nobody who held the previous epoch's
		// model serves it (they all restarted), so every joiner loads
		// the run's last recorded checkpoint.
		n.cfg.log.Warn("no client of the previous epoch offers its model; loading the run's last recorded checkpoint", "url", url)
	}
	unreadable := func(err error) error {
		// On separate machines a file:// checkpoint is on the disk of the
		// trainer that wrote it: that trainer loads it and offers it, so
		// this one waits for the offer rather than leaving the run.
		n.cfg.log.Warn("cannot read the run's recorded checkpoint on this machine; waiting for a trainer that holds it to offer it",
			"url", url, "why", err)
		return n.notLoaded(machine.LoadUnreadableHere, err)
	}
	var none weights.Weights
	if fileMissingHere(url) {
		return none, "", unreadable(fmt.Errorf("%s is not readable here", url))
	}
	var (
		model weights.Weights
		err   error
	)
	if cfg.Arch == coordinator.ArchTransformers {
		// Built by the engine from the config.json the source names.
		model, err = hostWeights(runmodel.LoadRunTransformers(m))
	} else {
		model, err = n.loadURL(ctx, url, cfg, m.Store)
	}
	switch {
	case err != nil && ((unreadableHere(err) && isFileURL(url)) || isStoreURL(url)):
		return none, "", unreadable(err)
	case err != nil:
		// Anything else (an http(s) URL that answers "not found" answers
		// every trainer so) is no matter of this disk.
		return none, "", fmt.Errorf("node: loading the model from %s: %w", url, err)
	}
	loaded := false
	defer func() {
		if !loaded {
			model.Close()
		}
	}()
	if err := checkShape(model.Config, m, url); err != nil {
		return none, "", err
	}
	// A revision that is a model hash names the model the run starts
	// from: training another (a file replaced on one machine, a seed drawn
	// differently by another build) would only produce results no other
	// trainer can use, and no later try loads a different model, so the
	// node stops. Peers' models are not checked: they are the previous
	// epoch's, trained past the recorded one.
	if err := model.CheckRevision(ctx, url, rev); err != nil {
		if isStoreURL(url) {
			// The bucket holds another model than the run recorded
			// (replaced or damaged there): a trainer that saved or fetched
			// the recorded one may offer it.
			n.cfg.log.Warn("refusing the run's checkpoint from its store; waiting for a trainer that holds the recorded model to offer it",
				"url", url, "err", err)
			return none, "", n.notLoaded(machine.LoadUnreadableHere, err)
		}
		return none, "", fmt.Errorf("node: %w: refusing to train", err)
	}
	// Offer a file or store checkpoint to the epoch's other trainers:
	// after a full restart on separate machines, this may be the only one
	// that can read the recorded URL (its own file, or a bucket only its
	// credentials open).
	if isFileURL(url) || isStoreURL(url) {
		if _, err := n.offerWeights(ctx, recordedOffer(s.Progress.Epoch), model); err != nil {
			n.cfg.log.Warn("offering the loaded checkpoint to the other trainers failed", "err", err)
		}
	}
	loaded = true
	return model, url, nil
}

// hostWeights are the weights of a model a loader returned, or its error.
func hostWeights(m runmodel.Model, err error) (weights.Weights, error) {
	if err != nil {
		return weights.Weights{}, err
	}
	return runmodel.HostWeights(m)
}

// loadOffered loads the run's recorded checkpoint as a trainer that could
// read it offers it.
func (n *Node) loadOffered(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (weights.Weights, string, error) {
	m := &s.Model
	url := coordinator.FixedString(m.Checkpoint.Source.URL[:])
	rev := coordinator.FixedString(m.Checkpoint.Source.Revision[:])
	var none weights.Weights
	model, err := n.loadRecordedOffer(ctx, s, cfg, url, rev)
	if err != nil {
		return none, "", n.notLoaded(machine.LoadNotYet,
			fmt.Errorf("the recorded checkpoint %s cannot be read here, and no trainer offers it yet (%w)", url, err))
	}
	from := "a trainer holding " + url
	if err := checkShape(model.Config, m, from); err != nil {
		return none, "", err
	}
	// What it offers was checked against a revision that is a hash
	// (loadRecordedOffer): another trainer's word, not this machine's
	// file, so a later offer may be the right one.
	return model, from, nil
}

// checkShape checks that a loaded model (its config) is the run's shape.
func checkShape(loaded modelspec.Config, m *coordinator.Model, from string) error {
	if err := modelspec.Check(loaded, m); err != nil {
		return fmt.Errorf("node: the checkpoint from %s: %w", from, err)
	}
	return nil
}

// unreadableHere says whether a checkpoint URL failed because this machine
// cannot read it (a file:// path that is not on this disk, or not readable
// by this user), which another trainer's offer can make up for.
func unreadableHere(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}

// recordedOffer is the number under which a trainer offers the run's
// recorded checkpoint, as it loaded it from the URL, to the trainers of
// epoch that cannot read the URL: apart from the epoch's own number, under
// which the previous epoch's clients offer the model they trained. A
// joiner asking those for the newest model so never takes the recorded one
// for it (nor sees the two as a split), and one that asks for the recorded
// checkpoint checks what it gets against the recorded hash.
func recordedOffer(epoch uint32) uint32 { return epoch | 1<<31 }

// loadRecordedOffer fetches the run's recorded checkpoint from a trainer
// that offers it, when this machine cannot read its URL. With a revision
// that is the model's hash, one trainer's offer is enough: each offer is
// taken from its trainer alone and checked against the hash, and the first
// that matches wins (after a full restart on separate machines only the
// trainer that wrote the file can offer it, so waiting for a majority would
// wait for ever). Without such a revision, nothing proves an offer is the
// checkpoint, and a majority of the holders must agree (loadFromPeers).
func (n *Node) loadRecordedOffer(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config, url, rev string) (weights.Weights, error) {
	if !weights.IsHash(rev) {
		return n.loadFromPeers(ctx, s, cfg)
	}
	var errs []error
	for _, c := range s.CheckpointHolders() {
		if c.P2P == n.net.ID() {
			continue
		}
		holder := []coordinator.Pubkey{c.P2P}
		pctx, cancel := context.WithTimeout(ctx, peerLoadTimeout)
		id, err := n.net.FindCheckpoint(pctx, recordedOffer(s.Progress.Epoch), holder)
		var (
			w weights.Weights
			f *p2p.CheckpointFile
		)
		if err == nil {
			w, f, err = n.fetchWeights(pctx, s, cfg, id, holder)
		}
		if err == nil {
			// Hashing reads every value: one that is not finite fails too.
			if err = w.CheckRevision(pctx, url, rev); err != nil {
				f.Close()
			}
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("the offer of %s: %w", c.Signer, err))
			continue
		}
		// Offer it on in turn, as a trainer that read the URL does.
		if _, err := n.net.ShareCheckpoint(ctx, recordedOffer(s.Progress.Epoch), f); err != nil {
			n.cfg.log.Warn("offering the loaded checkpoint to the other trainers failed", "err", err)
		}
		return w, nil
	}
	if len(errs) == 0 {
		return weights.Weights{}, errNoOtherHolder
	}
	return weights.Weights{}, errors.Join(errs...)
}

// isFileURL says whether url names a file on the trainer's own disk.
func isFileURL(url string) bool {
	src, err := modelspec.ParseSource(url)
	return err == nil && src.Kind == modelspec.FromFile
}

// isStoreURL says whether url is an s3:// checkpoint: read with this
// trainer's own credentials, so what fails here may work for another
// trainer, which can then offer it.
func isStoreURL(url string) bool {
	src, err := modelspec.ParseSource(url)
	return err == nil && src.Kind == modelspec.FromS3
}

// fileMissingHere says whether url is a file:// checkpoint that this
// machine cannot read (not on its disk, or not readable by this user).
func fileMissingHere(url string) bool {
	src, err := modelspec.ParseSource(url)
	if err != nil || src.Kind != modelspec.FromFile {
		return false
	}
	f, err := os.Open(src.Path)
	if err != nil {
		return unreadableHere(err)
	}
	f.Close()
	return false
}
