package coordinator

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
)

// randomFill sets every exported field reachable from v to pseudo-random
// values (booleans stay valid), so round trips exercise every byte.
func randomFill(r *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		randomFill(r, v.Elem())
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				randomFill(r, v.Field(i))
			}
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			randomFill(r, v.Index(i))
		}
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 1)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(r.Uint64())
	case reflect.Float32:
		v.SetFloat(float64(r.Float32()))
	}
}

func TestInstructionRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, proto := range newInstructions() {
		for i := 0; i < 20; i++ {
			ix := reflect.New(reflect.TypeOf(proto).Elem())
			randomFill(r, ix)
			if u, ok := ix.Interface().(*Update); ok && i%2 == 1 {
				// exercise absent options too
				u.Metadata, u.Model = nil, nil
			}
			in := ix.Interface().(Instruction)
			data := EncodeInstruction(in)
			out, err := DecodeInstruction(data)
			if err != nil {
				t.Fatalf("%s: %v", in.Name(), err)
			}
			if !reflect.DeepEqual(in, out) {
				t.Fatalf("%s: decoded %+v, want %+v", in.Name(), out, in)
			}
			if !bytes.Equal(EncodeInstruction(out), data) {
				t.Fatalf("%s: re-encoding differs", in.Name())
			}
		}
	}
}

func TestInstructionSizes(t *testing.T) {
	// A witness transaction must fit Solana's 1232-byte packet with its
	// signature, header, blockhash and account keys.
	w := len(EncodeInstruction(&WitnessRound{}))
	if w != 8+704 {
		t.Errorf("witness data is %d bytes", w)
	}
	const overhead = 1 + 64 + 3 + 1 + 6*32 + 32 + 1 + 1 + 1 + 6 + 2
	if w+overhead > 1232 {
		t.Errorf("witness transaction is %d bytes", w+overhead)
	}
	all := len(EncodeInstruction(&Update{Metadata: &Metadata{}, Config: &Config{}, Model: &Model{}, Progress: &Progress{}}))
	if all+overhead > 1232 {
		t.Errorf("a full update is %d bytes", all+overhead)
	}
}

func TestDecodeInstructionRejects(t *testing.T) {
	tick := EncodeInstruction(&Tick{})
	pause := EncodeInstruction(&SetPaused{Paused: true})
	update := EncodeInstruction(&Update{Config: &Config{}})
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short discriminator", tick[:7], ErrTruncated},
		{"unknown", []byte{1, 2, 3, 4, 5, 6, 7, 8}, ErrUnknownInstruction},
		{"trailing", append(bytes.Clone(tick), 0), ErrMalformed},
		{"truncated args", pause[:8], ErrTruncated},
		{"bool", append(bytes.Clone(pause[:8]), 2), ErrMalformed},
		{"option tag", func() []byte { b := bytes.Clone(update); b[8] = 7; return b }(), ErrMalformed},
		{"truncated option", update[:len(update)-3], ErrTruncated},
		{"config padding", func() []byte { b := bytes.Clone(update); b[len(b)-3] = 1; return b }(), ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeInstruction(tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestErrorCodesAreUnique(t *testing.T) {
	seen := map[uint32]string{}
	for _, e := range Errors() {
		if prev, ok := seen[e.Code]; ok {
			t.Errorf("code %d used by %s and %s", e.Code, prev, e.Name)
		}
		seen[e.Code] = e.Name
		if ErrorFromCode(e.Code) != e {
			t.Errorf("ErrorFromCode(%d) is not %s", e.Code, e.Name)
		}
		if CodeOf(errors.Join(errors.New("context"), e)) != e.Code {
			t.Errorf("CodeOf loses %s when wrapped", e.Name)
		}
	}
}
