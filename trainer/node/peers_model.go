package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/f32le"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// errLoadLater marks a load that may work on a later try (the peers holding
// the model were not reachable yet).
var errLoadLater = errors.New("node: model not available yet")

// errNoOtherHolder marks a P2P checkpoint no other client can serve: the
// only holder is this node, which has no model (it restarted).
var errNoOtherHolder = errors.New("node: no other client of this epoch held the previous one's model")

// How long one attempt to load the model from peers may take before the
// machine's next tick tries again.
const peerLoadTimeout = 60 * time.Second

// P2P checkpoints carry float32 tensors as little-endian bytes, named and
// shaped as in the safetensors checkpoints.
const tensorDType = "F32"

// shareModel offers the model to the joiners of epoch (a P2P checkpoint).
func (n *Node) shareModel(ctx context.Context, epoch uint32) {
	e := n.engine()
	if e == nil {
		return
	}
	w, err := n.weights(e)
	if err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed: the engine cannot give its weights", "engine", e.Name(), "err", err)
		return
	}
	id, err := n.offerWeights(ctx, epoch, w)
	if err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed", "engine", e.Name(), "err", err)
		return
	}
	n.cfg.log.Info("model shared with joiners", "epoch", epoch, "manifest", fmt.Sprintf("%x", id[:8]))
}

// offerModel offers a loaded host model as the P2P checkpoint of epoch.
func (n *Node) offerModel(ctx context.Context, epoch uint32, m runmodel.Model) error {
	w, err := runmodel.HostWeights(m)
	if err != nil {
		return err
	}
	_, err = n.offerWeights(ctx, epoch, w)
	return err
}

// offerWeights offers w as the P2P checkpoint of epoch: a snapshot written
// to a file a chunk at a time, its blocks digested as they are written
// (writeOffer), which the network serves from, so that the node holds no
// copy of the model however large it is while the engine trains on.
func (n *Node) offerWeights(ctx context.Context, epoch uint32, w weights.Weights) (coordinator.Hash, error) {
	f, err := writeOffer(ctx, w, n.cfg.corruptShare)
	if err != nil {
		return coordinator.Hash{}, err
	}
	return n.net.ShareCheckpoint(ctx, epoch, f)
}

// loadFromPeers fetches the model the epoch starts from from the clients
// that held it at the end of the previous one: the manifest id most of them
// offer, then every tensor, checked against the run's model shape, into a
// file the engine then reads and the network serves from in turn.
func (n *Node) loadFromPeers(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (weights.Weights, error) {
	var none weights.Weights
	var from []coordinator.Pubkey
	for _, c := range s.CheckpointHolders() {
		if c.P2P != n.net.ID() {
			from = append(from, c.P2P)
		}
	}
	if len(from) == 0 {
		return none, fmt.Errorf("%w: %w", errLoadLater, errNoOtherHolder)
	}
	ctx, cancel := context.WithTimeout(ctx, peerLoadTimeout)
	defer cancel()
	id, err := n.net.FindCheckpoint(ctx, s.Progress.Epoch, from)
	if err != nil {
		return none, fmt.Errorf("%w: %w", errLoadLater, err)
	}
	w, f, err := n.fetchWeights(ctx, s, cfg, id, from)
	if err != nil {
		return none, err
	}
	if err := checkValues(ctx, w); err != nil {
		f.Close()
		// The bytes are what the manifest named, so the peers that offered
		// it serve a broken model: a later try may find others.
		return none, fmt.Errorf("%w: checkpoint %x from peers: %w", errLoadLater, id[:8], err)
	}
	// This node now holds the epoch's starting model: serve it too, from
	// the file the weights are read from (the network keeps it open until
	// it serves the next one).
	if _, err := n.net.ShareCheckpoint(ctx, s.Progress.Epoch, f); err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed", "err", err)
	}
	return w, nil
}

