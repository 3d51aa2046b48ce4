package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/f32le"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
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
// to a file (offerFile), which the network serves from, so that the node
// holds no copy of the model however large it is while the engine trains
// on.
func (n *Node) offerWeights(ctx context.Context, epoch uint32, w runmodel.Weights) (coordinator.Hash, error) {
	src, err := writeOffer(ctx, w, n.cfg.corruptShare)
	if err != nil {
		return coordinator.Hash{}, err
	}
	return n.net.ShareCheckpoint(ctx, epoch, src)
}

// loadFromPeers fetches the model the epoch starts from from the clients
// that held it at the end of the previous one: the manifest id most of them
// offer, then every tensor, checked against the run's model shape.
func (n *Node) loadFromPeers(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (runmodel.Model, error) {
	var from []coordinator.Pubkey
	for _, c := range s.CheckpointHolders() {
		if c.P2P != n.net.ID() {
			from = append(from, c.P2P)
		}
	}
	if len(from) == 0 {
		return nil, fmt.Errorf("%w: %w", errLoadLater, errNoOtherHolder)
	}
	ctx, cancel := context.WithTimeout(ctx, peerLoadTimeout)
	defer cancel()
	id, err := n.net.FindCheckpoint(ctx, s.Progress.Epoch, from)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLoadLater, err)
	}
	model, err := n.emptyModel(ctx, s, cfg)
	if err != nil {
		return nil, err
	}
	tensors, err := n.net.FetchCheckpoint(ctx, id, from, tensorSpecs(model))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLoadLater, err)
	}
	if err := loadTensors(model, tensors); err != nil {
		// The bytes are what the manifest named, so the peers that offered
		// it serve a model of another shape: a later try may find others.
		return nil, fmt.Errorf("%w: checkpoint %x from peers: %w", errLoadLater, id[:8], err)
	}
	// This node now holds the epoch's starting model: serve it too.
	if _, err := n.net.ShareCheckpoint(ctx, s.Progress.Epoch, p2p.TensorsSource(tensors)); err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed", "err", err)
	}
	return model, nil
}

// emptyModel is a model of the run's shape, all zero, for a P2P checkpoint
// to fill. A transformers model's tensors are named and shaped by
// transformers: the engine describes them (engine.Describer).
func (n *Node) emptyModel(ctx context.Context, s *coordinator.Coordinator, cfg modelspec.Config) (runmodel.Model, error) {
	if cfg.Arch != coordinator.ArchTransformers {
		return runmodel.New(cfg, 0, n.cfg.kernels)
	}
	tf, _, err := runmodel.RunTransformersConfig(&s.Model)
	if err != nil {
		return nil, err
	}
	d, ok := n.cfg.engine.(engine.Describer)
	if !ok {
		return nil, fmt.Errorf("node: %w", goengine.ErrNeedsTorch)
	}
	names, shapes, err := d.Describe(ctx, tf)
	if err != nil {
		return nil, err
	}
	values := make([][]float32, len(shapes))
	for i, sh := range shapes {
		values[i] = make([]float32, modelspec.Size(sh))
	}
	return tf.WithTensors(names, shapes, values)
}

// tensorSpecs is what a P2P checkpoint of m's shape must hold.
func tensorSpecs(m runmodel.Model) []p2p.TensorSpec {
	var out []p2p.TensorSpec
	for _, t := range m.CheckpointTensors() {
		shape := make([]uint64, len(t.Shape))
		for i, d := range t.Shape {
			shape[i] = uint64(d)
		}
		out = append(out, p2p.TensorSpec{Name: t.Name, DType: tensorDType, Shape: shape})
	}
	return out
}

// offerFile is a P2P checkpoint in a file that has no name: the weights'
// bytes, tensor after tensor, in the P2P layout (little-endian float32). The
// file is unlinked as soon as it is made, so its space returns to the
// system when the network closes it, and a crash leaves nothing behind.
type offerFile struct {
	*os.File
	specs []p2p.TensorSpec
}

func (f *offerFile) Specs() []p2p.TensorSpec { return f.specs }

// offerChunk is how many values writeOffer reads from the engine at a time.
const offerChunk = 1 << 16

// writeOffer writes w's checkpoint tensors, named and ordered as the
// model's, into an offerFile, a chunk at a time. corrupt, when set, is
// fault injection: it spoils each chunk's bytes before they are written.
func writeOffer(ctx context.Context, w runmodel.Weights, corrupt func([]byte)) (p2p.CheckpointSource, error) {
	ts, err := w.Tensors(false)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "psyche-offer-*")
	if err != nil {
		return nil, fmt.Errorf("node: a file for the model offered to joiners: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("node: a file for the model offered to joiners: %w", err)
	}
	out := &offerFile{File: f}
	bw := bufio.NewWriterSize(f, 1<<20)
	var buf []byte
	for _, t := range ts {
		shape := make([]uint64, len(t.Shape))
		for k, d := range t.Shape {
			shape[k] = uint64(d)
		}
		out.specs = append(out.specs, p2p.TensorSpec{Name: t.Name, DType: tensorDType, Shape: shape})
		err := t.Chunks(ctx, offerChunk, func(values []float32) error {
			buf = f32le.Append(buf[:0], values)
			if corrupt != nil {
				corrupt(buf)
			}
			_, err := bw.Write(buf)
			return err
		})
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("node: writing the model offered to joiners: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return nil, fmt.Errorf("node: writing the model offered to joiners: %w", err)
	}
	return out, nil
}

// loadTensors copies P2P checkpoint tensors into m's parameters: the same
// tensors in the same order with the same shapes, and finite values.
func loadTensors(m runmodel.Model, ts []p2p.Tensor) error {
	want := m.CheckpointTensors()
	if len(ts) != len(want) {
		return fmt.Errorf("%d tensors, the model has %d", len(ts), len(want))
	}
	for i, w := range want {
		t := ts[i]
		if t.Name != w.Name || t.DType != tensorDType || len(t.Shape) != len(w.Shape) {
			return fmt.Errorf("tensor %d is %s %s%v, want %s %s%v", i, t.Name, t.DType, t.Shape, w.Name, tensorDType, w.Shape)
		}
		for j, d := range w.Shape {
			if t.Shape[j] != uint64(d) {
				return fmt.Errorf("tensor %s has shape %v, want %v", t.Name, t.Shape, w.Shape)
			}
		}
		if len(t.Data) != 4*len(w.Data) {
			return fmt.Errorf("tensor %s has %d bytes, want %d", t.Name, len(t.Data), 4*len(w.Data))
		}
		f32le.Decode(w.Data, t.Data)
		for j, v := range w.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("tensor %s holds %v at %d", t.Name, v, j)
			}
		}
	}
	return nil
}
