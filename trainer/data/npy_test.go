package data

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeNpy writes tokens as a .npy file of layout l (numpy.save's version
// 1.0 header) and returns its path.
func writeNpy(t testing.TB, dir string, tokens []int64, l Layout) string {
	t.Helper()
	b := appendNpyHeader(nil, l, int64(len(tokens)))
	var order binary.AppendByteOrder = binary.LittleEndian
	if l.BigEndian {
		order = binary.BigEndian
	}
	for _, v := range tokens {
		switch l.Width {
		case 1:
			b = append(b, byte(v))
		case 2:
			b = order.AppendUint16(b, uint16(v))
		case 4:
			b = order.AppendUint32(b, uint32(v))
		case 8:
			b = order.AppendUint64(b, uint64(v))
		}
	}
	path := filepath.Join(dir, "tokens-"+l.String()[1:]+".npy")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The header table in npy.go: magic, version, u16 length, a dict padded to
// 64 bytes and ended by a newline, as numpy.save writes it.
func TestNpyHeaderLayout(t *testing.T) {
	b := appendNpyHeader(nil, Layout{Width: 2}, 1000)
	want := "\x93NUMPY\x01\x00\x76\x00{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }" + strings.Repeat(" ", 57) + "\n"
	if string(b) != want {
		t.Fatalf("header %q,\nwant   %q", b, want)
	}
	if len(b)%64 != 0 || b[len(b)-1] != '\n' || int(binary.LittleEndian.Uint16(b[8:10])) != len(b)-10 {
		t.Fatalf("header of %d bytes, length field %d", len(b), binary.LittleEndian.Uint16(b[8:10]))
	}
}

// Every integer dtype reads back the same tokens, from disk and over HTTP.
func TestOpenNpy(t *testing.T) {
	dir := t.TempDir()
	tokens := make([]int64, 200)
	for i := range tokens {
		tokens[i] = int64(i)
	}
	for _, descr := range []string{"<u2", "<u4", "<i4", "<i8", "<u8", "<i2", ">u2", ">i8", "|u1", "|i1"} {
		t.Run(descr, func(t *testing.T) {
			l, err := parseDescr(descr)
			if err != nil {
				t.Fatal(err)
			}
			toks := tokens
			if l.Width == 1 {
				toks = tokens[:100] // fits an int8
			}
			path := writeNpy(t, dir, toks, l)
			content, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(serveBytes(content))
			t.Cleanup(srv.Close)
			for _, loc := range []string{path, "file://" + path, srv.URL + "/data/tokens.npy", srv.URL + "/tokens.NPY?sig=x"} {
				p := openProvider(t, loc, 2, 9, WithVocabSize(1000))
				if p.NumTokens() != uint64(len(toks)) || p.TokenSize() != l.Width || p.Layout().Offset != 128 {
					t.Fatalf("%s: %d tokens of %d bytes at %d", loc, p.NumTokens(), p.TokenSize(), p.Layout().Offset)
				}
				for d := range p.NumSequences() {
					seq, err := p.Sequence(context.Background(), d, nil)
					if err != nil {
						t.Fatal(err)
					}
					for i, v := range seq {
						if int64(v) != toks[d*9+uint64(i)] {
							t.Fatalf("%s: sequence %d: %v", loc, d, seq)
						}
					}
				}
			}
		})
	}
}

// A nanoGPT .bin (numpy's tofile of a uint16 array: no header) is read like
// our token files, at the run's token size.
func TestOpenNanoGPTBin(t *testing.T) {
	var b []byte
	for i := range 100 {
		b = binary.LittleEndian.AppendUint16(b, uint16(50000+i))
	}
	path := filepath.Join(t.TempDir(), "train.bin")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := openProvider(t, path, 2, 10, WithVocabSize(50304))
	seq, err := p.Sequence(context.Background(), 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if seq[0] != 50010 || len(seq) != 11 {
		t.Fatalf("sequence 1: %v", seq)
	}
	if _, err := Open(context.Background(), path, 2, 10, WithVocabSize(50050)); !errors.Is(err, ErrTokenRange) {
		t.Fatalf("vocabulary 50050: %v", err)
	}
}

func TestNpyBadTokens(t *testing.T) {
	dir := t.TempDir()
	neg := writeNpy(t, dir, []int64{1, 2, -1, 4, 5, 6}, Layout{Width: 8, Signed: true})
	_, err := Open(context.Background(), neg, 2, 2)
	if !errors.Is(err, ErrTokenRange) || !strings.Contains(err.Error(), "token 2 of the file (<i8): token -1") || !strings.Contains(err.Error(), neg) {
		t.Fatalf("negative token: %v", err)
	}
	big := writeNpy(t, dir, []int64{1, 2, 3, 1 << 40, 5, 6}, Layout{Width: 8})
	if _, err := Open(context.Background(), big, 2, 2); !errors.Is(err, ErrTokenRange) {
		t.Fatalf("token above 2^32: %v", err)
	}
	vocab := writeNpy(t, dir, []int64{1, 2, 3, 128256, 5, 6}, Layout{Width: 4})
	if _, err := Open(context.Background(), vocab, 4, 2, WithVocabSize(128256)); !errors.Is(err, ErrTokenRange) || !strings.Contains(err.Error(), "model.vocab_size") {
		t.Fatalf("token outside the vocabulary: %v", err)
	}
}

// Malformed headers fail with ErrNpyHeader naming the file and the field.
func TestNpyHeaderErrors(t *testing.T) {
	good := appendNpyHeader(nil, Layout{Width: 2}, 4)
	withHeader := func(h string) []byte {
		b := append([]byte(npyMagic), 1, 0)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
		return append(append(b, h...), make([]byte, 8)...)
	}
	tests := []struct {
		name string
		file []byte
		msg  string
	}{
		{"no magic", append([]byte("NUMPY\x93"), good[6:]...), "not a .npy file"},
		{"version 4", append(append([]byte(npyMagic), 4, 0), good[8:]...), "version 4.0"},
		{"float dtype", withHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n"), "descr: \"<f4\" is not an integer dtype"},
		{"native order", withHeader("{'descr': '=u2', 'fortran_order': False, 'shape': (4,), }\n"), "byte order must be"},
		{"structured dtype", withHeader("{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (4,), }\n"), "expected a string"},
		{"fortran order", withHeader("{'descr': '<u2', 'fortran_order': True, 'shape': (4,), }\n"), "fortran_order: must be False"},
		{"2-D", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }\n"), "shape: must be 1-D"},
		{"scalar", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (), }\n"), "shape: must be 1-D"},
		{"not a tuple", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (4), }\n"), "not a tuple"},
		{"missing key", withHeader("{'descr': '<u2', 'shape': (4,), }\n"), `no "fortran_order"`},
		{"extra key", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'x': 'y'}\n"), "keys other than"},
		{"wrong length", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }\n"), "needs 10 bytes of data after the header, the file has 8"},
		{"header past the end", append(append([]byte(npyMagic), 1, 0, 0xff, 0x7f), "{}"...), "runs past the end"},
		{"trailing text", withHeader("{'descr': '<u2', 'fortran_order': False, 'shape': (4,), } x\n"), "text after the header dict"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".npy")
			if err := os.WriteFile(path, tc.file, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Open(context.Background(), path, 2, 1)
			if !errors.Is(err, ErrNpyHeader) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), path) {
				t.Fatalf("got %v, want ErrNpyHeader with %q and the path", err, tc.msg)
			}
		})
	}
}

