package tokenizer

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is a BPE model: a vocabulary and ranked merges over token ids.
type bpe struct {
	// vocab maps a token's text to its id. For a byte-level model the text
	// is the token's raw bytes (the vocabulary's printable characters
	// mapped back), so words are merged as bytes and never remapped.
	vocab map[string]uint32
	// merges maps a pair of ids (left<<32 | right) to its rank and result.
	merges    map[uint64]merge
	byteLevel bool // initial symbols are bytes, not characters
	// ignoreMerges: a word that is itself in the vocabulary is one token.
	ignoreMerges bool
	byteFallback bool       // unknown characters become <0xNN> byte tokens
	byteIDs      [256]int64 // the <0xNN> ids; -1 where absent
	unk          int64      // the unk token's id; -1 when there is none
	fuseUnk      bool       // consecutive unknown characters make one unk
	// splitAtMeta: no token holds "▁" after another character, so no merge
	// crosses the start of a "▁" that follows another character, and a
	// word (Llama 2's whole text) can be merged piece by piece.
	splitAtMeta bool

	mu    sync.Mutex
	cache map[string][]uint32
}

type merge struct {
	rank   uint32
	result uint32
}

// Cache bounds: words longer than cacheMaxWord bytes are not cached, and the
// cache is emptied when it reaches cacheMaxEntries words.
const (
	cacheMaxWord    = 256
	cacheMaxEntries = 1 << 16
)

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// symbol is one element of the word being merged: its id (-1 when the
// vocabulary lacks it), the byte range of the word it covers, and the
// doubly linked list of live symbols.
type symbol struct {
	id         int64
	start, end int32
	prev, next int32 // -1 at the ends
}

// candidate is a possible merge of the live symbol at pos with the next one,
// valid while both still carry the ids it was made with.
type candidate struct {
	rank        uint32
	pos         int32
	left, right uint32
}

func (c candidate) before(d candidate) bool {
	return c.rank < d.rank || (c.rank == d.rank && c.pos < d.pos)
}

// candidateHeap is a binary min-heap by (rank, pos): the lowest rank merges
// first and, among equal ranks, the leftmost.
type candidateHeap []candidate

func (h *candidateHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candidateHeap) pop() candidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].before(s[m]) {
			m = l
		}
		if r < len(s) && s[r].before(s[m]) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// encodeWord appends the ids of one pre-tokenized word to dst.
func (m *bpe) encodeWord(dst []uint32, word string) ([]uint32, error) {
	if word == "" {
		return dst, nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id), nil
		}
	}
	if !m.splitAtMeta {
		return m.encodeChunk(dst, word)
	}
	var err error
	start := 0
	for i := 1; i < len(word); i++ {
		if strings.HasPrefix(word[i:], meta) && !strings.HasSuffix(word[:i], meta) {
			if dst, err = m.encodeChunk(dst, word[start:i]); err != nil {
				return dst, err
			}
			start = i
		}
	}
	return m.encodeChunk(dst, word[start:])
}

// meta is SentencePiece's word boundary, "▁" (U+2581).
const meta = "\u2581"

// encodeChunk appends the ids of a piece of a word, from the cache when it
// is there.
func (m *bpe) encodeChunk(dst []uint32, word string) ([]uint32, error) {
	if len(word) <= cacheMaxWord {
		m.mu.Lock()
		ids, ok := m.cache[word]
		m.mu.Unlock()
		if ok {
			return append(dst, ids...), nil
		}
	}
	start := len(dst)
	dst, err := m.merge(dst, word)
	if err != nil {
		return dst, err
	}
	if len(word) <= cacheMaxWord {
		ids := append([]uint32(nil), dst[start:]...)
		m.mu.Lock()
		if len(m.cache) >= cacheMaxEntries {
			clear(m.cache)
		}
		m.cache[word] = ids
		m.mu.Unlock()
	}
	return dst, nil
}

// merge splits word into its initial symbols (bytes or characters), applies
// the merges by rank and appends the resulting ids.
func (m *bpe) merge(dst []uint32, word string) ([]uint32, error) {
	syms := make([]symbol, 0, len(word))
	for i := 0; i < len(word); {
		n := 1
		if !m.byteLevel {
			if _, size := utf8.DecodeRuneInString(word[i:]); size > 0 {
				n = size
			}
		}
		id := int64(-1)
		if v, ok := m.vocab[word[i:i+n]]; ok {
			id = int64(v)
		}
		k := int32(len(syms))
		syms = append(syms, symbol{id: id, start: int32(i), end: int32(i + n), prev: k - 1, next: k + 1})
		i += n
	}
	syms[len(syms)-1].next = -1

	var heap candidateHeap
	consider := func(pos int32) {
		l := syms[pos]
		if l.next < 0 || l.id < 0 {
			return
		}
		r := syms[l.next]
		if r.id < 0 {
			return
		}
		if mg, ok := m.merges[pairKey(uint32(l.id), uint32(r.id))]; ok {
			heap.push(candidate{rank: mg.rank, pos: pos, left: uint32(l.id), right: uint32(r.id)})
		}
	}
	for i := range syms {
		consider(int32(i))
	}
	for len(heap) > 0 {
		c := heap.pop()
		l := &syms[c.pos]
		if l.id != int64(c.left) || l.next < 0 || syms[l.next].id != int64(c.right) {
			continue // stale: one side has merged since
		}
		r := &syms[l.next]
		l.id = int64(m.merges[pairKey(c.left, c.right)].result)
		l.end = r.end
		l.next = r.next
		r.id = -2 // dead
		if l.next >= 0 {
			syms[l.next].prev = c.pos
		}
		if l.prev >= 0 {
			consider(l.prev)
		}
		consider(c.pos)
	}
	return m.emit(dst, word, syms)
}

// emit appends the ids of the live symbols, resolving unknown ones by byte
// fallback or the unk token.
func (m *bpe) emit(dst []uint32, word string, syms []symbol) ([]uint32, error) {
	lastUnk := false
	for i := int32(0); i >= 0; i = syms[i].next {
		s := syms[i]
		if s.id >= 0 {
			dst = append(dst, uint32(s.id))
			lastUnk = false
			continue
		}
		text := word[s.start:s.end]
		if m.byteFallback && m.haveBytes(text) {
			for j := 0; j < len(text); j++ {
				dst = append(dst, uint32(m.byteIDs[text[j]]))
			}
			lastUnk = false
			continue
		}
		if m.unk < 0 {
			return dst, &unknownError{text: text}
		}
		if !(m.fuseUnk && lastUnk) {
			dst = append(dst, uint32(m.unk))
		}
		lastUnk = true
	}
	return dst, nil
}

func (m *bpe) haveBytes(text string) bool {
	for j := 0; j < len(text); j++ {
		if m.byteIDs[text[j]] < 0 {
			return false
		}
	}
	return true
}

// unknownError reports text the vocabulary cannot express.
type unknownError struct{ text string }

func (e *unknownError) Error() string {
	return "tokenizer: unknown token: " + truncate(quote(e.text)) + " is not in the vocabulary, which has no byte fallback and no unk token"
}

func (e *unknownError) Unwrap() error { return ErrUnknownToken }
