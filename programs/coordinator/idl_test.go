package coordinator_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/programs/abi"
	program "github.com/psyche-go/psyche/programs/coordinator"
)

// The IDL as these tests read it: only what idl.json says, parsed on its own
// terms, so that the checks below test the file rather than the generator.
type idlFile struct {
	Address      string
	Instructions []struct {
		Name          string
		Discriminator []int
		Accounts      []idlAccountItem
		Args          []idlField
	}
	Accounts []struct {
		Name          string
		Discriminator []int
		Size          int
	}
	Errors []struct {
		Code uint32
		Name string
		Msg  string
	}
	Types []struct {
		Name string
		Type struct {
			Kind     string
			Fields   []idlField
			Variants []struct{ Name string }
		}
	}
}

type idlAccountItem struct {
	Name                       string
	Writable, Signer, Optional bool
	Address                    string
}

type idlField struct {
	Name string
	Type any // a JSON string or object
}

func loadIDL(t *testing.T) *idlFile {
	t.Helper()
	raw, err := os.ReadFile("idl.json")
	if err != nil {
		t.Fatal(err)
	}
	var f idlFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("idl.json: %v", err)
	}
	return &f
}

func discBytes(d []int) []byte {
	b := make([]byte, len(d))
	for i, v := range d {
		b[i] = byte(v)
	}
	return b
}

// TestIDLIsCurrent regenerates the IDL and requires the committed file.
func TestIDLIsCurrent(t *testing.T) {
	want, err := program.IDL()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("idl.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		line := 0
		for line < min(len(g), len(w)) && g[line] == w[line] {
			line++
		}
		t.Fatalf("idl.json is stale (first difference at line %d); run go run ./programs/cmd/gen-idl", line+1)
	}
}

// testInstructions is every instruction; TestIDLInstructionList checks it
// against the coordinator's own list.
var testInstructions = []coord.Instruction{&coord.InitCoordinator{}, &coord.Update{}, &coord.SetPaused{}, &coord.JoinRun{},
	&coord.Tick{}, &coord.WarmupWitness{}, &coord.WitnessRound{}, &coord.HealthCheck{}, &coord.RecordCheckpoint{},
	&coord.FreeCoordinator{}}

// TestIDLInstructionList checks the names, order and discriminators of the
// IDL's instructions, its error table and its address against Go.
func TestIDLInstructionList(t *testing.T) {
	idl := loadIDL(t)
	names := coord.InstructionNames()
	if len(idl.Instructions) != len(names) || len(testInstructions) != len(names) {
		t.Fatalf("IDL has %d instructions, the test %d, Go %d", len(idl.Instructions), len(testInstructions), len(names))
	}
	for i, ix := range idl.Instructions {
		d := coord.InstructionDiscriminator(names[i])
		if ix.Name != names[i] || testInstructions[i].Name() != names[i] || !bytes.Equal(discBytes(ix.Discriminator), d[:]) {
			t.Errorf("instruction %d: IDL %s %v, Go %s %v", i, ix.Name, ix.Discriminator, names[i], d)
		}
	}
	if got, want := idl.Address, abi.LocalProgramID.String(); got != want {
		t.Errorf("IDL address %s, abi.LocalProgramID %s", got, want)
	}
}

// TestIDLErrorsMatchGo requires the IDL's errors to be the Go error table,
// code, name and message, in order.
func TestIDLErrorsMatchGo(t *testing.T) {
	idl := loadIDL(t)
	goErrs := coord.Errors()
	if len(idl.Errors) != len(goErrs) {
		t.Fatalf("IDL has %d errors, Go %d", len(idl.Errors), len(goErrs))
	}
	for i, e := range goErrs {
		got := idl.Errors[i]
		if got.Code != e.Code || got.Name != e.Name || "coordinator: "+got.Msg != e.Error() {
			t.Errorf("error %d: IDL {%d %s %q}, Go {%d %s %q}", i, got.Code, got.Name, got.Msg, e.Code, e.Name, e.Error())
		}
	}
}