// FuzzNpyHeader feeds arbitrary bytes to the .npy header decoder with its
// production limit (npyMaxHeaderLen): it must not panic, and a header it
// accepts must say the same after being written again by appendNpyHeader.
func FuzzNpyHeader(f *testing.F) {
	f.Add(appendNpyHeader(nil, Layout{Width: 2}, 1000))
	f.Add(appendNpyHeader(nil, Layout{Width: 8, Signed: true, BigEndian: true}, 3))
	v2 := append([]byte(npyMagic), 2, 0)
	v2 = binary.LittleEndian.AppendUint32(v2, 60)
	f.Add(append(v2, "{\"descr\":\"<i4\",\"fortran_order\":False,\"shape\":(7L,)}"...))
	golden, _ := filepath.Glob("testdata/*.npy")
	for _, path := range golden {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		hlen, start, err := parseNpyPrefix(b[:min(len(b), npyPrefixV2)])
		if err != nil {
			return
		}
		if hlen > npyMaxHeaderLen {
			t.Fatalf("header length %d over the limit", hlen)
		}
		if start+hlen > len(b) {
			return
		}
		l, err := parseNpyHeader(b[start : start+hlen])
		if err != nil {
			return
		}
		again := appendNpyHeader(nil, l, l.Count)
		l2, err := parseNpyHeader(again[npyPrefixV1:])
		if err != nil || l2 != l {
			t.Fatalf("%+v written as %q reads back as %+v, %v", l, again, l2, err)
		}
		// The whole file path: a source of these bytes never panics.
		_, _ = readNpyLayout(context.Background(), NewBytesSource(b), "fuzz.npy")
	})
}

