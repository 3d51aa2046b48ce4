package modelspec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// SourceKind is where a run's checkpoint URL says its model comes from.
type SourceKind int

const (
	// FromSeed is fresh weights drawn from a seed ("seed:N"): nothing to
	// download, every trainer derives the same model.
	FromSeed SourceKind = iota + 1
	// FromFile is a checkpoint file on every trainer's machine ("file://").
	FromFile
	// FromHTTP is a checkpoint read over HTTP(S) with range requests.
	FromHTTP
	// FromS3 is a checkpoint in an S3-compatible bucket ("s3://bucket/key"),
	// read through the run's store settings (endpoint, region) with the
	// trainer's own credentials.
	FromS3
)

// Source is a parsed checkpoint URL.
type Source struct {
	Kind SourceKind
	Seed uint64 // FromSeed: N
	// Config is a Transformers run's config.json (FromSeed: the file after
	// "@" in seed:N@PATH, a path on every trainer; empty for GPT and Llama,
	// whose shape the account holds).
	Config string
	Path   string // FromFile: the path after file://
	URL    string // the URL as the run records it
}

// ErrSource means a checkpoint URL names no source a trainer can load.
var ErrSource = errors.New("modelspec: unsupported checkpoint source (seed:N, file://, http(s):// and s3:// are)")

const seedPrefix = "seed:"

// SeedURL is the checkpoint URL of the model drawn from seed.
func SeedURL(seed uint64) string { return seedPrefix + strconv.FormatUint(seed, 10) }

// SeedConfigURL is the checkpoint URL of the Transformers model described
// by the config.json at path, drawn from seed.
func SeedConfigURL(seed uint64, path string) string { return SeedURL(seed) + "@" + path }

// ParseSource reads a run's checkpoint URL: "seed:N" (N a decimal uint64;
// seed:N@PATH for a Transformers model described by the config.json at PATH),
// "file:///path", "http(s)://..." or "s3://bucket/key". Anything else wraps ErrSource. It is
// the one reading of these URLs: the node loads by it, and the commands
// that check or build a run's model use it too.
func ParseSource(url string) (Source, error) {
	if n, ok := strings.CutPrefix(url, seedPrefix); ok {
		n, config, hasConfig := strings.Cut(n, "@")
		if hasConfig && config == "" {
			return Source{}, fmt.Errorf("%w: %q names no config.json after @", ErrSource, url)
		}
		// Only the canonical decimal form, so one model has one URL.
		seed, err := strconv.ParseUint(n, 10, 64)
		if err != nil || strconv.FormatUint(seed, 10) != n {
			return Source{}, fmt.Errorf("%w: %q: the seed must be a decimal integer below 2^64 with no sign or leading zeros", ErrSource, url)
		}
		return Source{Kind: FromSeed, Seed: seed, Config: config, URL: url}, nil
	}
	if path, ok := strings.CutPrefix(url, "file://"); ok {
		if path == "" {
			return Source{}, fmt.Errorf("%w: %q has no path", ErrSource, url)
		}
		return Source{Kind: FromFile, Path: path, URL: url}, nil
	}
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		return Source{Kind: FromHTTP, URL: url}, nil
	}
	if rest, ok := strings.CutPrefix(url, "s3://"); ok {
		if bucket, key, _ := strings.Cut(rest, "/"); bucket == "" || key == "" {
			return Source{}, fmt.Errorf("%w: %q must name a bucket and an object or prefix (s3://bucket/key)", ErrSource, url)
		}
		return Source{Kind: FromS3, URL: url}, nil
	}
	return Source{}, fmt.Errorf("%w: %q", ErrSource, url)
}
