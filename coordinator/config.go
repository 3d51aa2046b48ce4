package coordinator

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// FixedString returns the text of a zero-padded fixed-size field.
func FixedString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// SetFixedString stores s zero-padded in dst.
func SetFixedString(dst []byte, s string) error {
	if len(s) > len(dst) {
		return fmt.Errorf("%w: %q is %d bytes, the field holds %d", ErrMalformed, s, len(s), len(dst))
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("%w: %q contains a zero byte", ErrMalformed, s)
		}
	}
	n := copy(dst, s)
	clear(dst[n:])
	return nil
}

// canonicalFixed reports whether b is text followed only by zeros, so that
// FixedString and SetFixedString round-trip it.
func canonicalFixed(b []byte) bool {
	end := len(b)
	for i, c := range b {
		if c == 0 {
			end = i
			break
		}
	}
	for _, c := range b[end:] {
		if c != 0 {
			return false
		}
	}
	return true
}

// RunIDString returns the run id as text.
func (s *Coordinator) RunIDString() string { return FixedString(s.RunID[:]) }

// ParseRunID checks and packs a run id: 1 to 32 characters of [A-Za-z0-9._-],
// because it is a PDA seed and appears on command lines and in file names.
func ParseRunID(id string) ([MaxRunIDLen]byte, error) {
	var out [MaxRunIDLen]byte
	if len(id) == 0 || len(id) > MaxRunIDLen {
		return out, fmt.Errorf("%w: %q", ErrInvalidRunID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return out, fmt.Errorf("%w: %q", ErrInvalidRunID, id)
		}
	}
	copy(out[:], id)
	return out, nil
}

func validRunID(id [MaxRunIDLen]byte) bool {
	if !canonicalFixed(id[:]) {
		return false
	}
	_, err := ParseRunID(FixedString(id[:]))
	return err == nil
}

// Validate checks every rule of docs/architecture.md §3.2 and returns one error per
// violated rule (joined), each wrapping ErrInvalidConfig.
func (k *Config) Validate() error {
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
		}
	}
	rule(k.EpochTime > 0, "epoch_time must be greater than 0")
	rule(k.WarmupTime < k.EpochTime, "warmup_time (%d) must be less than epoch_time (%d)", k.WarmupTime, k.EpochTime)
	rule(k.MaxRoundTrainTime > 0, "max_round_train_time must be greater than 0")
	rule(k.MaxRoundTrainTime < k.EpochTime, "max_round_train_time (%d) must be less than epoch_time (%d)", k.MaxRoundTrainTime, k.EpochTime)
	rule(k.RoundWitnessTime > 0, "round_witness_time must be greater than 0")
	rule(k.CooldownTime > 0, "cooldown_time must be greater than 0")
	rule(k.WaitingForMembersExtraTime > 0, "waiting_for_members_extra_time must be greater than 0")
	rule(k.MinClients > 0, "min_clients must be greater than 0")
	rule(k.MinClients <= k.InitMinClients, "min_clients (%d) must not exceed init_min_clients (%d)", k.MinClients, k.InitMinClients)
	rule(k.InitMinClients <= MaxClients, "init_min_clients (%d) must not exceed %d", k.InitMinClients, MaxClients)
	rule(k.GlobalBatchSizeStart > 0, "global_batch_size_start must be greater than 0")
	rule(k.GlobalBatchSizeStart <= k.GlobalBatchSizeEnd, "global_batch_size_start (%d) must not exceed global_batch_size_end (%d)", k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd)
	rule(k.InitMinClients <= k.GlobalBatchSizeEnd, "init_min_clients (%d) must not exceed global_batch_size_end (%d): every trainer needs a sequence", k.InitMinClients, k.GlobalBatchSizeEnd)
	rule(k.GlobalBatchSizeWarmupTokens <= maxWarmupTokens, "global_batch_size_warmup_tokens (%d) must not exceed 2^47", k.GlobalBatchSizeWarmupTokens)
	rule(k.TotalSteps > 0, "total_steps must be greater than 0")
	rule(k.WitnessNodes <= min(k.MinClients, MaxWitnesses), "witness_nodes (%d) must not exceed min(min_clients, %d) = %d", k.WitnessNodes, MaxWitnesses, min(k.MinClients, MaxWitnesses))
	rule(k.VerificationPercent <= 100, "verification_percent (%d) must not exceed 100", k.VerificationPercent)
	return errors.Join(errs...)
}

// f32 checks are written on the bit pattern so that the C program (which has
// no floating point unit) can apply the very same rules.
func finite32(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }
func nonNegative32(v float32) bool {
	return finite32(v) && (math.Float32bits(v)>>31 == 0 || math.Float32bits(v) == 0x80000000)
}
func positive32(v float32) bool { return nonNegative32(v) && math.Float32bits(v)&0x7fffffff != 0 }

