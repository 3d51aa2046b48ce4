//go:build adversary

package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// An adversarial trainer, for scripts/bench-adversary and tests built with
// -tags adversary: it trains honestly (so it keeps its place in the run) but
// publishes a poisoned result instead of its own. The default binary has no
// such option.

// Adversaries are the attacks WithAdversary knows.
var Adversaries = []string{"huge", "nonfinite", "flip", "noise", "equivocate", "repeat-blocks", "oversize", "bogus-checkpoint",
	"copycat", "stale", "lazy-zero", "lazy-noise", "wrong-data", "slow", "withhold", "late", "later"}

// WithAdversary makes the node publish, instead of its result:
//   - huge: float values of ±distro.MaxValue, the largest a frame may carry,
//     against its own signs (a float frame, which a 1-bit run refuses;
//     anything larger every decoder refuses);
//   - nonfinite: its frame with NaN values (refused by every decoder);
//   - flip: every value negated (a sign frame in a 1-bit run: well formed);
//   - noise: random indices and values of the right shape and magnitude;
//   - equivocate: its result and a flipped one, both announced for its batch;
//   - repeat-blocks: an announcement whose blob lists its first block 256
//     times, declaring 256 MiB backed by 1 MiB (refused before any fetch:
//     a block listed twice is malformed);
//   - oversize: its result padded to 4 MiB, more than any result of the model;
//   - bogus-checkpoint: it trains and publishes honestly, but offers joiners
//     of the next epoch a model of random weights;
//   - copycat: a free rider: another trainer's result of an earlier step as
//     its own, its values rescaled by 1.5 in a float run (its own when it
//     has none to copy);
//   - stale: its first result, again every step;
//   - lazy-zero: a result of its shape with every value zero (no training
//     would give it);
//   - lazy-noise: signs or values drawn at random in a frame of its shape,
//     as a trainer that skips the work would send (noise, without the
//     magnitudes of its own result); both lazy ones report, as a trainer
//     that skipped the forward pass must, a guess for their sequence
//     losses: the batch's mean loss for every sequence (better than such a
//     trainer could know; the work done here only makes the guess);
//   - wrong-data: it trains honestly, on other data than its assignment
//     (the indices 7919 past its batch);
//   - slow: an honest trainer that takes 300 ms longer on every batch (for
//     false accusations: verification must not drop it);
//   - withhold: it trains (and witnesses) honestly but never announces its
//     result, nor sends a training notice: a silent trainer, which its
//     witnesses would wait for until the round's training limit;
//   - late: an honest trainer whose every result reaches its peers a second
//     (of the node's clock: virtual in a virtual-time run) after it trained
//     it, as a slower GPU or link would deliver it: within the witnesses'
//     patience (patience.go), it must keep its place;
//   - later: as late, but its results come laterDelay after it trained
//     them, past the witnesses' patience for a silent trainer in a round
//     whose other results all came at once, and within the round's
//     training limit: the training notice it sends when it begins its
//     batch keeps its place.
func WithAdversary(kind string) (Option, error) {
	r := rand.New(rand.NewPCG(uint64(len(kind)), 0x5eed))
	frameAttack := func(mutate func(*distro.Frame)) Option {
		return func(c *config) error {
			c.corrupt = func(payload []byte) []byte { return reencode(payload, mutate) }
			return nil
		}
	}
	switch kind {
	case "huge":
		return frameAttack(func(f *distro.Frame) {
			for i := range f.Tensors {
				t := &f.Tensors[i]
				for j, v := range t.Values {
					t.Values[j] = float32(math.Copysign(distro.MaxValue, -float64(v)))
				}
				t.Quantized = false
			}
		}), nil
	case "nonfinite":
		// The encoder refuses NaN, so a marker value is encoded and its
		// bytes replaced afterwards.
		const marker = float32(1.2345678e-7)
		return func(c *config) error {
			c.corrupt = func(payload []byte) []byte {
				b := reencode(payload, func(f *distro.Frame) {
					for i := range f.Tensors {
						t := &f.Tensors[i]
						t.Quantized = false
						for j := range t.Values {
							t.Values[j] = marker
						}
					}
				})
				var m, nan [4]byte
				binary.LittleEndian.PutUint32(m[:], math.Float32bits(marker))
				binary.LittleEndian.PutUint32(nan[:], math.Float32bits(float32(math.NaN())))
				return []byte(strings.ReplaceAll(string(b), string(m[:]), string(nan[:])))
			}
			return nil
		}, nil
	case "flip":
		return frameAttack(flip), nil
	case "noise":
		return frameAttack(func(f *distro.Frame) {
			for i := range f.Tensors {
				t := &f.Tensors[i]
				var scale float64
				for _, v := range t.Values {
					scale = max(scale, math.Abs(float64(v)))
				}
				for start := 0; start < len(t.Indices); start += t.K {
					picked := r.Perm(t.TileH * t.TileW)[:t.K]
					slices.Sort(picked)
					for j, ix := range picked {
						t.Indices[start+j] = uint32(ix)
						if t.Quantized {
							t.Values[start+j] = float32(1 - 2*r.IntN(2))
						} else {
							t.Values[start+j] = float32(r.NormFloat64() * scale)
						}
					}
				}
			}
		}), nil
	case "oversize":
		return func(c *config) error {
			// Random padding: blocks of zeros would repeat, which even the
			// publishing side refuses.
			c.corrupt = func(payload []byte) []byte {
				pad := make([]byte, 4<<20)
				for i := range pad {
					pad[i] = byte(r.IntN(256))
				}
				return append(payload, pad...)
			}
			return nil
		}, nil
	case "bogus-checkpoint":
		return func(c *config) error {
			c.corruptShare = func(b []byte) {
				for j := range b {
					b[j] = byte(r.IntN(256))
				}
			}
			return nil
		}, nil
	case "copycat":
		return func(c *config) error {
			c.freeRide = func(own []byte, others []*distro.Frame) []byte {
				if len(others) == 0 {
					return own
				}
				f := others[0]
				cp := &distro.Frame{Tensors: slices.Clone(f.Tensors)}
				for i := range cp.Tensors {
					t := &cp.Tensors[i]
					t.Values = slices.Clone(t.Values)
					if t.Quantized {
						continue // signs only: the copy is the original's
					}
					for j := range t.Values {
						t.Values[j] *= 1.5
					}
				}
				b, err := cp.MarshalBinary()
				if err != nil {
					return own
				}
				return b
			}
			return nil
		}, nil
	case "stale":
		return func(c *config) error {
			var first []byte
			c.corrupt = func(payload []byte) []byte {
				if first == nil {
					first = slices.Clone(payload)
				}
				return first
			}
			return nil
		}, nil
	case "lazy-noise":
		return frameAttack(func(f *distro.Frame) {
			guessLosses(f)
			for i := range f.Tensors {
				t := &f.Tensors[i]
				for j := range t.Values {
					if t.Quantized {
						t.Values[j] = float32(1 - 2*r.IntN(2))
					} else {
						t.Values[j] = float32(r.NormFloat64())
					}
				}
			}
		}), nil
	case "wrong-data":
		return func(c *config) error { c.dataShift = 7919; return nil }, nil
	case "slow":
		return func(c *config) error {
			c.corrupt = func(payload []byte) []byte {
				time.Sleep(300 * time.Millisecond) // honest, late
				return payload
			}
			return nil
		}, nil
	case "lazy-zero":
		return frameAttack(func(f *distro.Frame) {
			guessLosses(f)
			for i := range f.Tensors {
				t := &f.Tensors[i]
				t.Quantized = false
				clear(t.Values)
			}
		}), nil
	case "equivocate":
		return func(c *config) error {
			c.publish = equivocatingPublish
			return nil
		}, nil
	case "repeat-blocks":
		return func(c *config) error {
			c.publish = repeatingPublish
			return nil
		}, nil
	case "withhold":
		return func(c *config) error {
			c.publish = withholdingPublish
			c.silent = true
			return nil
		}, nil
	case "late":
		return func(c *config) error {
			// c is the node's config as New fills it: its clock is the
			// one the node runs on when this publishes.
			c.publish = func(ctx context.Context, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
				return latePublish(ctx, c.clock, time.Second, net, step, batch, payload)
			}
			return nil
		}, nil
	case "later":
		return func(c *config) error {
			c.publish = func(ctx context.Context, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
				return latePublish(ctx, c.clock, laterDelay, net, step, batch, payload)
			}
			return nil
		}, nil
	}
	return nil, fmt.Errorf("node: unknown adversary %q (one of %s)", kind, strings.Join(Adversaries, ", "))
}

