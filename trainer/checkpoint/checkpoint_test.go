package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// file builds checkpoint bytes from a header and a data section, with the
// header length set to len(header).
func file(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func f32bytes(vs ...float32) []byte {
	b := make([]byte, 4*len(vs))
	encodeF32(b, vs)
	return b
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

func randomTensors(r *rand.Rand, n int) []Tensor {
	ts := make([]Tensor, n)
	for i := range ts {
		shape := make([]int, r.IntN(4))
		numel := 1
		for j := range shape {
			shape[j] = r.IntN(5)
			numel *= shape[j]
		}
		data := make([]float32, numel)
		for j := range data {
			data[j] = float32(r.NormFloat64())
		}
		ts[i] = Tensor{Name: string(rune('a'+i%26)) + strings.Repeat("x", i/26) + ".w", Shape: shape, Data: data}
	}
	return ts
}

// sameTensors compares names, shapes and the bits of the data (so NaN
// payloads and the sign of zero count).
func sameTensors(t *testing.T, got, want []Tensor) {
	t.Helper()
	want = slices.Clone(want)
	slices.SortFunc(want, func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	if len(got) != len(want) {
		t.Fatalf("got %d tensors, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Name != w.Name || !slices.Equal(g.Shape, w.Shape) || len(g.Data) != len(w.Data) {
			t.Fatalf("tensor %d: got %q %v (%d values), want %q %v (%d values)", i, g.Name, g.Shape, len(g.Data), w.Name, w.Shape, len(w.Data))
		}
		for j := range g.Data {
			if math.Float32bits(g.Data[j]) != math.Float32bits(w.Data[j]) {
				t.Fatalf("tensor %q[%d] = %v, want %v", g.Name, j, g.Data[j], w.Data[j])
			}
		}
	}
}

func TestGoldenBytes(t *testing.T) {
	tensors := []Tensor{
		{Name: "b", Shape: []int{2}, Data: []float32{1, -2}},
		{Name: "a", Shape: nil, Data: []float32{0.5}}, // a scalar
	}
	got, err := Encode(tensors, map[string]string{"k": "v\n\"<>"})
	if err != nil {
		t.Fatal(err)
	}
	header := `{"__metadata__":{"k":"v\u000a\"<>"},` +
		`"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},` +
		`"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`
	for len(header)%8 != 0 {
		header += " "
	}
	want := file(header, f32bytes(0.5, 1, -2))
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode =\n%q\nwant\n%q", got, want)
	}
	if (lengthSize+len(header))%8 != 0 {
		t.Fatal("data section is not 8-byte aligned")
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	tensors := randomTensors(r, 40)
	tensors = append(tensors,
		Tensor{Name: "empty", Shape: []int{3, 0}},
		Tensor{Name: "special", Shape: []int{6}, Data: []float32{
			float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), // NaN with a payload
			float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32}},
		Tensor{Name: "ünïcode \"quoted\"\t\x01", Shape: []int{1}, Data: []float32{7}},
	)
	meta := map[string]string{"step": "42", "": "empty key", "json": `{"nested": [1]}`, "ctl": "\x00\x1f\u2028"}
	enc, err := Encode(tensors, meta)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	sameTensors(t, c.Tensors(), tensors)
	if !maps.Equal(c.Metadata(), meta) {
		t.Fatalf("metadata = %v, want %v", c.Metadata(), meta)
	}
	again, err := Encode(c.Tensors(), c.Metadata())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, enc) {
		t.Fatal("re-encoding a decoded checkpoint changed its bytes")
	}

	// The input order does not matter.
	shuffled := slices.Clone(tensors)
	r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if enc2, err := Encode(shuffled, maps.Clone(meta)); err != nil || !bytes.Equal(enc2, enc) {
		t.Fatalf("encoding depends on the order of the tensors (err %v)", err)
	}
	// Write streams the same bytes.
	var buf bytes.Buffer
	if n, err := Write(t.Context(), &buf, tensors, meta); err != nil || n != int64(len(enc)) || !bytes.Equal(buf.Bytes(), enc) {
		t.Fatalf("Write = %d, %v; differs from Encode", n, err)
	}
	// Read accepts a stream and leaves what follows the checkpoint unread.
	stream := bytes.NewReader(append(slices.Clone(enc), "trailer"...))
	if _, err := Read(stream, int64(len(enc))); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(stream); string(rest) != "trailer" {
		t.Fatalf("Read consumed past the checkpoint: left %q", rest)
	}
}

func TestEmptyCheckpoint(t *testing.T) {
	enc, err := Encode(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := file("{}      ", nil); !bytes.Equal(enc, want) {
		t.Fatalf("Encode(nil) = %q, want %q", enc, want)
	}
	c, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Names()) != 0 || c.Metadata() == nil || len(c.Metadata()) != 0 {
		t.Fatalf("empty checkpoint decoded to %v %v", c.Names(), c.Metadata())
	}
	if enc2, _ := Encode(nil, map[string]string{}); !bytes.Equal(enc2, enc) {
		t.Fatal("nil and empty metadata encode differently")
	}
}

func TestAccessors(t *testing.T) {
	enc, err := Encode([]Tensor{
		{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		{Name: "s", Data: []float32{9}},
	}, map[string]string{"a": "b"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !slices.Equal(got, []string{"s", "w"}) {
		t.Fatalf("Names = %v", got)
	}
	if d, err := c.Tensor("w", []int{2, 3}); err != nil || !slices.Equal(d, []float32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("Tensor(w) = %v, %v", d, err)
	}
	if d, err := c.Tensor("s", nil); err != nil || !slices.Equal(d, []float32{9}) {
		t.Fatalf("Tensor(s, nil) = %v, %v", d, err)
	}
	if _, err := c.Tensor("w", []int{3, 2}); !errors.Is(err, ErrShapeMismatch) || !strings.Contains(err.Error(), "[2,3]") {
		t.Fatalf("shape mismatch: %v", err)
	}
	if _, err := c.Tensor("w", []int{6}); !errors.Is(err, ErrShapeMismatch) {
		t.Fatalf("rank mismatch: %v", err)
	}
	if _, err := c.Tensor("nope", []int{1}); !errors.Is(err, ErrNotFound) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Fatalf("missing tensor: %v", err)
	}
	if s, ok := c.Shape("w"); !ok || !slices.Equal(s, []int{2, 3}) {
		t.Fatalf("Shape(w) = %v %v", s, ok)
	}
	if _, ok := c.Shape("nope"); ok {
		t.Fatal("Shape of a missing tensor")
	}
	if c.DType("w") != "F32" || c.DType("nope") != "" {
		t.Fatalf("DType = %q %q", c.DType("w"), c.DType("nope"))
	}
	// Accessors return copies: changing them does not change the checkpoint.
	c.Names()[0] = "x"
	c.Metadata()["a"] = "changed"
	s, _ := c.Shape("w")
	s[0] = 99
	if c.Names()[0] != "s" || c.Metadata()["a"] != "b" {
		t.Fatal("accessor results alias the checkpoint")
	}
	if _, err := c.Tensor("w", []int{2, 3}); err != nil {
		t.Fatal("Shape result aliases the checkpoint")
	}
}

func TestHalfPrecision(t *testing.T) {
	for _, tc := range []struct {
		bits uint16
		want float32
	}{
		{0x0000, 0},
		{0x8000, float32(math.Copysign(0, -1))},
		{0x3c00, 1},
		{0xc000, -2},
		{0x3555, 0.333251953125},
		{0x7bff, 65504},
		{0x0400, 1.0 / 16384},           // smallest normal, 2^-14
		{0x0001, 1.0 / (1 << 24)},       // smallest subnormal, 2^-24
		{0x0200, 1.0 / (1 << 15)},       // subnormal 2^-15
		{0x03ff, 1023.0 / (1 << 24)},    // largest subnormal
		{0x7c00, float32(math.Inf(1))},  // +inf
		{0xfc00, float32(math.Inf(-1))}, // -inf
	} {
		if got := f16ToF32(tc.bits); math.Float32bits(got) != math.Float32bits(tc.want) {
			t.Errorf("f16 %#04x = %v, want %v", tc.bits, got, tc.want)
		}
	}
	// A NaN keeps its payload, moved to the top of the float32 mantissa.
	if nan := f16ToF32(0x7e01); math.Float32bits(nan) != 0x7f800000|0x201<<13 {
		t.Errorf("f16 NaN = %#x", math.Float32bits(nan))
	}
	// Every half value widens to a float32 that narrows back to it: checks
	// all 65536 encodings against a reference built from the definition.
	for h := range 1 << 16 {
		exp, mant := h>>10&0x1f, h&0x3ff
		var want float64
		switch exp {
		case 0:
			want = float64(mant) * math.Pow(2, -24)
		case 0x1f:
			continue
		default:
			want = (1 + float64(mant)/1024) * math.Pow(2, float64(exp-15))
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if got := f16ToF32(uint16(h)); float64(got) != want || math.Signbit(float64(got)) != (h&0x8000 != 0) {
			t.Fatalf("f16 %#04x = %v, want %v", h, got, want)
		}
	}

	// A file with all three dtypes.
	data := binary.LittleEndian.AppendUint16(nil, 0x3c00) // F16 1
	data = binary.LittleEndian.AppendUint16(data, 0xc000) // F16 -2
	data = binary.LittleEndian.AppendUint16(data, 0x3fc0) // BF16 1.5
	data = binary.LittleEndian.AppendUint16(data, 0xc2f7) // BF16 -123.5
	data = append(data, f32bytes(3)...)
	c, err := Decode(file(`{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},`+
		`"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},`+
		`"f":{"dtype":"F32","shape":[],"data_offsets":[8,12]}}`, data))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]float32{"h": {1, -2}, "b": {1.5, -123.5}, "f": {3}} {
		s, _ := c.Shape(name)
		if got, err := c.Tensor(name, s); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s = %v, %v; want %v", name, got, err, want)
		}
	}
	if c.DType("h") != "F16" || c.DType("b") != "BF16" {
		t.Errorf("dtypes %q %q", c.DType("h"), c.DType("b"))
	}
}

func TestDecodeRejects(t *testing.T) {
	f := f32bytes
	two := `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	huge := binary.LittleEndian.AppendUint64(nil, math.MaxUint64)
	for _, tc := range []struct {
		name   string
		input  []byte
		limits Limits
		kind   error // besides ErrMalformed
		msg    string
	}{
		{"empty input", nil, Limits{}, ErrTruncated, "fewer than the 8-byte"},
		{"short length", []byte{1, 0, 0}, Limits{}, ErrTruncated, "fewer than the 8-byte"},
		{"header past end", file(`{}`, nil)[:9], Limits{}, ErrTruncated, "exceeds the 1 bytes"},
		{"header over cap", file(`{}                `, nil), Limits{MaxHeaderSize: 16}, ErrTooLarge, "limit of 16"},
		{"header length 2^64-1", append(huge, "{}"...), Limits{}, ErrTooLarge, "exceeds the limit"},
		{"data over cap", file(`{`+two+`}`, f(1, 2)), Limits{MaxDataSize: 4}, ErrTooLarge, "8 data bytes"},
		{"empty header", file(``, nil), Limits{}, nil, "does not start with '{'"},
		{"leading space", file(` {}`, nil), Limits{}, nil, "does not start with '{'"},
		{"array header", file(`[]`, nil), Limits{}, nil, "does not start with '{'"},
		{"invalid JSON", file(`{"a":`, nil), Limits{}, nil, "header JSON"},
		{"trailing garbage", file(`{} x`, nil), Limits{}, nil, "header JSON"},
		{"two objects", file(`{}{}`, nil), Limits{}, nil, "after the JSON object"},
		{"invalid UTF-8", file("{\"\xff\":1}", nil), Limits{}, nil, "UTF-8"},
		{"unknown dtype", file(`{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, ErrUnsupportedDType, `"I64"`},
		{"F64", file(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, ErrUnsupportedDType, `"F64"`},
		{"dtype not a string", file(`{"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}`, f(1)), Limits{}, nil, "not a string"},
		{"offsets past end", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f(1)), Limits{}, nil, "exceed the 4 data bytes"},
		{"offsets reversed", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f(1)), Limits{}, nil, "end before they begin"},
		{"offsets overlap", file(`{`+two+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, f(1, 2, 3)), Limits{}, nil, "overlap"},
		{"offsets identical", file(`{`+two+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "overlap"},
		{"size mismatch", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "needs 3×4 bytes"},
		{"F16 size mismatch", file(`{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "needs 3×2 bytes"},
		{"gap at start", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f(1, 2)), Limits{}, nil, "[0,4) are not covered"},
		{"gap in middle", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f(1, 2, 3)), Limits{}, nil, "[4,8) are not covered"},
		{"trailing data", file(`{`+two+`}`, f(1, 2, 3)), Limits{}, nil, "[8,12) are not covered"},
		{"data without tensors", file(`{}`, f(1)), Limits{}, nil, "[0,4) are not covered"},
		{"duplicate name", file(`{`+two+`,`+two+`}`, f(1, 2)), Limits{}, nil, `duplicate key "a"`},
		{"duplicate metadata", file(`{"__metadata__":{},"__metadata__":{}}`, nil), Limits{}, nil, "duplicate key"},
		{"duplicate metadata key", file(`{"__metadata__":{"k":"1","k":"2"}}`, nil), Limits{}, nil, `duplicate key "k"`},
		{"duplicate field", file(`{"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "duplicate key"},
		{"metadata value number", file(`{"__metadata__":{"k":1}}`, nil), Limits{}, nil, "not a string"},
		{"metadata value null", file(`{"__metadata__":{"k":null}}`, nil), Limits{}, nil, "not a string"},
		{"metadata null", file(`{"__metadata__":null}`, nil), Limits{}, nil, "must be an object"},
		{"metadata array", file(`{"__metadata__":[]}`, nil), Limits{}, nil, "must be an object"},
		{"entry null", file(`{"a":null}`, nil), Limits{}, nil, "entry must be an object"},
		{"entry string", file(`{"a":"x"}`, nil), Limits{}, nil, "entry must be an object"},
		{"missing dtype", file(`{"a":{"shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "missing dtype"},
		{"missing shape", file(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "missing shape"},
		{"missing offsets", file(`{"a":{"dtype":"F32","shape":[2]}}`, f(1, 2)), Limits{}, nil, "missing data_offsets"},
		{"unknown field", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]}}`, f(1, 2)), Limits{}, nil, `unknown field "stride"`},
		{"case-folded field", file(`{"a":{"DType":"F32","shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, `unknown field "DType"`},
		{"three offsets", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, f(1, 2)), Limits{}, nil, "has 3 numbers"},
		{"one offset", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, f(1, 2)), Limits{}, nil, "has 1 numbers"},
		{"offsets null", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":null}}`, f(1, 2)), Limits{}, nil, "not an array"},
		{"negative offset", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}}`, f(1, 2)), Limits{}, nil, "data_offsets"},
		{"huge offset", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}}`, f(1, 2)), Limits{}, nil, "data_offsets"},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "negative"},
		{"fractional dim", file(`{"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "shape"},
		{"shape null", file(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "not an array"},
		{"shape overflow", file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "too many elements"},
		{"bytes overflow", file(`{"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}}`, nil), Limits{}, nil, "needs"},
		{"empty name", file(`{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "empty name"},
		{"reserved name", file(`{"__w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f(1, 2)), Limits{}, nil, "reserved"},
	} {
		c, err := tc.limits.Decode(tc.input)
		if err == nil {
			t.Errorf("%s: accepted: %v", tc.name, c.Names())
			continue
		}
		if !errors.Is(err, ErrMalformed) || tc.kind != nil && !errors.Is(err, tc.kind) {
			t.Errorf("%s: error %v does not wrap ErrMalformed and %v", tc.name, err, tc.kind)
		}
		if !strings.HasPrefix(err.Error(), "checkpoint: ") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %q does not mention %q", tc.name, err, tc.msg)
		}
	}
}

func TestDecodeAcceptsOtherWriters(t *testing.T) {
	// Files written by other safetensors writers: unpadded or space-padded
	// headers, keys in any order, metadata last, empty tensors between
	// others, and whitespace inside the JSON.
	for _, tc := range []struct {
		name   string
		header string
		data   []byte
	}{
		{"unpadded", `{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32bytes(1, 2)},
		{"padded", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}      `, f32bytes(1, 2)},
		{"whitespace", "{ \"a\" :\n{ \"shape\" : [ 2 ] , \"data_offsets\":[0 , 8],\"dtype\":\"F32\" } ,\"__metadata__\":{\"x\":\"y\"}\t}", f32bytes(1, 2)},
		{"empty tensors", `{"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"z":{"dtype":"F32","shape":[1,0],"data_offsets":[8,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32bytes(1, 2)},
		{"escaped name", `{"\u00e9\n":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, f32bytes(1)},
	} {
		c, err := Decode(file(tc.header, tc.data))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		// And re-encoding gives a canonical file with the same content.
		enc, err := Encode(c.Tensors(), c.Metadata())
		if err != nil {
			t.Errorf("%s: re-encode: %v", tc.name, err)
			continue
		}
		c2, err := Decode(enc)
		if err != nil {
			t.Errorf("%s: decode re-encoded: %v", tc.name, err)
			continue
		}
		sameTensors(t, c2.Tensors(), c.Tensors())
	}
}

// errReader fails after its bytes run out with an error other than EOF.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, e.err
	}
	return n, err
}

func TestReadErrors(t *testing.T) {
	enc, err := Encode([]Tensor{{Name: "a", Shape: []int{100}, Data: make([]float32, 100)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A stream that ends before the size it announced is truncated, at any
	// cut point.
	for cut := 0; cut < len(enc); cut += 7 {
		_, err := Read(bytes.NewReader(enc[:cut]), int64(len(enc)))
		if !errors.Is(err, ErrTruncated) || !errors.Is(err, ErrMalformed) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	// Any prefix of a file decodes to an error, never to a smaller model.
	for cut := 0; cut < len(enc); cut++ {
		if _, err := Decode(enc[:cut]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes: %v", cut, err)
		}
	}
	// An I/O error is passed through, not disguised as a bad file.
	boom := errors.New("boom")
	_, err = Read(&errReader{bytes.NewReader(enc[:50]), boom}, int64(len(enc)))
	if !errors.Is(err, boom) || errors.Is(err, ErrMalformed) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Fatalf("I/O error: %v", err)
	}
	if _, err := Read(bytes.NewReader(enc), -1); !errors.Is(err, ErrTruncated) {
		t.Fatalf("negative size: %v", err)
	}
}

func TestEncodeRejects(t *testing.T) {
	ok := Tensor{Name: "ok", Shape: []int{1}, Data: []float32{1}}
	for _, tc := range []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
		kind    error
		msg     string
	}{
		{"empty name", []Tensor{{Name: "", Data: []float32{1}}}, nil, ErrInvalidTensor, "empty name"},
		{"reserved", []Tensor{{Name: "__metadata__", Data: []float32{1}}}, nil, ErrInvalidTensor, "reserved"},
		{"reserved prefix", []Tensor{{Name: "__x", Data: []float32{1}}}, nil, ErrInvalidTensor, "reserved"},
		{"bad UTF-8 name", []Tensor{{Name: "a\xff", Data: []float32{1}}}, nil, ErrInvalidTensor, "UTF-8"},
		{"duplicate", []Tensor{ok, {Name: "z", Data: []float32{1}}, ok}, nil, ErrInvalidTensor, `duplicate tensor name "ok"`},
		{"too few values", []Tensor{{Name: "a", Shape: []int{2, 3}, Data: make([]float32, 5)}}, nil, ErrInvalidTensor, "6 elements but data has 5"},
		{"too many values", []Tensor{{Name: "a", Shape: []int{0}, Data: make([]float32, 1)}}, nil, ErrInvalidTensor, "0 elements but data has 1"},
		{"scalar without data", []Tensor{{Name: "a"}}, nil, ErrInvalidTensor, "1 elements but data has 0"},
		{"negative dim", []Tensor{{Name: "a", Shape: []int{-1, -1}, Data: make([]float32, 1)}}, nil, ErrInvalidTensor, "negative"},
		{"overflow", []Tensor{{Name: "a", Shape: []int{1 << 40, 1 << 40}, Data: make([]float32, 1)}}, nil, ErrInvalidTensor, "too many elements"},
		{"bad UTF-8 key", []Tensor{ok}, map[string]string{"\xff": "v"}, ErrInvalidMetadata, "UTF-8"},
		{"bad UTF-8 value", []Tensor{ok}, map[string]string{"k": "\xc3"}, ErrInvalidMetadata, "UTF-8"},
	} {
		_, err := Encode(tc.tensors, tc.meta)
		if !errors.Is(err, tc.kind) || !strings.HasPrefix(err.Error(), "checkpoint: ") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: Encode error %v, want %v mentioning %q", tc.name, err, tc.kind, tc.msg)
		}
		var buf bytes.Buffer
		if n, err := Write(t.Context(), &buf, tc.tensors, tc.meta); !errors.Is(err, tc.kind) || n != 0 || buf.Len() != 0 {
			t.Errorf("%s: Write wrote %d bytes, error %v", tc.name, n, err)
		}
	}
}

func TestEncodeRejectsHugeHeader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100 MiB header")
	}
	_, err := Encode([]Tensor{{Name: "a", Data: []float32{1}}}, map[string]string{"k": strings.Repeat("x", DefaultMaxHeaderSize)})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("huge header: %v", err)
	}
	// Escaping grows a control character sixfold (\u0001): caught once the
	// header is built.
	_, err = Encode(nil, map[string]string{"k": strings.Repeat("x", DefaultMaxHeaderSize*9/10), "c": strings.Repeat("\x01", DefaultMaxHeaderSize/40)})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "header is") {
		t.Fatalf("huge escaped header: %v", err)
	}
}

// TestJSONStringEscaping checks the header's string writer against
// encoding/json's reader for every byte value and some Unicode.
func TestJSONStringEscaping(t *testing.T) {
	var all strings.Builder
	for c := range 0x80 {
		all.WriteByte(byte(c))
	}
	for _, s := range []string{"", "plain", all.String(), `"\"`, "é\u2028\U0001F600<>&", "\x00end", "start\x1f"} {
		enc := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(enc, &got); err != nil || got != s {
			t.Errorf("%q encoded as %s decodes to %q (%v)", s, enc, got, err)
		}
	}
}
