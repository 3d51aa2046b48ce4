package node

import (
	"context"

	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// WithCorruptResults makes the node publish corrupt(payload) instead of its
// result: a trainer gone bad, for fault-injection tests.
func WithCorruptResults(corrupt func([]byte) []byte) Option {
	return func(c *config) error { c.corrupt = corrupt; return nil }
}

// WithEquivocation makes the node publish each result through publish
// instead of the network's Publish: a trainer that sends different results
// to different peers, for fault-injection tests. The announcement publish
// returns is the one the node keeps as its own.
func WithEquivocation(publish func(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error)) Option {
	return func(c *config) error {
		c.publish = func(ctx context.Context, _ p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
			return publish(ctx, step, batch, payload)
		}
		return nil
	}
}

// paramsOf is a model's parameters, tensor after tensor.
func paramsOf(m runmodel.Model) []float32 {
	var out []float32
	for _, t := range m.Tensors() {
		out = append(out, t...)
	}
	return out
}
