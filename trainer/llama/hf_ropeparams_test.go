package llama

import (
	"errors"
	"testing"
)

// TestHFConfigRopeParameters: transformers 5 writes rope_theta inside
// rope_parameters (with rope_type "default" for plain RoPE) and the dtype
// as "dtype"; ParseHFConfig reads both spellings, the nested θ winning,
// and refuses a rope type it does not implement rather than running plain
// RoPE in its place.
func TestHFConfigRopeParameters(t *testing.T) {
	const base = `"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16`
	cases := []struct {
		name      string
		extra     string
		wantTheta float32
		wantDType string
		wantErr   bool
	}{
		{"top level only (transformers 4, ours)", `"rope_theta": 500000.0, "torch_dtype": "float32"`, 500000, "F32", false},
		{"rope_parameters only (transformers 5)", `"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "dtype": "bfloat16"`, 500000, "BF16", false},
		{"rope_parameters without a type", `"rope_parameters": {"rope_theta": 250000.0}`, 250000, "", false},
		{"rope_parameters without theta keeps the default", `"rope_parameters": {"rope_type": "default"}`, 10000, "", false},
		{"neither: transformers' default", ``, 10000, "", false},
		{"llama3 scaling refused", `"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}`, 0, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			js := "{" + base
			if c.extra != "" {
				js += ", " + c.extra
			}
			js += "}"
			got, dtype, err := ParseHFConfig("config.json", []byte(js))
			if c.wantErr {
				if !errors.Is(err, ErrHFConfig) {
					t.Fatalf("got %+v, %v; want an ErrHFConfig", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.RopeTheta != c.wantTheta || dtype != c.wantDType {
				t.Fatalf("rope theta %g, dtype %q; want %g, %q", got.RopeTheta, dtype, c.wantTheta, c.wantDType)
			}
		})
	}
}
