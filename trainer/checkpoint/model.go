package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
)

// ModelKey is the metadata key under which a checkpoint stores its
// ModelConfig as JSON.
const ModelKey = "psyche.model"

// ArchGPT is ModelConfig.Architecture for the GPT architecture. Architectures
// are stored by name, not by the coordinator's number, so a checkpoint stays
// readable by tools that know nothing of the coordinator's encoding.
const ArchGPT = "gpt"

// ArchLlama is ModelConfig.Architecture for the Llama architecture.
const ArchLlama = "llama"

// ModelConfig is the shape-determining part of a model: what a trainer must
// agree with before it can use a checkpoint's tensors. It deliberately leaves
// out how the model is trained (schedule, optimizer, data), which may change
// between runs that share a checkpoint.
type ModelConfig struct {
	Architecture string `json:"architecture"` // model family by name: ArchGPT
	VocabSize    uint32 `json:"vocab_size"`   // rows of the token embedding (and tied output head)
	MaxSeqLen    uint32 `json:"max_seq_len"`  // context length; sizes the position embeddings
	DModel       uint32 `json:"d_model"`      // width of the residual stream
	NLayers      uint32 `json:"n_layers"`     // number of transformer blocks
	NHeads       uint32 `json:"n_heads"`      // attention heads per block; divides DModel

	// Llama only (absent from a GPT checkpoint's JSON, which is therefore
	// byte for byte what it was before these fields existed).
	NKVHeads         uint32  `json:"n_kv_heads,omitempty"`        // key/value heads; divides NHeads
	IntermediateSize uint32  `json:"intermediate_size,omitempty"` // the MLP's hidden size
	RopeTheta        float32 `json:"rope_theta,omitempty"`        // rotary base
	TiedHead         bool    `json:"tied_head,omitempty"`         // output head = embeddings
}

// llamaFields are the JSON names of the fields only a Llama config has;
// tied_head may be absent (false).
var llamaFields = []string{"n_kv_heads", "intermediate_size", "rope_theta"}

// Validate reports whether c describes a model we can build, with the same
// rules as the coordinator's model validation. Errors wrap ErrInvalidModelConfig.
func (c ModelConfig) Validate() error {
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, wrap(ErrInvalidModelConfig, format, args...))
		}
	}
	rule(c.Architecture == ArchGPT || c.Architecture == ArchLlama, "architecture %q is unknown (want %q or %q)", c.Architecture, ArchGPT, ArchLlama)
	rule(c.VocabSize > 0, "vocab_size must be greater than 0")
	rule(c.MaxSeqLen > 0, "max_seq_len must be greater than 0")
	rule(c.DModel > 0, "d_model must be greater than 0")
	rule(c.NLayers > 0, "n_layers must be greater than 0")
	rule(c.NHeads > 0 && c.DModel%max(c.NHeads, 1) == 0, "n_heads (%d) must be positive and divide d_model (%d)", c.NHeads, c.DModel)
	if c.Architecture == ArchLlama {
		rule(c.NKVHeads > 0 && c.NHeads%max(c.NKVHeads, 1) == 0, "n_kv_heads (%d) must be positive and divide n_heads (%d)", c.NKVHeads, c.NHeads)
		rule(c.IntermediateSize > 0, "intermediate_size must be greater than 0")
		rule(c.RopeTheta > 1 && !math.IsInf(float64(c.RopeTheta), 0), "rope_theta (%g) must be finite and greater than 1", c.RopeTheta)
		rule(c.NHeads == 0 || (c.DModel/max(c.NHeads, 1))%2 == 0, "the head size d_model/n_heads (%d) must be even", c.DModel/max(c.NHeads, 1))
	} else {
		rule(c.NKVHeads == 0 && c.IntermediateSize == 0 && c.RopeTheta == 0 && !c.TiedHead,
			"n_kv_heads, intermediate_size, rope_theta and tied_head are Llama fields")
	}
	return errors.Join(errs...)
}

// WithModelConfig returns a copy of meta (which may be nil) with c stored
// under ModelKey, for passing to Save. It refuses an invalid c, so a
// checkpoint never carries a config that ParseModelConfig would reject.
func WithModelConfig(meta map[string]string, c ModelConfig) (map[string]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(c) // struct fields marshal in declaration order: deterministic
	if err != nil {
		return nil, wrap(ErrInvalidModelConfig, "%v", err)
	}
	out := maps.Clone(meta)
	if out == nil {
		out = make(map[string]string, 1)
	}
	out[ModelKey] = string(b)
	return out, nil
}