// unitInterval32 reports 0 <= v < 1.
func unitInterval32(v float32) bool {
	return nonNegative32(v) && math.Float32bits(v)&0x7fffffff < 0x3f800000
}

// Validate checks the model description and returns one error per violated
// rule (joined), each wrapping ErrInvalidModel.
func (m *Model) Validate() error {
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidModel}, args...)...))
		}
	}
	rule(m.Architecture == ArchGPT || m.Architecture == ArchLlama || m.Architecture == ArchTransformers,
		"architecture %d is unknown (1 = GPT, 2 = Llama, 3 = Transformers)", m.Architecture)
	rule(m.MaxSeqLen > 0, "max_seq_len must be greater than 0")
	rule(m.VocabSize > 0, "vocab_size must be greater than 0")
	rule(m.DModel > 0, "d_model must be greater than 0")
	rule(m.NLayers > 0, "n_layers must be greater than 0")
	rule(m.NHeads > 0 && m.DModel%max(m.NHeads, 1) == 0, "n_heads (%d) must be positive and divide d_model (%d)", m.NHeads, m.DModel)
	if m.Architecture == ArchLlama {
		rule(m.NKVHeads > 0 && m.NHeads%max(m.NKVHeads, 1) == 0, "n_kv_heads (%d) must be positive and divide n_heads (%d)", m.NKVHeads, m.NHeads)
		rule(m.NHeads == 0 || (m.DModel/max(m.NHeads, 1))%2 == 0, "the head size d_model/n_heads must be even (rotary embeddings turn pairs)")
		rule(m.IntermediateSize > 0, "intermediate_size must be greater than 0")
		rule(math.Float32bits(m.RopeTheta) > 0x3f800000 && math.Float32bits(m.RopeTheta) < 0x7f800000, "rope_theta must be finite and greater than 1")
	} else {
		rule(m.NKVHeads == 0 && m.IntermediateSize == 0 && math.Float32bits(m.RopeTheta) == 0 && !m.TiedHead,
			"n_kv_heads, intermediate_size, rope_theta and tied_head must be zero for %v (they are Llama fields)", m.Architecture)
	}
	switch m.Checkpoint.Kind {
	case CheckpointHub, CheckpointP2P:
		rule(FixedString(m.Checkpoint.Source.URL[:]) != "", "checkpoint URL must not be empty")
	case CheckpointEphemeral:
		rule(false, "an ephemeral checkpoint is not allowed: the run could not be recovered")
	case CheckpointNone:
		rule(false, "a checkpoint source is required")
	default:
		rule(false, "checkpoint kind %d is unknown", m.Checkpoint.Kind)
	}
	rule(canonicalFixed(m.Checkpoint.Source.URL[:]) && canonicalFixed(m.Checkpoint.Source.Revision[:]),
		"checkpoint URL and revision must be text padded with zeros")
	rule(m.DataKind == DataLocal || m.DataKind == DataHTTP, "data kind %d is unknown (1 = local, 2 = http)", m.DataKind)
	rule(FixedString(m.DataLocation[:]) != "" && canonicalFixed(m.DataLocation[:]), "data location must be non-empty text")
	rule(m.TokenSize == 2 || m.TokenSize == 4, "token_size (%d) must be 2 or 4", m.TokenSize)
	if err := m.Store.validate(); err != nil {
		rule(false, "%v", err)
	}
	rule(m.TokenSize != 2 || m.VocabSize <= 1<<16, "vocab_size (%d) does not fit 2-byte tokens", m.VocabSize)

	lr := &m.LR
	rule(lr.Kind > LRNone && lr.Kind < numLRSchedules, "lr schedule %d is unknown", lr.Kind)
	rule(positive32(lr.BaseLR), "lr base_lr must be positive and finite")
	rule(nonNegative32(lr.FinalLR), "lr final_lr must be non-negative and finite")
	if lr.Kind == LRWarmupStableDecay {
		rule(uint64(lr.WarmupSteps)+uint64(lr.DecaySteps) <= uint64(lr.TotalSteps),
			"lr warmup_steps (%d) + decay_steps (%d) must not exceed total_steps (%d)", lr.WarmupSteps, lr.DecaySteps, lr.TotalSteps)
	}

	o := &m.Optimizer
	rule(nonNegative32(o.ClipGradNorm), "optimizer clip_grad_norm must be non-negative and finite")
	rule(nonNegative32(o.WeightDecay), "optimizer weight_decay must be non-negative and finite")
	switch o.Kind {
	case OptimizerAdamW:
		rule(unitInterval32(o.Beta1), "adamw beta1 must be in [0, 1)")
		rule(unitInterval32(o.Beta2), "adamw beta2 must be in [0, 1)")
		rule(positive32(o.Epsilon), "adamw epsilon must be positive and finite")
	case OptimizerDistro:
		rule(unitInterval32(o.CompressionDecay), "distro compression_decay must be in [0, 1)")
		rule(o.CompressionChunk > 0, "distro compression_chunk must be greater than 0")
		rule(o.CompressionTopK > 0 && uint32(o.CompressionTopK) <= uint32(o.CompressionChunk)*uint32(o.CompressionChunk),
			"distro compression_topk (%d) must be in [1, chunk^2]", o.CompressionTopK)
		rule(o.Aggregation < numAggregations, "distro aggregation %d is unknown (0 = robust, 1 = mean, 2 = clipped-mean)", o.Aggregation)
		rule(o.Normalization < numNormalizations, "distro normalization %d is unknown (0 = rms, 1 = none)", o.Normalization)
	default:
		rule(false, "optimizer kind %d is unknown (1 = AdamW, 2 = DisTrO)", o.Kind)
	}
	return errors.Join(errs...)
}

