package node

import (
	"context"
	"sync"

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

// WithFirstEpoch makes the node join no epoch before epoch (it follows the
// run until then): a joiner of a later epoch started with the others, so
// that it joins that epoch however late the test is scheduled.
func WithFirstEpoch(epoch uint32) Option {
	return func(c *config) error { c.joinFrom = epoch; return nil }
}

// WithDeathAt makes the node die at step: its result for step never goes
// out (its publish waits for the node's end) and died is closed, so a test
// stops it there. A machine that fails at a step the test chooses, where a
// kill at a step the test saw go by lands wherever a loaded machine's
// scheduling puts it (as late as an epoch's last round, too late for the
// health checks that drop it).
func WithDeathAt(step uint32, died chan<- struct{}) Option {
	var once sync.Once
	return func(c *config) error {
		c.publish = func(ctx context.Context, net p2p.Network, s uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
			if s < step {
				return net.Publish(ctx, s, batch, payload)
			}
			once.Do(func() { close(died) })
			<-ctx.Done()
			return p2p.Announcement{}, ctx.Err()
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
