package coordinator

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The byte formats of this package (the account and the instruction data) are
// written by one walker per struct type. The same walker encodes, decodes and
// describes the layout, so the three can never disagree. Every field is
// little-endian and naturally aligned inside the account (explicit padding is
// part of the structs), so the C program can mirror the account as a plain
// struct with no packing attributes.

type cursorMode uint8

const (
	modeEncode cursorMode = iota
	modeDecode
	modeLayout
)

// LayoutField is one row of the account layout table.
type LayoutField struct {
	Name   string
	Offset int
	Size   int
	Count  int // >1 for an array of structs: Size is the stride
}

type cursor struct {
	mode   cursorMode
	buf    []byte
	off    int
	grow   bool // encode mode: extend buf instead of failing
	err    error
	prefix string
	fields []LayoutField
}

func (c *cursor) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
}

// take returns the next n bytes, or nil once the cursor has failed.
func (c *cursor) take(name string, n int) []byte {
	if c.err != nil {
		return nil
	}
	if c.mode == modeLayout {
		if n <= 8 && c.off%n != 0 {
			c.fail("coordinator: field %s%s at offset %d is not %d-aligned", c.prefix, name, c.off, n)
		}
		if name != "" {
			c.fields = append(c.fields, LayoutField{Name: c.prefix + name, Offset: c.off, Size: n, Count: 1})
		}
		c.off += n
		return nil
	}
	if c.grow && c.off+n > len(c.buf) {
		c.buf = append(c.buf, make([]byte, c.off+n-len(c.buf))...)
	}
	if c.off+n > len(c.buf) {
		c.fail("%w: need %d bytes at offset %d, have %d", ErrTruncated, n, c.off, len(c.buf))
		return nil
	}
	b := c.buf[c.off : c.off+n]
	c.off += n
	return b
}

func (c *cursor) u8(name string, v *uint8) {
	if b := c.take(name, 1); b != nil {
		if c.mode == modeEncode {
			b[0] = *v
		} else {
			*v = b[0]
		}
	}
}

func (c *cursor) boolean(name string, v *bool) {
	if b := c.take(name, 1); b != nil {
		if c.mode == modeEncode {
			b[0] = 0
			if *v {
				b[0] = 1
			}
			return
		}
		if b[0] > 1 {
			c.fail("%w: %s%s is %d, want 0 or 1", ErrMalformed, c.prefix, name, b[0])
		}
		*v = b[0] == 1
	}
}

func (c *cursor) u16(name string, v *uint16) {
	if b := c.take(name, 2); b != nil {
		if c.mode == modeEncode {
			binary.LittleEndian.PutUint16(b, *v)
		} else {
			*v = binary.LittleEndian.Uint16(b)
		}
	}
}

func (c *cursor) u32(name string, v *uint32) {
	if b := c.take(name, 4); b != nil {
		if c.mode == modeEncode {
			binary.LittleEndian.PutUint32(b, *v)
		} else {
			*v = binary.LittleEndian.Uint32(b)
		}
	}
}

func (c *cursor) u64(name string, v *uint64) {
	if b := c.take(name, 8); b != nil {
		if c.mode == modeEncode {
			binary.LittleEndian.PutUint64(b, *v)
		} else {
			*v = binary.LittleEndian.Uint64(b)
		}
	}
}

func (c *cursor) f32(name string, v *float32) {
	bits := math.Float32bits(*v)
	c.u32(name, &bits)
	if c.mode == modeDecode {
		*v = math.Float32frombits(bits)
	}
}

func (c *cursor) bytes(name string, v []byte) {
	if b := c.take(name, len(v)); b != nil {
		if c.mode == modeEncode {
			copy(b, v)
		} else {
			copy(v, b)
		}
	}
}

func (c *cursor) words(name string, v []uint64) {
	if c.mode == modeLayout {
		c.take(name, 8*len(v))
		return
	}
	if b := c.take(name, 8*len(v)); b != nil {
		for i := range v {
			if c.mode == modeEncode {
				binary.LittleEndian.PutUint64(b[8*i:], v[i])
			} else {
				v[i] = binary.LittleEndian.Uint64(b[8*i:])
			}
		}
	}
}