// BatchSize is the global batch (in sequences) for a round starting at
// dataIndex: it ramps linearly from start to end over the configured number of
// tokens, where tokens seen = dataIndex × maxSeqLen.
func (k *Config) BatchSize(maxSeqLen uint32, dataIndex uint64) uint16 {
	start, end := uint64(k.GlobalBatchSizeStart), uint64(k.GlobalBatchSizeEnd)
	if end <= start || k.GlobalBatchSizeWarmupTokens == 0 {
		return k.GlobalBatchSizeEnd
	}
	hi, tokens := bits.Mul64(dataIndex, uint64(maxSeqLen))
	if hi != 0 || tokens >= k.GlobalBatchSizeWarmupTokens {
		return k.GlobalBatchSizeEnd
	}
	// tokens < 2^47 and end-start < 2^16, so the product fits in 63 bits.
	return uint16(start + (end-start)*tokens/k.GlobalBatchSizeWarmupTokens)
}

// DataIndexForStep is the first data index of the batch of a given step of a
// run that started at step 1 and data index 0 and was never rewritten: the
// sum of the batch sizes of every earlier step.
func (k *Config) DataIndexForStep(maxSeqLen uint32, step uint32) uint64 {
	var idx uint64
	for s := uint32(1); s < step; s++ {
		idx += uint64(k.BatchSize(maxSeqLen, idx))
	}
	return idx
}

// validate checks the store's three fields (the C program's store_valid
// applies the same rules byte by byte).
func (st *CheckpointStore) validate() error {
	if !canonicalFixed(st.URL[:]) || !canonicalFixed(st.Endpoint[:]) || !canonicalFixed(st.Region[:]) {
		return errors.New("store url, endpoint and region must be text padded with zeros")
	}
	url, endpoint, region := FixedString(st.URL[:]), FixedString(st.Endpoint[:]), FixedString(st.Region[:])
	if url == "" {
		if endpoint != "" || region != "" {
			return errors.New("store endpoint and region need a store url")
		}
		return nil
	}
	bucket, prefix, ok := strings.Cut(strings.TrimPrefix(url, "s3://"), "/")
	switch {
	case !strings.HasPrefix(url, "s3://"):
		return fmt.Errorf("store %q must start with s3://", url)
	case !validBucket(bucket):
		return fmt.Errorf("store %q: bucket %q must be 3 to 63 of a-z, 0-9, '.' and '-', starting and ending with a letter or digit", url, bucket)
	case ok && (prefix == "" || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "//") || !visibleASCII(prefix)):
		return fmt.Errorf("store %q: the prefix after the bucket must be visible ASCII without empty parts or a trailing slash", url)
	}
	if endpoint != "" {
		rest, isHTTPS := strings.CutPrefix(endpoint, "https://")
		if !isHTTPS {
			var isHTTP bool
			if rest, isHTTP = strings.CutPrefix(endpoint, "http://"); !isHTTP {
				return fmt.Errorf("store endpoint %q must start with http:// or https://", endpoint)
			}
		}
		if rest == "" || !visibleASCII(rest) {
			return fmt.Errorf("store endpoint %q must name a host in visible ASCII", endpoint)
		}
	}
	for _, c := range []byte(region) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("store region %q must be a-z, 0-9 and '-'", region)
		}
	}
	return nil
}

// validBucket is S3's bucket-name rule: 3 to 63 of a-z, 0-9, '.', '-',
// starting and ending with a letter or digit.
func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '.' && c != '-' || i == 0 || i == len(b)-1) {
			return false
		}
	}
	return true
}

// visibleASCII: every byte printable and not a space.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
