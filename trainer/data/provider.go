package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync"
)

// Provider maps data indices to training sequences of a token file. It is
// safe for concurrent use.
type Provider struct {
	src       Source
	tokenSize int
	seqLen    int
	numTokens uint64
	numSeqs   uint64
	perm      *permutation // nil: file order
	vocabSize uint32       // 0: tokens are not checked
	log       *slog.Logger
	bufs      sync.Pool // *[]byte of (seqLen+1)·tokenSize bytes
}

// NewProvider returns a Provider over src, whose bytes are tokens of
// tokenSize bytes (2 or 4), cut into sequences of seqLen+1 tokens. It asks
// src for its size, and fails if that is not a whole number of tokens
// (ErrMisaligned) or too short for one sequence (ErrTooShort). The Provider
// owns src: Close closes it.
func NewProvider(ctx context.Context, src Source, tokenSize, seqLen int, opts ...Option) (*Provider, error) {
	if src == nil {
		return nil, errors.New("data: nil Source")
	}
	if err := checkShape(tokenSize, seqLen); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newProvider(ctx, src, tokenSize, seqLen, cfg)
}

// Open returns a Provider over the token file at location: an http:// or
// https:// URL (read with range requests), a file:// URL, a local path, or a
// corpus built into the trainer ("builtin:opticks", tokenized with the byte
// tokenizer at tokenSize bytes per token). Options configure both the
// Provider and its source.
func Open(ctx context.Context, location string, tokenSize, seqLen int, opts ...Option) (*Provider, error) {
	if err := checkShape(tokenSize, seqLen); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	src, err := openSource(ctx, location, tokenSize, cfg)
	if err != nil {
		return nil, err
	}
	p, err := newProvider(ctx, src, tokenSize, seqLen, cfg)
	if err != nil {
		src.Close()
		return nil, err
	}
	return p, nil
}

// OpenSource returns the Source for location, as Open would pick it. The
// token size matters only to a built-in corpus, whose bytes are encoded at
// that size; a file's bytes are what they are.
func OpenSource(ctx context.Context, location string, tokenSize int, opts ...Option) (Source, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return openSource(ctx, location, tokenSize, cfg)
}

func openSource(ctx context.Context, location string, tokenSize int, cfg *config) (Source, error) {
	if name, ok := strings.CutPrefix(location, BuiltinPrefix); ok {
		if err := checkTokenSize(tokenSize); err != nil {
			return nil, err
		}
		return openBuiltin(name, tokenSize)
	}
	scheme, _, isURL := strings.Cut(location, "://")
	if !isURL {
		return openFileSource(ctx, location)
	}
	switch strings.ToLower(scheme) {
	case "http", "https":
		return newHTTPSource(location, cfg)
	case "file":
		path, err := fileURLPath(location)
		if err != nil {
			return nil, err
		}
		return openFileSource(ctx, path)
	}
	return nil, fmt.Errorf("data: unsupported location scheme %q: use an http(s):// or file:// URL, a local path or %s%s", scheme, BuiltinPrefix, Builtins()[0])
}

