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
	layout    Layout
	name      string // the source, for errors
	seqLen    int
	numTokens uint64
	numSeqs   uint64
	perm      *permutation // nil: file order
	vocabSize uint32       // 0: tokens are not checked
	log       *slog.Logger
	bufs      sync.Pool // *[]byte of (seqLen+1)·layout.Width bytes
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
	return newProvider(ctx, src, FlatLayout(tokenSize), seqLen, cfg)
}

// NewProviderLayout is NewProvider for tokens stored as layout says (a
// .npy file's data, for instance).
func NewProviderLayout(ctx context.Context, src Source, layout Layout, seqLen int, opts ...Option) (*Provider, error) {
	if src == nil {
		return nil, errors.New("data: nil Source")
	}
	if err := layout.check(); err != nil {
		return nil, err
	}
	if err := checkShape(layout.Width, seqLen); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newProvider(ctx, src, layout, seqLen, cfg)
}

// Open returns a Provider over the token file at location: an http:// or
// https:// URL (read with range requests), a "server:PATH" file of the run's
// coordinator server (WithServerURL), an s3://bucket/key object
// (WithObjectOpener), a file:// URL, a local path, or a
// corpus built into the trainer ("builtin:opticks", tokenized with the byte
// tokenizer at tokenSize bytes per token). Options configure both the
// Provider and its source.
//
// A location whose path ends in ".npy" is a NumPy array, whose header gives
// the tokens' dtype and number (tokenSize is not used); any other file is a
// flat array of tokenSize-byte little-endian tokens: our token files and
// nanoGPT's .bin files alike. See Layout.
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
	layout := FlatLayout(tokenSize)
	if isNpy(location) {
		if layout, err = readNpyLayout(ctx, src, describe(src)); err != nil {
			src.Close()
			return nil, err
		}
	}
	p, err := newProvider(ctx, src, layout, seqLen, cfg)
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
	if path, ok, err := ServerPath(location); ok {
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if cfg.serverURL == "" {
			return nil, fmt.Errorf("data: %q names a file of the run's coordinator server, and this trainer talks to none (a Solana run): the run's data must be an http(s):// or s3:// URL, a local path or %s%s",
				location, BuiltinPrefix, Builtins()[0])
		}
		u, err := ServerDataURL(cfg.serverURL, path)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		return newHTTPSource(u, cfg)
	}
	scheme, _, isURL := strings.Cut(location, "://")
	if !isURL {
		return openFileSource(ctx, location)
	}
	switch strings.ToLower(scheme) {
	case "http", "https":
		return newHTTPSource(location, cfg)
	case "s3":
		if _, _, err := ParseS3(location); err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if cfg.openObject == nil {
			return nil, fmt.Errorf("data: %q is read through a trainer's checkpoint store client, which was not given (WithObjectOpener)", location)
		}
		src, err := cfg.openObject(ctx, location)
		if err != nil {
			return nil, wrapf(err, "open %s", location)
		}
		return src, nil
	case "file":
		path, err := fileURLPath(location)
		if err != nil {
			return nil, err
		}
		return openFileSource(ctx, path)
	}
	return nil, fmt.Errorf("data: unsupported location scheme %q: use an http(s)://, s3:// or file:// URL, %sPATH, a local path or %s%s", scheme, ServerPrefix, BuiltinPrefix, Builtins()[0])
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

func newProvider(ctx context.Context, src Source, layout Layout, seqLen int, cfg *config) (*Provider, error) {
	size, err := src.Size(ctx)
	if err != nil {
		return nil, err
	}
	name := describe(src)
	width := int64(layout.Width)
	numTokens := uint64(layout.Count)
	if layout.Count < 0 {
		data := size - layout.Offset
		if data < 0 || data%width != 0 {
			return nil, fmt.Errorf("%w: %s has %d bytes, not a whole number of %d-byte tokens", ErrMisaligned, name, size, width)
		}
		numTokens = uint64(data / width)
	} else if layout.Offset+layout.Count*width > size {
		return nil, fmt.Errorf("%w: %s: %d tokens of %d bytes after byte %d need %d bytes, the file has %d",
			ErrShortRead, name, layout.Count, width, layout.Offset, layout.Offset+layout.Count*width, size)
	}
	if numTokens < uint64(seqLen)+1 {
		return nil, fmt.Errorf("%w: %s holds %d tokens, and one sequence of length %d needs %d",
			ErrTooShort, name, numTokens, seqLen, seqLen+1)
	}
	p := &Provider{
		src:       src,
		layout:    layout,
		name:      name,
		seqLen:    seqLen,
		numTokens: numTokens,
		numSeqs:   (numTokens - 1) / uint64(seqLen),
		vocabSize: cfg.vocabSize,
		log:       cfg.logger,
	}
	if cfg.shuffle {
		p.perm = newPermutation(p.numSeqs, cfg.seed)
	}
	bufLen := (seqLen + 1) * layout.Width
	p.bufs.New = func() any {
		b := make([]byte, bufLen)
		return &b
	}
	switch src.(type) {
	case *FileSource, *BytesSource:
		// A local file is read whole once, so that a token the model
		// cannot embed fails now, before any training, rather than in
		// some later round. A remote one (http(s), the server's, a
		// bucket's) is checked sequence by sequence.
		if err := p.scan(ctx); err != nil {
			return nil, err
		}
	}
	p.log.Debug("data: provider open", "source", name, "tokens", numTokens, "layout", layout.String(),
		"seq_len", seqLen, "sequences", p.numSeqs, "shuffled", cfg.shuffle)
	return p, nil
}