func TestNpyLocationDetection(t *testing.T) {
	for loc, want := range map[string]bool{
		"train.npy": true, "/d/train.NPY": true, "https://h/x.npy?sig=1": true, "train.bin": false, "x.npy.bin": false, "builtin:opticks": false,
	} {
		if isNpy(loc) != want {
			t.Errorf("isNpy(%q) = %v", loc, !want)
		}
	}
}

// Files written by NumPy 1.24.2 (Debian's python3-numpy), an implementation
// we did not write:
//
//	np.save("numpy-u2.npy", np.arange(50, dtype=np.uint16) * 1000)
//	np.save("numpy-i8.npy", np.arange(50, dtype=np.int64) * 100000)
//	np.save("numpy-u4-big-endian.npy", (np.arange(50, dtype=np.uint32) * 3000).astype(">u4"))
//	np.lib.format.write_array(open("numpy-i4-v2.npy", "wb"), np.arange(50, dtype=np.int32) * 7, version=(2, 0))
//	np.lib.format.write_array(open("numpy-u2-v3.npy", "wb"), np.arange(50, dtype=np.uint16), version=(3, 0))
//	(np.arange(50, dtype=np.uint16) * 1000).tofile("nanogpt-u2.bin")  # nanoGPT's prepare.py
//	np.save("numpy-f4.npy", np.arange(50, dtype=np.float32))
//	np.save("numpy-2d.npy", np.zeros((5, 10), dtype=np.uint16))
//	np.save("numpy-fortran.npy", np.asfortranarray(np.zeros((5, 10), dtype=np.uint16)))
func TestNumpyGoldenFiles(t *testing.T) {
	for _, tc := range []struct {
		file  string
		step  uint32
		width int
	}{
		{"numpy-u2.npy", 1000, 2},
		{"numpy-i8.npy", 100000, 8},
		{"numpy-u4-big-endian.npy", 3000, 4},
		{"numpy-i4-v2.npy", 7, 4},
		{"numpy-u2-v3.npy", 1, 2},
		{"nanogpt-u2.bin", 1000, 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			p := openProvider(t, filepath.Join("testdata", tc.file), 2, 7, WithVocabSize(5_000_000))
			if p.NumTokens() != 50 || p.TokenSize() != tc.width {
				t.Fatalf("%d tokens of %d bytes", p.NumTokens(), p.TokenSize())
			}
			for d := range p.NumSequences() {
				seq, err := p.Sequence(context.Background(), d, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range seq {
					if want := uint32(d*7+uint64(i)) * tc.step; v != want {
						t.Fatalf("sequence %d token %d: %d, want %d", d, i, v, want)
					}
				}
			}
		})
	}
	for file, msg := range map[string]string{
		"numpy-f4.npy":      `descr: "<f4" is not an integer dtype`,
		"numpy-2d.npy":      "shape: must be 1-D, (N,), got [5 10]",
		"numpy-fortran.npy": "fortran_order: must be False",
	} {
		_, err := Open(context.Background(), filepath.Join("testdata", file), 2, 7)
		if !errors.Is(err, ErrNpyHeader) || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: got %v, want %q", file, err, msg)
		}
	}
}