// ParseModelConfig parses and validates the JSON stored under ModelKey. It
// is strict: every field must be present exactly once with its exact name,
// and unknown fields are rejected, since a field this version does not know
// could change the architecture. Errors wrap ErrInvalidModelConfig.
func ParseModelConfig(s string) (ModelConfig, error) {
	var c ModelConfig
	if jsonKind(json.RawMessage(s)) != '{' {
		return c, wrap(ErrInvalidModelConfig, "not a JSON object")
	}
	members, err := objectMembers([]byte(s))
	if err != nil {
		return c, wrap(ErrInvalidModelConfig, "%v", err)
	}
	fields := map[string]*uint32{"vocab_size": &c.VocabSize, "max_seq_len": &c.MaxSeqLen,
		"d_model": &c.DModel, "n_layers": &c.NLayers, "n_heads": &c.NHeads,
		"n_kv_heads": &c.NKVHeads, "intermediate_size": &c.IntermediateSize}
	required := []string{"architecture", "vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads"}
	for _, m := range members {
		switch m.key {
		case "architecture":
			if c.Architecture, err = decodeString(m.value); err != nil {
				return c, wrap(ErrInvalidModelConfig, "architecture: %v", err)
			}
			continue
		case "rope_theta":
			if err := decodeFloat32(m.value, &c.RopeTheta); err != nil {
				return c, wrap(ErrInvalidModelConfig, "rope_theta: %v", err)
			}
			continue
		case "tied_head":
			if err := json.Unmarshal(m.value, &c.TiedHead); err != nil || (jsonKind(m.value) != 't' && jsonKind(m.value) != 'f') {
				return c, wrap(ErrInvalidModelConfig, "tied_head: %s is not a boolean", truncate(m.value))
			}
			continue
		}
		dst, ok := fields[m.key]
		if !ok {
			return c, wrap(ErrInvalidModelConfig, "unknown field %q", m.key)
		}
		if err := decodeUint32(m.value, dst); err != nil {
			return c, wrap(ErrInvalidModelConfig, "%s: %v", m.key, err)
		}
	}
	if c.Architecture == ArchLlama {
		required = append(required, llamaFields...)
	}
	for _, name := range required {
		if !hasMember(members, name) {
			return c, wrap(ErrInvalidModelConfig, "missing field %q", name)
		}
	}
	return c, c.Validate()
}

func hasMember(members []member, key string) bool {
	for _, m := range members {
		if m.key == key {
			return true
		}
	}
	return false
}

// decodeUint32 decodes a JSON integer (not null, not fractional, in range).
func decodeUint32(v json.RawMessage, dst *uint32) error {
	var n json.Number
	if k := jsonKind(v); k != '-' && (k < '0' || k > '9') {
		return fmt.Errorf("%s is not a number", truncate(v))
	}
	if err := json.Unmarshal(v, &n); err != nil {
		return err
	}
	x, err := n.Int64()
	if err != nil || x < 0 || x > math.MaxUint32 {
		return fmt.Errorf("%s is not an integer in [0, %d]", n, uint32(math.MaxUint32))
	}
	*dst = uint32(x)
	return nil
}

// decodeFloat32 decodes a finite JSON number that float32 holds.
func decodeFloat32(v json.RawMessage, dst *float32) error {
	if k := jsonKind(v); k != '-' && (k < '0' || k > '9') {
		return fmt.Errorf("%s is not a number", truncate(v))
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		return err
	}
	if math.IsInf(f, 0) || math.Abs(f) > math.MaxFloat32 {
		return fmt.Errorf("%s does not fit a float32", truncate(v))
	}
	*dst = float32(f)
	return nil
}

// ModelConfig returns the checkpoint's model config, wrapping
// ErrNoModelConfig when it has none and ErrInvalidModelConfig when it is
// unreadable.
func (c *Checkpoint) ModelConfig() (ModelConfig, error) {
	s, ok := c.meta[ModelKey]
	if !ok {
		return ModelConfig{}, ErrNoModelConfig
	}
	return ParseModelConfig(s)
}
