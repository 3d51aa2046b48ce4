package abi

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestWellKnownKeys(t *testing.T) {
	if SystemProgram != (coordinator.Pubkey{}) {
		t.Errorf("the system program is %s, want all zeros", SystemProgram)
	}
	if LocalProgramID != coordinator.Pubkey(sha256.Sum256([]byte("psyche/coordinator-program"))) {
		t.Error("LocalProgramID is not sha256(\"psyche/coordinator-program\")")
	}
	if SlotHashes.String() != "SysvarS1otHashes111111111111111111111111111" {
		t.Errorf("SlotHashes = %s", SlotHashes)
	}
}

func TestInstanceRecord(t *testing.T) {
	id, _ := coordinator.ParseRunID("run-1")
	if seeds := InstanceSeeds(id); len(seeds) != 2 || string(seeds[0]) != "coordinator" || string(seeds[1]) != "run-1" {
		t.Fatalf("seeds %q", seeds)
	}
	acct := coordinator.Pubkey(sha256.Sum256([]byte("account")))
	rec := append(InstanceDiscriminator[:], 254)
	rec = append(rec, make([]byte, 7)...)
	rec = append(rec, id[:]...)
	rec = append(rec, acct[:]...)
	got, err := DecodeInstance(rec)
	if err != nil || got.Bump != 254 || got.RunID != id || got.Coordinator != acct {
		t.Fatalf("DecodeInstance = %+v, %v", got, err)
	}
	for _, tt := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", rec[:79], "79 bytes"},
		{"long", append(bytes.Clone(rec), 0), "81 bytes"},
		{"discriminator", append([]byte{1}, rec[1:]...), "discriminator"},
		{"reserved", func() []byte { b := bytes.Clone(rec); b[12] = 1; return b }(), "reserved"},
	} {
		if _, err := DecodeInstance(tt.b); !errors.Is(err, ErrInstance) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrInstance with %q", tt.name, err, tt.want)
		}
	}
}

// FuzzDecodeInstance: instance bytes come from the chain; decoding never
// panics and what it accepts is exactly a record it would write.
func FuzzDecodeInstance(f *testing.F) {
	f.Add(append(InstanceDiscriminator[:], make([]byte, InstanceSize-8)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeInstance(b)
		if err != nil {
			return
		}
		again := append(InstanceDiscriminator[:], in.Bump)
		again = append(again, make([]byte, 7)...)
		again = append(again, in.RunID[:]...)
		again = append(again, in.Coordinator[:]...)
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted %x, which re-encodes as %x", b, again)
		}
	})
}

func TestAccounts(t *testing.T) {
	k := Keys{Instance: coordinator.Pubkey{1}, Coordinator: coordinator.Pubkey{2}, Sender: coordinator.Pubkey{3}}
	co := coordinator.Pubkey{4}
	describe := func(as []Account) string {
		var b strings.Builder
		for _, a := range as {
			b.WriteString(a.Name)
			if a.Signer {
				b.WriteString("+s")
			}
			if a.Writable {
				b.WriteString("+w")
			}
			b.WriteString(" ")
		}
		return strings.TrimSpace(b.String())
	}
	for _, tt := range []struct {
		name string
		co   *coordinator.Pubkey
		want string
	}{
		{"init_coordinator", nil, "instance+w coordinator+w authority+s system_program"},
		{"update", nil, "instance coordinator+w authority+s"},
		{"set_paused", nil, "instance coordinator+w authority+s"},
		{"join_run", nil, "instance coordinator+w client+s"},
		{"join_run", &co, "instance coordinator+w client+s join_authority+s"},
		{"tick", nil, "instance coordinator+w sender+s slot_hashes"},
		{"warmup_witness", nil, "instance coordinator+w witness+s slot_hashes"},
		{"witness", nil, "instance coordinator+w witness+s"},
		{"health_check", nil, "instance coordinator+w client+s"},
		{"checkpoint", nil, "instance coordinator+w checkpointer+s"},
		{"free_coordinator", nil, "instance+w coordinator+w authority+s+w"},
	} {
		kk := k
		kk.CoSigner = tt.co
		as, err := Accounts(tt.name, kk)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := describe(as); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
		if as[0].Key != k.Instance || as[1].Key != k.Coordinator || as[2].Key != k.Sender {
			t.Errorf("%s: the run's keys are not in place: %+v", tt.name, as)
		}
	}
	// Every instruction the coordinator knows has its accounts here.
	for _, name := range coordinator.InstructionNames() {
		if _, err := Accounts(name, k); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Accounts("transfer", k); err == nil {
		t.Error("an unknown instruction has accounts")
	}
	k.CoSigner = &co
	if _, err := Accounts("update", k); err == nil || !strings.Contains(err.Error(), "only join_run") {
		t.Errorf("a co-signed update: %v, want a refusal", err)
	}
}