// pad covers explicit padding: zeros on encode, and decode rejects anything
// else, so that every accepted byte string re-encodes to itself.
func (c *cursor) pad(n int) {
	if c.mode == modeLayout {
		if c.err == nil {
			c.off += n
		}
		return
	}
	if b := c.take("", n); b != nil {
		for i := range b {
			if c.mode == modeEncode {
				b[i] = 0
			} else if b[i] != 0 {
				c.fail("%w: non-zero padding at offset %d", ErrMalformed, c.off-n+i)
				return
			}
		}
	}
}

// array walks n elements of stride bytes. In layout mode it describes the
// first element only and records the array as one row.
func (c *cursor) array(name string, n int, elem func(i int)) {
	if c.mode != modeLayout {
		for i := 0; i < n && c.err == nil; i++ {
			elem(i)
		}
		return
	}
	start := c.off
	saved := c.prefix
	c.prefix = saved + name + "[0]."
	elem(0)
	c.prefix = saved
	stride := c.off - start
	c.fields = append(c.fields, LayoutField{Name: saved + name, Offset: start, Size: stride, Count: n})
	c.off = start + n*stride
}

// nest walks a struct field under a name prefix.
func (c *cursor) nest(name string, walk func()) {
	saved := c.prefix
	c.prefix = saved + name + "."
	walk()
	c.prefix = saved
}

func (c *cursor) pubkey(name string, k *Pubkey) { c.bytes(name, k[:]) }

func (c *cursor) clientID(id *ClientID) {
	c.pubkey("signer", &id.Signer)
	c.pubkey("p2p", &id.P2P)
}

func (c *cursor) client(cl *Client) {
	c.clientID(&cl.ID)
	c.u8("state", (*uint8)(&cl.State))
	c.pad(3)
	c.u32("exited_height", &cl.ExitedHeight)
}

func (c *cursor) proof(p *WitnessProof) {
	c.u16("position", &p.Position)
	c.u16("index", &p.Index)
	c.boolean("is_witness", &p.IsWitness)
	c.pad(3)
}

func (c *cursor) witness(w *Witness) {
	c.nest("proof", func() { c.proof(&w.Proof) })
	c.u64("key", &w.Key)
	c.words("participants", w.Participants[:])
	c.words("broadcasts", w.Broadcasts[:])
	c.bytes("merkle", w.Merkle[:])
	c.nest("metadata", func() {
		m := &w.Metadata
		c.u32("step", &m.Step)
		c.f32("tokens_per_sec", &m.TokensPerSec)
		c.f32("bandwidth_per_sec", &m.BandwidthPerSec)
		c.f32("loss", &m.Loss)
	})
}

func (c *cursor) round(r *Round) {
	c.array("witnesses", MaxWitnesses, func(i int) { c.witness(&r.Witnesses[i]) })
	c.u64("data_index", &r.DataIndex)
	c.u64("random_seed", &r.RandomSeed)
	c.u32("height", &r.Height)
	c.u16("clients_len", &r.ClientsLen)
	c.u8("witnesses_len", &r.WitnessesLen)
	c.pad(1)
}

func (c *cursor) epochState(e *EpochState) {
	c.array("rounds", NumRounds, func(i int) { c.round(&e.Rounds[i]) })
	c.array("clients", MaxClients, func(i int) { c.client(&e.Clients[i]) })
	c.array("exited", MaxExitedClients, func(i int) { c.client(&e.Exited[i]) })
	c.u64("start_timestamp", &e.StartTimestamp)
	c.u32("start_step", &e.StartStep)
	c.u32("last_step", &e.LastStep)
	c.u16("clients_len", &e.ClientsLen)
	c.u16("exited_len", &e.ExitedLen)
	c.u8("current_round", &e.CurrentRound)
	c.boolean("first_round", &e.FirstRound)
	c.boolean("cold_start", &e.ColdStart)
	c.boolean("checkpointed", &e.Checkpointed)
}

func (c *cursor) metadata(m *Metadata) {
	c.bytes("name", m.Name[:])
	c.bytes("description", m.Description[:])
	c.u64("num_parameters", &m.NumParameters)
	c.u64("vocab_size", &m.VocabSize)
}

