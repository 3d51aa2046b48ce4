package modelspec

import (
	"errors"
	"testing"
)

func TestParseSource(t *testing.T) {
	for _, tt := range []struct {
		url  string
		want Source
	}{
		{"seed:0", Source{Kind: FromSeed, Seed: 0}},
		{"seed:1", Source{Kind: FromSeed, Seed: 1}},
		{"seed:18446744073709551615", Source{Kind: FromSeed, Seed: 1<<64 - 1}},
		{"file:///var/lib/init.safetensors", Source{Kind: FromFile, Path: "/var/lib/init.safetensors"}},
		{"http://h/m.safetensors", Source{Kind: FromHTTP}},
		{"https://h/m.safetensors", Source{Kind: FromHTTP}},
		{"s3://bucket/runs/tiny/step-7", Source{Kind: FromS3}},
		{"s3://bucket/m.safetensors", Source{Kind: FromS3}},
		{"seed:3@examples/hf/qwen3-tiny.json", Source{Kind: FromSeed, Seed: 3, Config: "examples/hf/qwen3-tiny.json"}},
		{"seed:0@/etc/m/config.json", Source{Kind: FromSeed, Config: "/etc/m/config.json"}},
	} {
		tt.want.URL = tt.url
		if got, err := ParseSource(tt.url); err != nil || got != tt.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", tt.url, got, err, tt.want)
		}
	}
	for _, url := range []string{"", "seed:", "seed:-1", "seed:+1", "seed:01", "seed:0x10", "seed:18446744073709551616",
		"seed: 1", "file://", "s3://bucket", "s3://bucket/", "s3:///key", "gs://bucket/m", "/var/lib/init.safetensors",
		"seed:1@", "seed:@c.json", "seed:01@c.json"} {
		if _, err := ParseSource(url); !errors.Is(err, ErrSource) {
			t.Errorf("ParseSource(%q) = %v, want ErrSource", url, err)
		}
	}
	if got := SeedConfigURL(42, "c.json"); got != "seed:42@c.json" {
		t.Errorf("SeedConfigURL(42, c.json) = %q", got)
	}
	if got := SeedURL(42); got != "seed:42" {
		t.Errorf("SeedURL(42) = %q", got)
	}
}