// TestIDLDecodesInstructions encodes samples of every instruction with the Go
// encoder, decodes them with nothing but the IDL (borshDecoder below) and
// requires every field to hold the sample's value and every byte to be used:
// the IDL demonstrably describes the instruction data.
func TestIDLDecodesInstructions(t *testing.T) {
	idl := loadIDL(t)
	for i, proto := range testInstructions {
		for _, sample := range []struct {
			name    string
			fill    bool
			options float64 // probability that an option is present
		}{
			{"zero", false, 0},
			{"random", true, 1},
			{"random, some options absent", true, 0.5},
		} {
			t.Run(proto.Name()+"/"+sample.name, func(t *testing.T) {
				v := reflect.New(reflect.TypeOf(proto).Elem())
				if sample.fill {
					rng := rand.New(rand.NewPCG(uint64(i), 7))
					fillRandom(v.Elem(), rng, sample.options)
				}
				data := coord.EncodeInstruction(v.Interface().(coord.Instruction))
				d := newBorshDecoder(idl, data)
				ix := d.instruction()
				if d.err != nil {
					t.Fatalf("decoding %x with the IDL: %v", data, d.err)
				}
				if ix.name != proto.Name() {
					t.Fatalf("the IDL names discriminator %x %s, want %s", data[:8], ix.name, proto.Name())
				}
				if d.off != len(data) {
					t.Fatalf("the IDL describes %d of the %d bytes", d.off, len(data))
				}
				if err := matchGo(ix.args, v.Elem(), proto.Name()); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestIDLDecodesAccount does the same with a coordinator account whose every
// field holds a random value.
func TestIDLDecodesAccount(t *testing.T) {
	idl := loadIDL(t)
	var s coord.Coordinator
	fillRandom(reflect.ValueOf(&s).Elem(), rand.New(rand.NewPCG(1, 2)), 1)
	data := s.MarshalAccount()
	d := newBorshDecoder(idl, data)
	name, v := d.account()
	if d.err != nil {
		t.Fatal(d.err)
	}
	if name != "CoordinatorAccount" || d.off != len(data) {
		t.Fatalf("decoded %s using %d of %d bytes", name, d.off, len(data))
	}
	for _, a := range idl.Accounts {
		if a.Name == name && a.Size != coord.AccountSize {
			t.Errorf("IDL size %d, account %d", a.Size, coord.AccountSize)
		}
	}
	st := v.(structValue)
	if st.names[0] != "version" || st.vals[0] != uint64(coord.AccountVersion) || st.names[1] != "_reserved" || !bytes.Equal(st.vals[1].([]byte), make([]byte, 4)) {
		t.Fatalf("header %v %v", st.names[:2], st.vals[:2])
	}
	rest := structValue{names: st.names[2:], vals: st.vals[2:]}
	if err := matchGo(rest, reflect.ValueOf(s), "account"); err != nil {
		t.Fatal(err)
	}
}

// TestIDLAccountMatchesLayout flattens the IDL's account type into offsets
// and compares it with the coordinator's layout table (the walkers' own
// names, offsets and sizes, which the C struct is also checked against). The
// walkers flatten two nestings (a client's id, a checkpoint's source), so
// fields are matched by offset, size and their own name.
func TestIDLAccountMatchesLayout(t *testing.T) {
	idl := loadIDL(t)
	d := newBorshDecoder(idl, nil)
	type row struct {
		name                string // last path component
		offset, size, count int
	}
	var idlRows []row
	var flatten func(typ any, name string, off int) int
	flatten = func(typ any, name string, off int) int {
		leaf := func(size int) int {
			if !strings.HasPrefix(name, "_") {
				idlRows = append(idlRows, row{name, off, size, 1})
			}
			return size
		}
		switch typ := typ.(type) {
		case string:
			return leaf(primitiveSize[typ])
		case map[string]any:
			if a, ok := typ["array"].([]any); ok {
				n := int(a[1].(float64))
				if s, ok := a[0].(string); ok {
					return leaf(n * primitiveSize[s])
				}
				stride := flatten(a[0], name, off)
				idlRows = append(idlRows, row{name, off, stride, n})
				return n * stride
			}
			def := d.defined(typ)
			if def == nil {
				t.Fatalf("%s: type %v", name, typ)
			}
			if def.Type.Kind == "enum" {
				return leaf(1)
			}
			size := 0
			for _, f := range def.Type.Fields {
				size += flatten(f.Type, f.Name, off+size)
			}
			return size
		}
		t.Fatalf("%s: type %v", name, typ)
		return 0
	}
	size := 8 + flatten(map[string]any{"defined": map[string]any{"name": "CoordinatorAccount"}}, "", 8)
	if size != coord.AccountSize {
		t.Errorf("the IDL account is %d bytes, the coordinator's %d", size, coord.AccountSize)
	}
	layout, err := coord.LayoutTable()
	if err != nil {
		t.Fatal(err)
	}
	inIDL := map[row]bool{}
	for _, r := range idlRows {
		inIDL[r] = true
	}
	inLayout := map[row]bool{}
	for _, f := range layout {
		if f.Name == "discriminator" {
			continue // the account's discriminator, outside the type in Anchor's convention
		}
		name := f.Name[strings.LastIndexByte(f.Name, '.')+1:]
		name = strings.TrimSuffix(name, "[0]")
		r := row{name, f.Offset, f.Size, f.Count}
		inLayout[r] = true
		if !inIDL[r] {
			t.Errorf("layout field %s (offset %d, size %d, count %d) is not in the IDL", f.Name, f.Offset, f.Size, f.Count)
		}
	}
	for _, r := range idlRows {
		if !inLayout[r] {
			t.Errorf("IDL field %s (offset %d, size %d, count %d) is not in the layout table", r.name, r.offset, r.size, r.count)
		}
	}
}

// A tiny Borsh decoder driven by the IDL's types. Values: uint64 for
// integers, bool, f32bits, []byte for pubkeys and u8 arrays, []any for other
// arrays, nil for an absent option, structValue, enumValue.

type structValue struct {
	names []string
	vals  []any
}

type enumValue string

type f32bits uint32

var primitiveSize = map[string]int{"bool": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "f32": 4, "pubkey": 32}

type borshDecoder struct {
	idl *idlFile
	buf []byte
	off int
	err error
}

func newBorshDecoder(idl *idlFile, buf []byte) *borshDecoder {
	return &borshDecoder{idl: idl, buf: buf}
}

func (d *borshDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("offset %d: "+format, append([]any{d.off}, args...)...)
	}
}

func (d *borshDecoder) read(n int) []byte {
	if d.err != nil {
		return nil
	}
	if d.off+n > len(d.buf) {
		d.fail("need %d bytes, have %d", n, len(d.buf)-d.off)
		return nil
	}
	b := d.buf[d.off : d.off+n]
	d.off += n
	return b
}

func (d *borshDecoder) defined(typ map[string]any) *struct {
	Name string
	Type struct {
		Kind     string
		Fields   []idlField
		Variants []struct{ Name string }
	}
} {
	ref, ok := typ["defined"].(map[string]any)
	if !ok {
		return nil
	}
	for i := range d.idl.Types {
		if d.idl.Types[i].Name == ref["name"] {
			return &d.idl.Types[i]
		}
	}
	return nil
}

type decodedInstruction struct {
	name string
	args structValue
}

// instruction finds the instruction by its discriminator and decodes its arguments.
func (d *borshDecoder) instruction() decodedInstruction {
	disc := d.read(8)
	for _, ix := range d.idl.Instructions {
		if d.err == nil && bytes.Equal(discBytes(ix.Discriminator), disc) {
			return decodedInstruction{ix.Name, d.fields(ix.Args)}
		}
	}
	d.fail("no instruction has discriminator %x", disc)
	return decodedInstruction{}
}

// account finds the account type by its discriminator and decodes it.
func (d *borshDecoder) account() (string, any) {
	disc := d.read(8)
	for _, a := range d.idl.Accounts {
		if d.err == nil && bytes.Equal(discBytes(a.Discriminator), disc) {
			return a.Name, d.value(map[string]any{"defined": map[string]any{"name": a.Name}})
		}
	}
	d.fail("no account has discriminator %x", disc)
	return "", nil
}

func (d *borshDecoder) fields(fs []idlField) structValue {
	var s structValue
	for _, f := range fs {
		s.names = append(s.names, f.Name)
		s.vals = append(s.vals, d.value(f.Type))
	}
	return s
}

func (d *borshDecoder) value(typ any) any {
	if d.err != nil {
		return nil
	}
	switch typ := typ.(type) {
	case string:
		n, ok := primitiveSize[typ]
		if !ok {
			d.fail("unknown type %q", typ)
			return nil
		}
		b := d.read(n)
		if b == nil {
			return nil
		}
		switch typ {
		case "bool":
			if b[0] > 1 {
				d.fail("bool %d", b[0])
			}
			return b[0] == 1
		case "f32":
			return f32bits(binary.LittleEndian.Uint32(b))
		case "pubkey":
			return bytes.Clone(b)
		}
		var v uint64
		for i := n - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		return v
	case map[string]any:
		if a, ok := typ["array"].([]any); ok {
			n := int(a[1].(float64))
			if a[0] == "u8" {
				return bytes.Clone(d.read(n))
			}
			out := make([]any, n)
			for i := range out {
				out[i] = d.value(a[0])
			}
			return out
		}
		if inner, ok := typ["option"]; ok {
			switch tag := d.read(1); {
			case tag == nil:
				return nil
			case tag[0] == 0:
				return nil
			case tag[0] == 1:
				return d.value(inner)
			default:
				d.fail("option tag %d", tag[0])
				return nil
			}
		}
		def := d.defined(typ)
		if def == nil {
			d.fail("unknown type %v", typ)
			return nil
		}
		switch def.Type.Kind {
		case "struct":
			return d.fields(def.Type.Fields)
		case "enum":
			tag := d.read(1)
			if tag == nil {
				return nil
			}
			if int(tag[0]) >= len(def.Type.Variants) {
				d.fail("%s has no variant %d", def.Name, tag[0])
				return nil
			}
			return enumValue(def.Type.Variants[tag[0]].Name)
		}
	}
	d.fail("unknown type %v", typ)
	return nil
}

// matchGo compares a decoded value with the Go value it was encoded from,
// field by field in declaration order (padding included), and each field's
// IDL name with its Go name.
func matchGo(got any, want reflect.Value, path string) error {
	mismatch := func() error { return fmt.Errorf("%s: decoded %v, Go has %v", path, got, want) }
	if want.Kind() == reflect.Pointer {
		if got == nil || want.IsNil() {
			if got != nil || !want.IsNil() {
				return mismatch()
			}
			return nil
		}
		want = want.Elem()
	}
	switch got := got.(type) {
	case structValue:
		if want.Kind() != reflect.Struct || want.NumField() != len(got.vals) {
			return fmt.Errorf("%s: %d decoded fields, Go %s has %d", path, len(got.vals), want.Type(), want.NumField())
		}
		for i, v := range got.vals {
			// The IDL's snake_case name is the Go name: "run_state_start"
			// for RunStateStart, "_padding…" for a blank field.
			goName, name := want.Type().Field(i).Name, got.names[i]
			if goName == "_" && !strings.HasPrefix(name, "_") ||
				goName != "_" && strings.ReplaceAll(name, "_", "") != strings.ToLower(goName) {
				return fmt.Errorf("%s: field %d is %s in the IDL, %s in Go", path, i, name, goName)
			}
			if err := matchGo(v, want.Field(i), path+"."+name); err != nil {
				return err
			}
		}
		return nil
	case enumValue:
		if names := program.EnumVariants(want.Type()); names == nil || names[want.Uint()] != string(got) {
			return mismatch()
		}
		return nil
	case uint64:
		if want.CanUint() && want.Uint() == got {
			return nil
		}
	case bool:
		if want.Kind() == reflect.Bool && want.Bool() == got {
			return nil
		}
	case f32bits:
		if want.Kind() == reflect.Float32 && math.Float32bits(float32(want.Float())) == uint32(got) {
			return nil
		}
	case []byte:
		if want.Kind() == reflect.Uint8 { // a one-byte pad
			want = reflect.ValueOf([1]uint8{uint8(want.Uint())})
		}
		if want.Kind() != reflect.Array || want.Len() != len(got) {
			return mismatch()
		}
		for i, b := range got {
			if want.Index(i).Uint() != uint64(b) {
				return mismatch()
			}
		}
		return nil
	case []any:
		if want.Kind() != reflect.Array || want.Len() != len(got) {
			return mismatch()
		}
		for i, v := range got {
			if err := matchGo(v, want.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	return mismatch()
}

// fillRandom sets every settable field of v to a random value: enums to one
// of their variants, floats to finite values (so bit patterns survive the
// float64 that reflect passes them through), pointers present with
// probability present. Blank (padding) fields stay zero.
func fillRandom(v reflect.Value, rng *rand.Rand, present float64) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				fillRandom(f, rng, present)
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			fillRandom(v.Index(i), rng, present)
		}
	case reflect.Pointer:
		if rng.Float64() < present {
			v.Set(reflect.New(v.Type().Elem()))
			fillRandom(v.Elem(), rng, present)
		}
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 1)
	case reflect.Uint8:
		if names := program.EnumVariants(v.Type()); names != nil {
			v.SetUint(uint64(rng.IntN(len(names))))
		} else {
			v.SetUint(rng.Uint64())
		}
	case reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(rng.Uint64()) // truncated to the field's width
	case reflect.Float32:
		v.SetFloat(float64(rng.Float32()*2000 - 1000))
	default:
		panic(fmt.Sprintf("fillRandom: %s", v.Type()))
	}
}

// TestIDLNamedEnums requires the model's kind bytes to be enums in the IDL
// whose variants are the Go constants in order, so that an IDL client reads
// {"GPT": {}} rather than a bare 1 (and cannot pass a value the program
// would refuse without noticing the name is missing).
func TestIDLNamedEnums(t *testing.T) {
	f := loadIDL(t)
	types := map[string]int{}
	for i, d := range f.Types {
		types[d.Name] = i
	}
	fieldType := func(typeName, field string) string {
		t.Helper()
		i, ok := types[typeName]
		if !ok {
			t.Fatalf("the IDL has no type %s", typeName)
		}
		for _, fl := range f.Types[i].Type.Fields {
			if fl.Name != field {
				continue
			}
			obj, _ := fl.Type.(map[string]any)
			def, _ := obj["defined"].(map[string]any)
			name, _ := def["name"].(string)
			if name == "" {
				t.Fatalf("%s.%s is %v, want a defined enum", typeName, field, fl.Type)
			}
			return name
		}
		t.Fatalf("%s has no field %s", typeName, field)
		return ""
	}
	for _, c := range []struct {
		typ, field string
		want       []string
	}{
		{"Model", "architecture", names(coord.ArchNone, coord.ArchGPT, coord.ArchLlama, coord.ArchTransformers)},
		{"Model", "data_kind", names(coord.DataNone, coord.DataLocal, coord.DataHTTP)},
		{"LRSchedule", "kind", names(coord.LRNone, coord.LRConstant, coord.LRLinear, coord.LRCosine, coord.LRWarmupStableDecay)},
		{"Optimizer", "kind", names(coord.OptimizerNone, coord.OptimizerAdamW, coord.OptimizerDistro)},
	} {
		enum := fieldType(c.typ, c.field)
		d := f.Types[types[enum]]
		var got []string
		for _, v := range d.Type.Variants {
			got = append(got, v.Name)
		}
		if d.Type.Kind != "enum" || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.%s: %s is a %s with variants %v, want an enum with %v", c.typ, c.field, enum, d.Type.Kind, got, c.want)
		}
	}
}

func names[T fmt.Stringer](vs ...T) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.String())
	}
	return out
}
