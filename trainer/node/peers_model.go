package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/psyche-go/psyche/coordinator"
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
	tensors, err := weightTensors(ctx, w)
	if err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed: reading the weights", "engine", e.Name(), "err", err)
		return
	}
	if n.cfg.corruptShare != nil {
		n.cfg.corruptShare(tensors)
	}
	id, err := n.net.ShareCheckpoint(ctx, epoch, tensors)
	if err != nil {
		n.cfg.log.Warn("sharing the model with joiners failed", "err", err)
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
	tensors, err := weightTensors(ctx, w)
	if err != nil {
		return err
	}
	_, err = n.net.ShareCheckpoint(ctx, epoch, tensors)
	return err
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
	if _, err := n.net.ShareCheckpoint(ctx, s.Progress.Epoch, tensors); err != nil {
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

// weightTensors reads the weights into P2P checkpoint tensors, named and
// ordered as the model's checkpoint tensors, a chunk at a time.
func weightTensors(ctx context.Context, w runmodel.Weights) ([]p2p.Tensor, error) {
	ts, err := w.Tensors(false)
	if err != nil {
		return nil, err
	}
	out := make([]p2p.Tensor, len(ts))
	for i, t := range ts {
		shape := make([]uint64, len(t.Shape))
		for k, d := range t.Shape {
			shape[k] = uint64(d)
		}
		b := make([]byte, 0, 4*modelspec.Size(t.Shape))
		err := t.Chunks(ctx, 1<<16, func(values []float32) error {
			for _, v := range values {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		out[i] = p2p.Tensor{Name: t.Name, DType: tensorDType, Shape: shape, Data: b}
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
		for j := range w.Data {
			v := math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*j:]))
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("tensor %s holds %v at %d", t.Name, v, j)
			}
			w.Data[j] = v
		}
	}
	return nil
}
