package coordinator

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

func TestDiscriminatorsAreAnchorStyle(t *testing.T) {
	// Values computed independently (python hashlib) for the preimages.
	for _, tc := range []struct {
		got  [8]byte
		want string
	}{
		{InstructionDiscriminator("tick"), "5c4f2c0865503f0f"},
		{InstructionDiscriminator("join_run"), "48a07d666a86f64b"},
		{AccountDiscriminator, "ef21b1372c9b562b"},
	} {
		if hex.EncodeToString(tc.got[:]) != tc.want {
			t.Errorf("discriminator %x, want %s", tc.got, tc.want)
		}
	}
}

// TestLayoutTable pins every field offset in testdata/account_layout.golden: the
// C program mirrors this table, so a change here must be deliberate.
func TestLayoutTable(t *testing.T) {
	fields, err := LayoutTable()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# account size %d bytes; offset size [count] name\n", AccountSize)
	for _, f := range fields {
		if f.Count > 1 {
			fmt.Fprintf(&b, "%7d %6d [%d] %s\n", f.Offset, f.Size, f.Count, f.Name)
		} else {
			fmt.Fprintf(&b, "%7d %6d %s\n", f.Offset, f.Size, f.Name)
		}
	}
	path := "testdata/account_layout.golden"
	if *rewrite {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("account layout changed; review and run with -rewrite:\n%s", b.String())
	}
	if AccountSize%8 != 0 {
		t.Errorf("account size %d is not a multiple of 8", AccountSize)
	}
}

// TestGoStructsMatchLayout checks that the Go structs have exactly the
// account's layout on 64-bit machines: the explicit padding fields are right
// and a C struct with natural alignment has the same bytes.
func TestGoStructsMatchLayout(t *testing.T) {
	if unsafe.Alignof(uint64(0)) != 8 {
		t.Skip("uint64 is not 8-aligned on this architecture")
	}
	if got := int(unsafe.Sizeof(Coordinator{})) + 16; got != AccountSize {
		t.Errorf("Go struct is %d bytes + 16 header, account is %d", got-16, AccountSize)
	}
	fields, _ := LayoutTable()
	offset := map[string]int{}
	for _, f := range fields {
		offset[f.Name] = f.Offset - 16 // the Go struct starts at the nonce
	}
	var s Coordinator
	base := uintptr(unsafe.Pointer(&s))
	for name, p := range map[string]unsafe.Pointer{
		"nonce":                           unsafe.Pointer(&s.Nonce),
		"run_state_start":                 unsafe.Pointer(&s.RunStateStart),
		"config.total_steps":              unsafe.Pointer(&s.Config.TotalSteps),
		"model.optimizer.epsilon":         unsafe.Pointer(&s.Model.Optimizer.Epsilon),
		"progress.epoch_start_data_index": unsafe.Pointer(&s.Progress.EpochStartDataIndex),
		"epoch.rounds":                    unsafe.Pointer(&s.Epoch.Rounds),
		"epoch.rounds[0].data_index":      unsafe.Pointer(&s.Epoch.Rounds[0].DataIndex),
		"epoch.clients":                   unsafe.Pointer(&s.Epoch.Clients),
		"epoch.start_timestamp":           unsafe.Pointer(&s.Epoch.StartTimestamp),
		"epoch.checkpointed":              unsafe.Pointer(&s.Epoch.Checkpointed),
		"pending_len":                     unsafe.Pointer(&s.PendingLen),
		"next_round_seed":                 unsafe.Pointer(&s.NextRoundSeed),
	} {
		want, ok := offset[name]
		if !ok {
			t.Fatalf("no layout row %q", name)
		}
		if got := int(uintptr(p) - base); got != want {
			t.Errorf("%s: Go offset %d, layout offset %d", name, got, want)
		}
	}
}

func TestAccountRoundTrip(t *testing.T) {
	for _, s := range sampleStates(t) {
		b := s.MarshalAccount()
		if len(b) != AccountSize {
			t.Fatalf("encoded %d bytes", len(b))
		}
		got, err := DecodeAccount(b)
		if err != nil {
			t.Fatalf("%s: %v", s.Describe(), err)
		}
		if *got != *s {
			t.Fatalf("%s: decoded state differs", s.Describe())
		}
		if !bytes.Equal(got.MarshalAccount(), b) {
			t.Fatal("re-encoding differs")
		}
		if !IsAccount(b) {
			t.Fatal("IsAccount false for an account")
		}
	}
}