// guessLosses replaces f's sequence losses by their mean.
func guessLosses(f *distro.Frame) {
	var sum float64
	for _, l := range f.Losses {
		sum += float64(l)
	}
	for i := range f.Losses {
		f.Losses[i] = float32(sum / float64(len(f.Losses)))
	}
}

func flip(f *distro.Frame) {
	for i := range f.Tensors {
		for j, v := range f.Tensors[i].Values {
			f.Tensors[i].Values[j] = -v
		}
	}
}

// reencode decodes the node's own honest payload, mutates the frame and
// encodes it again.
func reencode(payload []byte, mutate func(*distro.Frame)) []byte {
	f, err := distro.DecodeFrame(payload, distro.DefaultLimits)
	if err != nil {
		return payload
	}
	mutate(f)
	b, err := f.MarshalBinary()
	if err != nil {
		return payload
	}
	return b
}

// equivocatingPublish announces the honest result and a flipped one for the
// same batch: every peer sees two commitments from one trainer.
func equivocatingPublish(ctx context.Context, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	ann, err := net.Publish(ctx, step, batch, payload)
	if err != nil {
		return ann, err
	}
	_, err = net.Publish(ctx, step, batch, reencode(payload, flip))
	return ann, err
}

// repeatingPublish announces a blob of 256 blocks that are all the payload's
// first block: a victim that trusted the listing would assemble 256 MiB from
// one fetched block.
func repeatingPublish(ctx context.Context, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	f, ok := net.(p2p.Forger)
	if !ok {
		return p2p.Announcement{}, fmt.Errorf("node: the network %T cannot forge announcements", net)
	}
	const times = 256
	first := p2p.BlockDigests(payload[:min(len(payload), p2p.BlockSize)])[0]
	ref := p2p.BlobRef{Size: times * p2p.BlockSize, Blocks: make([]coordinator.Hash, times)}
	for i := range ref.Blocks {
		ref.Blocks[i] = first
	}
	return f.Forge(ctx, step, batch, payload, ref)
}

