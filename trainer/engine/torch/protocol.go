package torch

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// What psyche and its worker share lives in worker/protocol.json, which
// both read: the worker's protocol.py at import, this file at init. Neither
// side writes a copy of a value that file holds.
//
//go:embed worker/protocol.json
var protocolJSON []byte

type protocolSpec struct {
	Version         int               `json:"version"`
	MinTorch        string            `json:"min_torch"`
	DefaultTimeoutS float64           `json:"default_timeout_s"`
	LogPrefix       string            `json:"log_prefix"`
	Kinds           map[string]string `json:"kinds"` // an error kind and what it means
	Ops             map[string]string `json:"ops"`   // a request's op and what it does
}

// errorKind is a failed answer's "kind": one of protocol.json's kinds.
type errorKind string

// The kinds psyche acts on; the worker may answer any kind the file
// declares (kindInternal and any other: a fault of the worker).
const (
	kindOOM       errorKind = "oom"
	kindNonFinite errorKind = "nonfinite"
	kindInput     errorKind = "input"
	kindInternal  errorKind = "internal"
	kindMissing   errorKind = "missing"
	// kindRank: a rank of a multi-device worker stopped or a collective
	// failed, and the worker ended. Sent as the answer to the request in
	// flight, or unasked as the last message on the pipe.
	kindRank errorKind = "rank"
)

var goKinds = []errorKind{kindOOM, kindNonFinite, kindInput, kindInternal, kindMissing, kindRank}

var (
	protocol = mustProtocol(protocolJSON)

	// protocolVersion changes with either side's format. The worker
	// refuses a psyche of another version (the two ship in one binary, so
	// only a stale worker directory could differ).
	protocolVersion = protocol.Version
	// MinTorch is the oldest torch the worker runs on.
	MinTorch = protocol.MinTorch
	// defaultTimeout bounds one computation when the spec gives none.
	defaultTimeout = time.Duration(protocol.DefaultTimeoutS * float64(time.Second))
	// logPrefix begins the worker's lines that psyche logs at info level.
	logPrefix = protocol.LogPrefix
)

// mustProtocol reads the embedded file; it is part of the binary, so a
// file that does not name what this side uses is a build fault, and the
// package's tests fail on it.
func mustProtocol(b []byte) protocolSpec {
	p, err := parseProtocol(b)
	if err != nil {
		panic(err)
	}
	return p
}

func parseProtocol(b []byte) (protocolSpec, error) {
	var p protocolSpec
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("torch engine: worker/protocol.json: %w", err)
	}
	if p.Version <= 0 || p.MinTorch == "" || p.DefaultTimeoutS <= 0 || p.LogPrefix == "" {
		return p, fmt.Errorf("torch engine: worker/protocol.json lacks a version, min_torch, default_timeout_s or log_prefix")
	}
	declared := slices.Sorted(maps.Keys(p.Kinds))
	if ours := sortedNames(goKinds); !slices.Equal(declared, ours) {
		return p, fmt.Errorf("torch engine: worker/protocol.json declares the error kinds %v, psyche knows %v", declared, ours)
	}
	if ops, sent := slices.Sorted(maps.Keys(p.Ops)), sortedNames(goOps); !slices.Equal(ops, sent) {
		return p, fmt.Errorf("torch engine: worker/protocol.json declares the ops %v, psyche sends %v", ops, sent)
	}
	return p, nil
}

// sortedNames are the error kinds or ops psyche knows as sorted strings,
// to be compared with what protocol.json declares.
func sortedNames[T ~string](names []T) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, string(n))
	}
	slices.Sort(out)
	return out
}