// offsetOf returns the account offset of a layout row.
func offsetOf(t *testing.T, name string) int {
	fields, _ := LayoutTable()
	for _, f := range fields {
		if f.Name == name {
			return f.Offset
		}
	}
	t.Fatalf("no layout row %q", name)
	return 0
}

func TestDecodeAccountRejects(t *testing.T) {
	good := sampleStates(t)[2].MarshalAccount()
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrWrongSize},
		{"short", good[:AccountSize-1], ErrWrongSize},
		{"long", append(bytes.Clone(good), 0), ErrWrongSize},
		{"discriminator", mutate(func(b []byte) []byte { b[0] ^= 1; return b }), ErrWrongDiscriminator},
		{"version", mutate(func(b []byte) []byte { b[8] = 1; return b }), ErrWrongVersion}, // the layout before the store
		{"header padding", mutate(func(b []byte) []byte { b[13] = 1; return b }), ErrMalformed},
		{"run state", mutate(func(b []byte) []byte { b[offsetOf(t, "run_state")] = 8; return b }), ErrMalformed},
		{"bool", mutate(func(b []byte) []byte { b[offsetOf(t, "pending_pause")] = 2; return b }), ErrMalformed},
		{"clients len", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.clients_len")+1] = 2; return b }), ErrMalformed},
		{"exited len", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.exited_len")+1] = 3; return b }), ErrMalformed},
		{"pending len", mutate(func(b []byte) []byte {
			b[offsetOf(t, "pending_len")] = 0xff
			b[offsetOf(t, "pending_len")+1] = 1
			return b
		}), ErrMalformed},
		{"current round", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.current_round")] = 4; return b }), ErrMalformed},
		{"witnesses len", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.rounds[0].witnesses_len")] = 33; return b }), ErrMalformed},
		{"client state", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.clients[0].state")] = 4; return b }), ErrMalformed},
		{"client padding", mutate(func(b []byte) []byte { b[offsetOf(t, "epoch.clients[0].state")+1] = 1; return b }), ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAccount(tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// sampleStates runs the transcript harness through a typical run and keeps a
// snapshot of every distinct run state.
func sampleStates(t testing.TB) []*Coordinator {
	h := newHarness()
	var out []*Coordinator
	keep := func() { c := *h.c; out = append(out, &c) }
	for _, cmd := range []string{"init run=sample", "config", "resume t=0", "join alice bob carol dave t=1", "run until=2"} {
		h.run(t, cmd)
		keep()
	}
	for _, cmd := range []string{"warmup-witness witnesses t=3", "witness witnesses t=4 missing=dave", "run until=9",
		"health-check alice dave t=10", "witness witnesses t=11", "run until=16", "pause t=17", "witness witnesses t=18",
		"run until=23", "checkpoint elected t=24", "run until=25"} {
		h.run(t, cmd)
		keep()
	}
	return out
}

// TestDocsAccountSize keeps the documented figure for the account size in
// step with the layout (docs/architecture.md): an account created at a
// wrong size is refused with WrongSize, so a stale figure misleads whoever
// creates one by hand.
func TestDocsAccountSize(t *testing.T) {
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	n := fmt.Sprint(AccountSize)
	want := "The account is " + n[:len(n)-3] + "," + n[len(n)-3:] + " bytes"
	if !strings.Contains(string(doc), want) {
		t.Fatalf("docs/architecture.md does not say %q", want)
	}
}

func TestDecodeAccountHead(t *testing.T) {
	s := &Coordinator{Nonce: 0x0102030405060708, RunState: RoundWitness}
	full := s.MarshalAccount()
	nonce, st, err := DecodeAccountHead(full[:AccountHeadSize])
	if err != nil || nonce != s.Nonce || st != s.RunState {
		t.Fatalf("head: nonce %x state %v err %v", nonce, st, err)
	}
	if _, _, err := DecodeAccountHead(full[:AccountHeadSize-1]); !errors.Is(err, ErrWrongSize) {
		t.Fatalf("short head: %v", err)
	}
	full[0] ^= 1
	if _, _, err := DecodeAccountHead(full); !errors.Is(err, ErrWrongDiscriminator) {
		t.Fatalf("bad discriminator: %v", err)
	}
}