// scanChunkTokens is how many tokens scan reads at a time.
const scanChunkTokens = 1 << 18

// scan reads every token once and checks it: it must fit 32 bits and, with
// WithVocabSize, be below the vocabulary size.
func (p *Provider) scan(ctx context.Context) error {
	if p.vocabSize == 0 && !p.layout.Signed && p.layout.Width <= 4 {
		return nil // nothing can be out of range
	}
	w := uint64(p.layout.Width)
	buf := make([]byte, min(p.numTokens, scanChunkTokens)*w)
	toks := make([]uint32, len(buf)/int(w))
	for start := uint64(0); start < p.numTokens; start += scanChunkTokens {
		n := min(p.numTokens-start, scanChunkTokens)
		b := buf[:n*w]
		if err := p.src.ReadAt(ctx, b, p.layout.Offset+int64(start*w)); err != nil {
			return wrapf(err, "checking the tokens of %s", p.name)
		}
		if i, err := p.layout.decode(toks, b); err != nil {
			return fmt.Errorf("%w: %s: token %d of the file (%s): %v", ErrTokenRange, p.name, start+uint64(i), p.layout, err)
		}
		if p.vocabSize == 0 {
			continue
		}
		for i, t := range toks[:n] {
			if t >= p.vocabSize {
				return fmt.Errorf("%w: %s: token %d of the file is %d, not below the run's vocabulary size %d (model.vocab_size)",
					ErrTokenRange, p.name, start+uint64(i), t, p.vocabSize)
			}
		}
	}
	return nil
}

// describe names a source for errors.
func describe(src Source) string {
	if s, ok := src.(fmt.Stringer); ok {
		return s.String()
	}
	return "the token file"
}

// Source names where the tokens are read from: the path, the URL (without
// its query) or the object.
func (p *Provider) Source() string { return p.name }

// NumTokens returns the number of tokens in the file.
func (p *Provider) NumTokens() uint64 { return p.numTokens }

// NumSequences returns N, the number of distinct sequences: data indices
// repeat with period N.
func (p *Provider) NumSequences() uint64 { return p.numSeqs }

// SeqLen returns the sequence length; Sequence returns SeqLen()+1 tokens.
func (p *Provider) SeqLen() int { return p.seqLen }

// TokenSize returns the bytes per token of the file.
func (p *Provider) TokenSize() int { return p.layout.Width }

// Layout returns how the file stores its tokens.
func (p *Provider) Layout() Layout { return p.layout }

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
	off := p.layout.Offset + int64(seq)*int64(p.seqLen)*int64(p.layout.Width)
	if err := p.src.ReadAt(ctx, buf, off); err != nil {
		return nil, wrapf(err, "sequence %d (data index %d)", seq, d)
	}
	n := p.seqLen + 1
	if cap(dst) < n {
		dst = make([]uint32, n)
	}
	dst = dst[:n]
	if i, err := p.layout.decode(dst, buf); err != nil {
		return nil, fmt.Errorf("%w: %s: position %d of sequence %d (data index %d): %v", ErrTokenRange, p.name, i, seq, d, err)
	}
	if p.vocabSize > 0 {
		for i, t := range dst {
			if t >= p.vocabSize {
				return nil, fmt.Errorf("%w: %s: token %d at position %d of sequence %d (data index %d) is not below the run's vocabulary size %d (model.vocab_size)",
					ErrTokenRange, p.name, t, i, seq, d, p.vocabSize)
			}
		}
	}
	return dst, nil
}

// Close closes the source.
func (p *Provider) Close() error { return p.src.Close() }
