package data

import (
	"bytes"
	"errors"
	"testing"
)

func TestTokenizeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		text []byte
	}{
		{"empty", nil},
		{"ascii", []byte("Of the Reflexions, Refractions, Inflexions and Colours of Light.")},
		{"utf8", []byte("Phænomena")},
		{"every byte", func() []byte {
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}()},
		{"invalid utf8", []byte{0xff, 0xfe, 0x00, 0x80}},
		{"opticks", Opticks()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens := Tokenize(tc.text)
			if len(tokens) != len(tc.text) {
				t.Fatalf("%d tokens for %d bytes", len(tokens), len(tc.text))
			}
			for i, tok := range tokens {
				if tok != uint32(tc.text[i]) || tok >= ByteVocabSize {
					t.Fatalf("token %d = %d, byte %d", i, tok, tc.text[i])
				}
			}
			back, err := Detokenize(tokens)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, tc.text) {
				t.Fatal("round trip changed the text")
			}
		})
	}
}

func TestDetokenizeRejectsNonBytes(t *testing.T) {
	for _, tokens := range [][]uint32{{256}, {'a', 'b', 1000}, {1 << 31}} {
		_, err := Detokenize(tokens)
		if !errors.Is(err, ErrTokenRange) {
			t.Errorf("%v: err = %v, want ErrTokenRange", tokens, err)
		}
	}
}

func TestOpticksIsTheGutenbergText(t *testing.T) {
	text := Opticks()
	if len(text) != 567198 {
		t.Errorf("corpus has %d bytes, want 567198", len(text))
	}
	for _, want := range []string{"Online Distributed Proofreading Team", "OPTICKS:", "Sir _ISAAC NEWTON_"} {
		if !bytes.Contains(text[:1024], []byte(want)) {
			t.Errorf("corpus opening lacks %q", want)
		}
	}
	text[0] = 'X'
	if Opticks()[0] == 'X' {
		t.Error("Opticks returned shared memory")
	}
}
