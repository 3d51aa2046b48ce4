package coordinator

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"unicode"

	coord "github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/programs/abi"
)

//go:generate go run ../cmd/gen-idl -o idl.json

// IDL returns the program's interface description in the Anchor IDL format
// (spec 0.1.0), so that explorers and other-language clients decode its
// instructions, accounts and errors. It is derived from the Go definitions in
// package coordinator by reflection: the instruction structs give the
// arguments, the account structs the layout, the error table the errors.
// idl.json is this output; TestIDLIsCurrent fails when the two differ
// (regenerate with `go run ./programs/cmd/gen-idl`).
//
// The types are written as Borsh, which gives exactly the program's bytes
// because every struct is naturally aligned with its padding spelled out: a
// Go blank field becomes an explicit "_padding" byte array, an option is a
// tag byte then the value, and the small enums with names in Go (RunState,
// ClientState, CheckpointKind, Architecture, DataKind, LRScheduleKind,
// OptimizerKind, Aggregation, Normalization: every uint8 type with a String
// method) are Borsh enums, which are one tag byte.
func IDL() ([]byte, error) {
	b := &idlBuilder{defs: map[string]idlTypeDef{}}
	// The version follows the account's: the layout is the ABI.
	doc := idlDoc{
		Address: abi.LocalProgramID.String(),
		Metadata: idlMetadata{Name: "psyche_coordinator", Version: fmt.Sprintf("%d.0.0", coord.AccountVersion), Spec: "0.1.0",
			Description: "Psyche training-run coordinator (C, SBPF v0); the byte formats are those of github.com/psyche-go/psyche/coordinator"},
		Docs: []string{
			"address is the id at which `psyche validator` and the tests load the program (sha256(\"psyche/coordinator-program\")); a deployment names its own.",
			"Every instruction takes [instance, coordinator, sender, extras...]. Errors 6000+ are the coordinator's; problems with the accounts are Solana's built-in program errors.",
		},
	}
	for _, ix := range instructions {
		t := reflect.TypeOf(ix).Elem()
		args := append([]idlField{}, b.fields(t)...) // [] rather than null for no arguments
		d := coord.InstructionDiscriminator(ix.Name())
		doc.Instructions = append(doc.Instructions, idlInstruction{
			Name:          ix.Name(),
			Docs:          []string{instructionDocs[ix.Name()]},
			Discriminator: d[:],
			Accounts:      instructionAccounts(ix),
			Args:          args,
		})
	}

	// The coordinator account: its discriminator, then the version, four
	// reserved bytes and the Coordinator fields (coordinator/account.go).
	acct := append([]idlField{{Name: "version", Type: "u32"}, {Name: "_reserved", Type: byteArray(4)}},
		b.fields(reflect.TypeFor[coord.Coordinator]())...)
	b.add(idlTypeDef{Name: accountTypeName, Docs: []string{fmt.Sprintf(
		"The coordinator account (%d bytes with its discriminator): version %d, then the run's whole state; every list has a fixed capacity and a length field. nonce increases on every mutation.",
		coord.AccountSize, coord.AccountVersion)},
		Type: idlTypeBody{Kind: "struct", Fields: acct}})
	inst := b.fields(reflect.TypeFor[instanceRecord]())
	b.add(idlTypeDef{Name: abi.InstanceTypeName, Docs: []string{fmt.Sprintf(
		"The instance PDA [\"coordinator\", run_id without its trailing zeros] (%d bytes with its discriminator): the bump and the address of the run's coordinator account.", abi.InstanceSize)},
		Type: idlTypeBody{Kind: "struct", Fields: inst}})
	if b.err != nil {
		return nil, b.err
	}

	for _, a := range []struct {
		name string
		disc [8]byte
		want int
	}{
		{accountTypeName, coord.AccountDiscriminator, coord.AccountSize},
		{abi.InstanceTypeName, abi.InstanceDiscriminator, abi.InstanceSize},
	} {
		size := 8 + b.size(defined(a.name))
		if size != a.want {
			return nil, fmt.Errorf("programs/coordinator: IDL type %s is %d bytes with its discriminator, the account is %d", a.name, size, a.want)
		}
		doc.Accounts = append(doc.Accounts, idlAccountDef{Name: a.name, Discriminator: a.disc[:], Size: size})
	}
	for _, e := range coord.Errors() {
		doc.Errors = append(doc.Errors, idlError{Code: e.Code, Name: e.Name, Msg: strings.TrimPrefix(e.Error(), "coordinator: ")})
	}
	for _, name := range slices.Sorted(maps.Keys(b.defs)) {
		doc.Types = append(doc.Types, b.defs[name])
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// instructions lists every instruction in IDL order; TestIDLInstructionList
// checks it against coordinator.InstructionNames, so none is forgotten.
var instructions = []coord.Instruction{&coord.InitCoordinator{}, &coord.Update{}, &coord.SetPaused{}, &coord.JoinRun{},
	&coord.Tick{}, &coord.WarmupWitness{}, &coord.WitnessRound{}, &coord.HealthCheck{}, &coord.RecordCheckpoint{},
	&coord.FreeCoordinator{}}

var instructionDocs = map[string]string{
	"init_coordinator": "Creates a run (Uninitialized); the sender must be the main authority it names. Runs in the transaction that creates the coordinator account (system create_account, owner = this program) and funds the instance PDA for 80 bytes (an instance with no lamports is refused with InstanceNotFunded).",
	"update":           "Changes the metadata (any time) and the config, model and progress (only while halted); absent options are left as they are. Main authority only.",
	"set_paused":       "Pauses (true) or resumes (false) the run. Main authority only.",
	"join_run":         "Asks to be a client of the next epoch; id.signer must be the sender. When the run has a join authority it must co-sign.",
	"tick":             "Advances the state machine when a timeout or condition is met; refused with NothingDue (and so costs no fee in preflight) when nothing is. Anyone may send it.",
	"warmup_witness":   "A warmup witness reports that it has loaded the model; the last one starts the first round.",
	"witness":          "A round witness reports what it received (participant and broadcast blooms, merkle root, metadata).",
	"health_check":     "Reports a client that a quorum of the previous round's witnesses did not see; proof is its committee proof in the current round.",
	"checkpoint":       "Records where this epoch's model was saved, during Cooldown. An elected checkpointer or the main authority.",
	"free_coordinator": "Closes a halted run: both accounts are zeroed and their lamports paid to the main authority.",
}

const accountTypeName = "CoordinatorAccount"

// instanceRecord is the instance PDA's data after its discriminator, as
// create_instance in entrypoint.c writes it.
type instanceRecord struct {
	Bump        uint8
	_           [7]byte
	RunID       [coord.MaxRunIDLen]byte
	Coordinator coord.Pubkey
}

// instructionAccounts is abi.Accounts in the IDL's terms: fixed accounts
// (the system program, the SlotHashes sysvar) by address, the others by
// name, and join_run's optional co-signer.
func instructionAccounts(ix coord.Instruction) []idlAccountItem {
	var keys abi.Keys
	if _, join := ix.(*coord.JoinRun); join {
		keys.CoSigner = new(coord.Pubkey) // listed as optional
	}
	accounts, err := abi.Accounts(ix.Name(), keys)
	if err != nil {
		panic(err) // TestIDLInstructionList keeps instructions and the ABI in step
	}
	var items []idlAccountItem
	for _, a := range accounts {
		item := idlAccountItem{Name: a.Name, Signer: a.Signer, Writable: a.Writable, Optional: a.Optional}
		if a.Doc != "" {
			item.Docs = []string{a.Doc}
		}
		if a.Fixed {
			item.Address = a.Key.String()
		}
		items = append(items, item)
	}
	return items
}

// The IDL document (Anchor's idl spec 0.1.0, in its field order).
type idlDoc struct {
	Address      string           `json:"address"`
	Metadata     idlMetadata      `json:"metadata"`
	Docs         []string         `json:"docs,omitempty"`
	Instructions []idlInstruction `json:"instructions"`
	Accounts     []idlAccountDef  `json:"accounts"`
	Errors       []idlError       `json:"errors"`
	Types        []idlTypeDef     `json:"types"`
}

type idlMetadata struct {
	Name        string `json:"name"`
	Version     string `json:"version"`
	Spec        string `json:"spec"`
	Description string `json:"description,omitempty"`
}

type idlInstruction struct {
	Name          string           `json:"name"`
	Docs          []string         `json:"docs,omitempty"`
	Discriminator bytesJSON        `json:"discriminator"`
	Accounts      []idlAccountItem `json:"accounts"`
	Args          []idlField       `json:"args"`
}

type idlAccountItem struct {
	Name     string   `json:"name"`
	Docs     []string `json:"docs,omitempty"`
	Writable bool     `json:"writable,omitempty"`
	Signer   bool     `json:"signer,omitempty"`
	Optional bool     `json:"optional,omitempty"`
	Address  string   `json:"address,omitempty"`
}

// idlAccountDef adds size (not in the spec; readers ignore unknown fields):
// the account's data length, discriminator included.
type idlAccountDef struct {
	Name          string    `json:"name"`
	Discriminator bytesJSON `json:"discriminator"`
	Size          int       `json:"size"`
}

type idlError struct {
	Code uint32 `json:"code"`
	Name string `json:"name"`
	Msg  string `json:"msg"`
}

type idlTypeDef struct {
	Name string      `json:"name"`
	Docs []string    `json:"docs,omitempty"`
	Type idlTypeBody `json:"type"`
}

type idlTypeBody struct {
	Kind     string       `json:"kind"`
	Fields   []idlField   `json:"fields,omitempty"`
	Variants []idlVariant `json:"variants,omitempty"`
}

type idlField struct {
	Name string `json:"name"`
	Type any    `json:"type"` // "u8"…, or {"array": [T, n]}, {"option": T}, {"defined": {"name": N}}
}

type idlVariant struct {
	Name string `json:"name"`
}

// bytesJSON writes bytes as an array of numbers (encoding/json would write
// base64), as the spec has them.
type bytesJSON []byte

func (b bytesJSON) MarshalJSON() ([]byte, error) {
	n := make([]int, len(b))
	for i, v := range b {
		n[i] = int(v)
	}
	return json.Marshal(n)
}

func byteArray(n int) any     { return map[string]any{"array": []any{"u8", n}} }
func defined(name string) any { return map[string]any{"defined": map[string]any{"name": name}} }

// idlBuilder turns Go types into IDL types, collecting the named ones.
type idlBuilder struct {
	defs map[string]idlTypeDef
	err  error
}

func (b *idlBuilder) fail(format string, args ...any) {
	if b.err == nil {
		b.err = fmt.Errorf("programs/coordinator: IDL: "+format, args...)
	}
}

func (b *idlBuilder) add(d idlTypeDef) {
	if _, dup := b.defs[d.Name]; dup {
		b.fail("two types named %s", d.Name)
	}
	b.defs[d.Name] = d
}

// fields describes a struct's fields in declaration order, which is the
// order the coordinator's walkers encode them in (the IDL tests decode the
// Go encoder's bytes to prove it).
func (b *idlBuilder) fields(t reflect.Type) []idlField {
	var out []idlField
	pads := 0
	for i := range t.NumField() {
		if t.Field(i).Name == "_" {
			pads++
		}
	}
	pad := 0
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Name == "_" {
			// Padding is zero in every valid encoding; the decoder rejects anything else.
			n := 1
			if f.Type.Kind() == reflect.Array {
				n = f.Type.Len()
			}
			name := "_padding"
			if pads > 1 {
				pad++
				name = fmt.Sprintf("_padding%d", pad)
			}
			out = append(out, idlField{Name: name, Type: byteArray(n)})
			continue
		}
		if !f.IsExported() {
			b.fail("%s.%s is unexported: the instruction or account formats hold only exported fields", t, f.Name)
			continue
		}
		out = append(out, idlField{Name: snakeCase(f.Name), Type: b.typeOf(f.Type)})
	}
	return out
}

var stringer = reflect.TypeFor[fmt.Stringer]()

func (b *idlBuilder) typeOf(t reflect.Type) any {
	if t == reflect.TypeFor[coord.Pubkey]() {
		return "pubkey"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "bool"
	case reflect.Uint8:
		if names := enumVariants(t); names != nil {
			if _, done := b.defs[t.Name()]; !done {
				var vs []idlVariant
				for _, n := range names {
					vs = append(vs, idlVariant{Name: n})
				}
				b.add(idlTypeDef{Name: t.Name(), Type: idlTypeBody{Kind: "enum", Variants: vs}})
			}
			return defined(t.Name())
		}
		return "u8"
	case reflect.Uint16:
		return "u16"
	case reflect.Uint32:
		return "u32"
	case reflect.Uint64:
		return "u64"
	case reflect.Float32:
		return "f32"
	case reflect.Array:
		return map[string]any{"array": []any{b.typeOf(t.Elem()), t.Len()}}
	case reflect.Pointer:
		return map[string]any{"option": b.typeOf(t.Elem())}
	case reflect.Struct:
		if _, done := b.defs[t.Name()]; !done {
			b.defs[t.Name()] = idlTypeDef{Name: t.Name(), Type: idlTypeBody{Kind: "struct", Fields: b.fields(t)}}
		}
		return defined(t.Name())
	}
	b.fail("no IDL type for %s (%s)", t, t.Kind())
	return nil
}

// size is the encoded size of an IDL type without options (the accounts
// have none).
func (b *idlBuilder) size(t any) int {
	switch t := t.(type) {
	case string:
		return map[string]int{"bool": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "f32": 4, "pubkey": 32}[t]
	case map[string]any:
		if a, ok := t["array"].([]any); ok {
			return b.size(a[0]) * a[1].(int)
		}
		if d, ok := t["defined"].(map[string]any); ok {
			def := b.defs[d["name"].(string)]
			if def.Type.Kind == "enum" {
				return 1
			}
			n := 0
			for _, f := range def.Type.Fields {
				n += b.size(f.Type)
			}
			return n
		}
	}
	b.fail("no fixed size for %v", t)
	return 0
}

// enumVariants returns the variant names of a uint8 enum of package
// coordinator, from its String method (which answers "Name(?)" past the last
// variant), or nil for a type without one.
func enumVariants(t reflect.Type) []string {
	if t.Kind() != reflect.Uint8 || !t.Implements(stringer) {
		return nil
	}
	var names []string
	for i := range 256 {
		v := reflect.New(t).Elem()
		v.SetUint(uint64(i))
		s := v.Interface().(fmt.Stringer).String()
		if strings.HasSuffix(s, "(?)") {
			break
		}
		names = append(names, s)
	}
	return names
}

// fieldNames holds the Go field names whose snake case the coordinator's
// walkers spell differently from snakeCase; TestIDLAccountMatchesLayout
// compares every account field name with the walkers' layout table.
var fieldNames = map[string]string{"P2P": "p2p", "Quantize1Bit": "quantize_1bit", "CompressionTopK": "compression_topk", "NKVHeads": "n_kv_heads"}

// snakeCase turns "RunStateStart" into "run_state_start" and "DModel" into
// "d_model" (an upper-case letter starts a word after a lower-case letter or
// a digit, or ends an acronym when a lower-case letter follows).
func snakeCase(name string) string {
	if s, ok := fieldNames[name]; ok {
		return s
	}
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) && (!unicode.IsUpper(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