// withholdingPublish announces nothing: it returns the announcement the
// result would have had (this node's machine takes it as published) and
// sends none of it, so no peer ever hears of the result.
func withholdingPublish(_ context.Context, _ p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	return unsent(step, batch, payload), nil
}

// unsent is the announcement a payload would have, without its trainer
// (the node fills it in), nonce or signature: what this node's machine
// records of a result it did not send.
func unsent(step uint32, batch p2p.BatchRange, payload []byte) p2p.Announcement {
	return p2p.Announcement{Step: step, Batch: batch, Commitment: p2p.Commitment(step, batch, payload),
		Blob: p2p.BlobRef{Size: uint64(len(payload)), Blocks: p2p.BlockDigests(payload)}}
}

// laterDelay is how late the later adversary's results come: more than the
// least patience (2 s after the second of the last other result) and less
// than localrun's training limit (7 s).
const laterDelay = 5 * time.Second

// latePublish publishes the payload after delay on clock, in the
// background (not marked as work: a virtual clock moves meanwhile), and
// returns at once as if it had published: the node goes on, and its peers
// hear of the result delay later.
func latePublish(ctx context.Context, clock Clock, delay time.Duration, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	tick, stop := clock.Ticker(delay)
	go func() {
		defer stop()
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		done := clock.Work()
		defer done()
		_, _ = net.Publish(ctx, step, batch, payload)
	}()
	return unsent(step, batch, payload), nil
}
