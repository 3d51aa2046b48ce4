package runmodel

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/kernels"
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
	Path string // FromFile: the path after file://
	URL  string // the URL as the run records it
}

// ErrSource means a checkpoint URL names no source a trainer can load.
var ErrSource = errors.New("runmodel: unsupported checkpoint source (seed:N, file://, http(s):// and s3:// are)")

const seedPrefix = "seed:"

// SeedURL is the checkpoint URL of the model drawn from seed.
func SeedURL(seed uint64) string { return seedPrefix + strconv.FormatUint(seed, 10) }

// ParseSource reads a run's checkpoint URL: "seed:N" (N a decimal uint64),
// "file:///path", "http(s)://..." or "s3://bucket/key". Anything else wraps ErrSource. It is
// the one reading of these URLs: the node loads by it, and the commands
// that check or build a run's model use it too.
func ParseSource(url string) (Source, error) {
	if n, ok := strings.CutPrefix(url, seedPrefix); ok {
		// Only the canonical decimal form, so one model has one URL.
		seed, err := strconv.ParseUint(n, 10, 64)
		if err != nil || strconv.FormatUint(seed, 10) != n {
			return Source{}, fmt.Errorf("%w: %q: the seed must be a decimal integer below 2^64 with no sign or leading zeros", ErrSource, url)
		}
		return Source{Kind: FromSeed, Seed: seed, URL: url}, nil
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

// Init builds the run's model with the initial weights drawn from seed
// (the architecture's initialiser, which depends on the config and the seed
// only).
func Init(m *coordinator.Model, seed uint64, be kernels.Backend) (Model, error) {
	cfg, err := ModelConfig(m)
	if err != nil {
		return nil, err
	}
	return New(cfg, seed, be)
}

// revisionLen is the hex digits of a model hash in a run's revision: they
// fill the account's 32-byte field, so a revision holds the first 16 bytes
// of the SHA-256 (128 bits: no one finds another model with the same ones).
const revisionLen = coordinator.RevisionLen

// Revision is what a run records as the revision of model: the first 16
// bytes of its hash (Model.Hash) as 32 lowercase hex digits.
func Revision(model Model) string {
	sum := model.Hash()
	return hex.EncodeToString(sum[:revisionLen/2])
}

// IsHash reports whether a run's revision is a model hash (exactly 32
// lowercase hex digits), which trainers check, rather than a free label
// (empty, "v1", a commit name), which they do not.
func IsHash(revision string) bool {
	if len(revision) != revisionLen {
		return false
	}
	for _, c := range revision {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ErrRevision means a loaded model is not the one the run records.
var ErrRevision = errors.New("runmodel: the model's hash is not the run's revision")

// RevisionError is a model whose hash differs from the run's revision. It
// matches ErrRevision.
type RevisionError struct {
	From      string // where the model came from
	Got, Want string // its revision, and the run's
}

func (e *RevisionError) Error() string {
	return fmt.Sprintf("the model from %s has hash %s, the run records %s", e.From, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrRevision) hold.
func (e *RevisionError) Is(target error) bool { return target == ErrRevision }

// CheckRevision applies the run's revision rule to a model loaded from the
// run's checkpoint URL from: a revision that is a hash (IsHash) must be the
// model's (a *RevisionError otherwise); any other revision is a label and
// is not checked.
func CheckRevision(model Model, from, revision string) error {
	if !IsHash(revision) {
		return nil
	}
	if got := Revision(model); got != revision {
		return &RevisionError{From: from, Got: got, Want: revision}
	}
	return nil
}