// fetchWeights fetches checkpoint id from peers into a P2P checkpoint file
// of the run's shape and returns the weights read from it and the file,
// which the caller shares or closes. Errors are errLoadLater: other peers,
// or the same later, may serve it.
func (n *Node) fetchWeights(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config, id coordinator.Hash, from []coordinator.Pubkey) (weights.Weights, *p2p.CheckpointFile, error) {
	var none weights.Weights
	shape, err := n.runShape(ctx, s, cfg)
	if err != nil {
		return none, nil, err
	}
	specs, err := checkpointSpecs(shape)
	if err != nil {
		return none, nil, err
	}
	f, err := p2p.NewCheckpointFile(specs)
	if err != nil {
		return none, nil, err
	}
	start := time.Now()
	if err := n.net.FetchCheckpoint(ctx, id, from, f); err != nil {
		f.Close()
		return none, nil, fmt.Errorf("%w: %w", errLoadLater, err)
	}
	took := time.Since(start)
	n.cfg.log.Info("checkpoint fetched from peers", "manifest", fmt.Sprintf("%x", id[:8]), "bytes", f.Size(),
		"took", took.Round(time.Millisecond), "mib_per_s", math.Round(float64(f.Size())/(1<<20)/max(took.Seconds(), 1e-6)))
	w, err := shape.InFile(f)
	if err != nil {
		f.Close()
		return none, nil, err
	}
	return w, f, nil
}

// checkValues reads every value of w once, a chunk at a time: weights read
// from a file refuse values that are not finite, and a model holding one
// is refused before it is served or trained.
func checkValues(ctx context.Context, w weights.Weights) error {
	buf := make([]float32, offerChunk)
	for i, sh := range w.Shapes {
		size := modelspec.Size(sh)
		for off := 0; off < size; off += len(buf) {
			if err := w.Read(ctx, i, off, buf[:min(len(buf), size-off)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// runShape are weights of the run's model with no values yet: its tensors'
// names and shapes, for a P2P checkpoint to fill. A transformers model's
// tensors are named and shaped by transformers: the engine describes them
// (engine.Describer).
func (n *Node) runShape(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (weights.Weights, error) {
	if cfg.Arch != coordinator.ArchTransformers {
		return runmodel.Shape(cfg)
	}
	tf, _, err := runmodel.RunTransformersConfig(&s.Model)
	if err != nil {
		return weights.Weights{}, err
	}
	d, ok := n.cfg.engine.(engine.Describer)
	if !ok {
		return weights.Weights{}, fmt.Errorf("node: %w", goengine.ErrNeedsTorch)
	}
	w, err := runmodel.HostWeights(tf)
	if err != nil {
		return weights.Weights{}, err
	}
	return d.Describe(ctx, w)
}

// checkpointSpecs are the tensors of w's P2P checkpoint: its checkpoint
// pieces in order (weights.Weights.InFile reads them back), each as
// little-endian float32.
func checkpointSpecs(w weights.Weights) ([]p2p.TensorSpec, error) {
	pieces, err := w.Pieces(false)
	if err != nil {
		return nil, err
	}
	out := make([]p2p.TensorSpec, len(pieces))
	for i, p := range pieces {
		shape := make([]uint64, len(p.Shape))
		for k, d := range p.Shape {
			shape[k] = uint64(d)
		}
		out[i] = p2p.TensorSpec{Name: p.Name, DType: tensorDType, Shape: shape}
	}
	return out, nil
}

// offerChunk is how many values writeOffer reads from the engine at a time.
const offerChunk = 1 << 16

// writeOffer writes w's P2P checkpoint (checkpointSpecs) into a checkpoint
// file, a chunk at a time, which digests each block as it is written.
// corrupt, when set, is fault injection: it spoils each chunk's bytes
// before they are written.
func writeOffer(ctx context.Context, w weights.Weights, corrupt func([]byte)) (*p2p.CheckpointFile, error) {
	specs, err := checkpointSpecs(w)
	if err != nil {
		return nil, err
	}
	ts, err := w.Tensors(false)
	if err != nil {
		return nil, err
	}
	f, err := p2p.NewCheckpointFile(specs)
	if err != nil {
		return nil, fmt.Errorf("node: the model offered to joiners: %w", err)
	}
	var buf []byte
	for _, t := range ts {
		err := t.Chunks(ctx, offerChunk, func(values []float32) error {
			buf = f32le.Append(buf[:0], values)
			if corrupt != nil {
				corrupt(buf)
			}
			return f.Append(buf)
		})
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("node: writing the model offered to joiners: %w", err)
		}
	}
	if !f.Complete() {
		f.Close()
		return nil, errors.New("node: the model offered to joiners is shorter than its tensors")
	}
	return f, nil
}