func openFileSource(ctx context.Context, path string) (Source, error) {
	s, err := OpenFileSource(ctx, path)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// fileURLPath returns the local path of a file:// URL; only file:///path and
// file://localhost/path name local files.
func fileURLPath(location string) (string, error) {
	u, err := url.Parse(location)
	if err != nil {
		return "", fmt.Errorf("data: bad file URL %q: %w", location, err)
	}
	if u.Host != "" && u.Host != "localhost" {
		return "", fmt.Errorf("data: file URL %q names host %q: only local files (file:///path) can be read", location, u.Host)
	}
	if u.Path == "" {
		return "", fmt.Errorf("data: file URL %q has no path", location)
	}
	return u.Path, nil
}

// checkShape validates the arguments that need no I/O.
func checkShape(tokenSize, seqLen int) error {
	if err := checkTokenSize(tokenSize); err != nil {
		return err
	}
	if seqLen <= 0 {
		return fmt.Errorf("data: sequence length must be positive, got %d", seqLen)
	}
	// One sequence must fit in a byte slice.
	if uint64(seqLen)+1 > math.MaxInt/uint64(tokenSize) {
		return fmt.Errorf("data: sequence length %d is too long", seqLen)
	}
	return nil
}

func newProvider(ctx context.Context, src Source, tokenSize, seqLen int, cfg *config) (*Provider, error) {
	size, err := src.Size(ctx)
	if err != nil {
		return nil, err
	}
	name := describe(src)
	if size%int64(tokenSize) != 0 {
		return nil, fmt.Errorf("%w: %s has %d bytes, not a whole number of %d-byte tokens", ErrMisaligned, name, size, tokenSize)
	}
	numTokens := uint64(size) / uint64(tokenSize)
	if numTokens < uint64(seqLen)+1 {
		return nil, fmt.Errorf("%w: %s holds %d tokens, and one sequence of length %d needs %d",
			ErrTooShort, name, numTokens, seqLen, seqLen+1)
	}
	p := &Provider{
		src:       src,
		tokenSize: tokenSize,
		seqLen:    seqLen,
		numTokens: numTokens,
		numSeqs:   (numTokens - 1) / uint64(seqLen),
		vocabSize: cfg.vocabSize,
		log:       cfg.logger,
	}
	if cfg.shuffle {
		p.perm = newPermutation(p.numSeqs, cfg.seed)
	}
	bufLen := (seqLen + 1) * tokenSize
	p.bufs.New = func() any {
		b := make([]byte, bufLen)
		return &b
	}
	p.log.Debug("data: provider open", "source", name, "tokens", numTokens, "token_size", tokenSize,
		"seq_len", seqLen, "sequences", p.numSeqs, "shuffled", cfg.shuffle)
	return p, nil
}

// describe names a source for errors.
func describe(src Source) string {
	if s, ok := src.(fmt.Stringer); ok {
		return s.String()
	}
	return "the token file"
}

// NumTokens returns the number of tokens in the file.
func (p *Provider) NumTokens() uint64 { return p.numTokens }

// NumSequences returns N, the number of distinct sequences: data indices
// repeat with period N.
func (p *Provider) NumSequences() uint64 { return p.numSeqs }

// SeqLen returns the sequence length; Sequence returns SeqLen()+1 tokens.
func (p *Provider) SeqLen() int { return p.seqLen }

// TokenSize returns the bytes per token of the file.
func (p *Provider) TokenSize() int { return p.tokenSize }

// SequenceIndex returns the sequence that data index d maps to:
// perm(d mod N), in [0, NumSequences()).
func (p *Provider) SequenceIndex(d uint64) uint64 {
	i := d % p.numSeqs
	if p.perm != nil {
		i = p.perm.at(i)
	}
	return i
}

// Sequence reads the sequence for data index d: SeqLen()+1 tokens, the
// inputs followed by the last target, so inputs are s[:SeqLen()] and targets
// s[1:]. The tokens are written to dst[:SeqLen()+1], which is reallocated
// only if dst's capacity is too small, and that slice is returned. With
// WithVocabSize, a token outside the vocabulary fails with ErrTokenRange.
func (p *Provider) Sequence(ctx context.Context, d uint64, dst []uint32) ([]uint32, error) {
	seq := p.SequenceIndex(d)
	bufp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bufp)
	buf := *bufp
	off := int64(seq) * int64(p.seqLen) * int64(p.tokenSize)
	if err := p.src.ReadAt(ctx, buf, off); err != nil {
		return nil, wrapf(err, "sequence %d (data index %d)", seq, d)
	}
	n := p.seqLen + 1
	if cap(dst) < n {
		dst = make([]uint32, n)
	}
	dst = decodeInto(dst[:n], buf, p.tokenSize)
	if p.vocabSize > 0 {
		for i, t := range dst {
			if t >= p.vocabSize {
				return nil, fmt.Errorf("%w: token %d at position %d of sequence %d (data index %d) is not below the vocabulary size %d",
					ErrTokenRange, t, i, seq, d, p.vocabSize)
			}
		}
	}
	return dst, nil
}

// Close closes the source.
func (p *Provider) Close() error { return p.src.Close() }