func (c *cursor) config(k *Config) {
	c.u64("warmup_time", &k.WarmupTime)
	c.u64("cooldown_time", &k.CooldownTime)
	c.u64("max_round_train_time", &k.MaxRoundTrainTime)
	c.u64("round_witness_time", &k.RoundWitnessTime)
	c.u64("epoch_time", &k.EpochTime)
	c.u64("waiting_for_members_extra_time", &k.WaitingForMembersExtraTime)
	c.u64("global_batch_size_warmup_tokens", &k.GlobalBatchSizeWarmupTokens)
	c.u32("total_steps", &k.TotalSteps)
	c.u16("global_batch_size_start", &k.GlobalBatchSizeStart)
	c.u16("global_batch_size_end", &k.GlobalBatchSizeEnd)
	c.u16("init_min_clients", &k.InitMinClients)
	c.u16("min_clients", &k.MinClients)
	c.u16("witness_nodes", &k.WitnessNodes)
	c.u8("verification_percent", &k.VerificationPercent)
	c.pad(1)
}

func (c *cursor) checkpointSource(s *CheckpointSource) {
	c.bytes("url", s.URL[:])
	c.bytes("revision", s.Revision[:])
}

func (c *cursor) model(m *Model) {
	c.u8("architecture", (*uint8)(&m.Architecture))
	c.u8("data_kind", (*uint8)(&m.DataKind))
	c.u8("token_size", &m.TokenSize)
	c.pad(1)
	c.u32("max_seq_len", &m.MaxSeqLen)
	c.u32("vocab_size", &m.VocabSize)
	c.u32("d_model", &m.DModel)
	c.u32("n_layers", &m.NLayers)
	c.u32("n_heads", &m.NHeads)
	c.u32("n_kv_heads", &m.NKVHeads)
	c.u32("intermediate_size", &m.IntermediateSize)
	c.f32("rope_theta", &m.RopeTheta)
	c.boolean("tied_head", &m.TiedHead)
	c.pad(3)
	c.nest("checkpoint", func() {
		c.u8("kind", (*uint8)(&m.Checkpoint.Kind))
		c.pad(7)
		c.checkpointSource(&m.Checkpoint.Source)
	})
	c.bytes("data_location", m.DataLocation[:])
	c.nest("lr", func() {
		l := &m.LR
		c.u8("kind", (*uint8)(&l.Kind))
		c.pad(3)
		c.f32("base_lr", &l.BaseLR)
		c.f32("final_lr", &l.FinalLR)
		c.u32("warmup_steps", &l.WarmupSteps)
		c.u32("decay_steps", &l.DecaySteps)
		c.u32("total_steps", &l.TotalSteps)
	})
	c.nest("optimizer", func() {
		o := &m.Optimizer
		c.u8("kind", (*uint8)(&o.Kind))
		c.boolean("quantize_1bit", &o.Quantize1Bit)
		c.u16("compression_topk", &o.CompressionTopK)
		c.u16("compression_chunk", &o.CompressionChunk)
		c.u8("aggregation", (*uint8)(&o.Aggregation))
		c.u8("normalization", (*uint8)(&o.Normalization))
		c.f32("clip_grad_norm", &o.ClipGradNorm)
		c.f32("weight_decay", &o.WeightDecay)
		c.f32("compression_decay", &o.CompressionDecay)
		c.f32("beta1", &o.Beta1)
		c.f32("beta2", &o.Beta2)
		c.f32("epsilon", &o.Epsilon)
	})
	c.nest("store", func() {
		c.bytes("url", m.Store.URL[:])
		c.bytes("endpoint", m.Store.Endpoint[:])
		c.bytes("region", m.Store.Region[:])
	})
}

func (c *cursor) progress(p *Progress) {
	c.u32("epoch", &p.Epoch)
	c.u32("step", &p.Step)
	c.u64("epoch_start_data_index", &p.EpochStartDataIndex)
}

func (c *cursor) coordinator(s *Coordinator) {
	c.u64("nonce", &s.Nonce)
	c.bytes("run_id", s.RunID[:])
	c.pubkey("main_authority", &s.MainAuthority)
	c.pubkey("join_authority", &s.JoinAuthority)
	c.u8("run_state", (*uint8)(&s.RunState))
	c.boolean("pending_pause", &s.PendingPause)
	c.pad(6)
	c.u64("run_state_start", &s.RunStateStart)
	c.nest("metadata", func() { c.metadata(&s.Metadata) })
	c.nest("config", func() { c.config(&s.Config) })
	c.nest("model", func() { c.model(&s.Model) })
	c.nest("progress", func() { c.progress(&s.Progress) })
	c.nest("epoch", func() { c.epochState(&s.Epoch) })
	c.array("pending", MaxClients, func(i int) { c.clientID(&s.Pending[i]) })
	c.u16("pending_len", &s.PendingLen)
	c.pad(6)
	c.u64("next_round_seed", &s.NextRoundSeed)
}
