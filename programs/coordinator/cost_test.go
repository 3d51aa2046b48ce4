package coordinator_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os/exec"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/soltest"
	"github.com/psyche-go/psyche/programs/abi"
)

// TestOnChainAt256 fills a run to 256 clients through real transactions and
// measures the compute units of the instructions whose cost grows with the
// number of clients (the join that fills the list, the tick that starts the
// epoch, warmup and round witnesses with the full 90-round shuffle), checking
// the account against the Go coordinator after each of them.
func TestOnChainAt256(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the local validator and sends 260 transactions")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	r := startOnChain(t, "psyche/coordinator-program-cost", "cost-run", 100_000_000_000)
	c, admin, instance, coordKey := r.c, r.admin, r.instance, r.coordKey
	slotHashes := abi.SlotHashes[:]
	accounts := func(sender ed25519.PrivateKey, extra ...soltest.Meta) []soltest.Meta {
		return append([]soltest.Meta{{Key: instance, Signer: false, Writable: true}, {Key: coordKey, Signer: false, Writable: true}, {Key: soltest.Pub(sender), Signer: true, Writable: true}}, extra...)
	}
	check := r.check
	k, m := testConfig(), testModel()
	k.InitMinClients, k.MinClients, k.WitnessNodes, k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd = 256, 32, 32, 256, 512
	k.WaitingForMembersExtraTime, k.WarmupTime, k.MaxRoundTrainTime, k.EpochTime = 1, 60, 60, 600
	for _, ix := range []coord.Instruction{&coord.Update{Config: &k, Model: &m}, &coord.SetPaused{Paused: false}} {
		c.send(ix.Name(), admin, nil, soltest.Instruction{Program: c.program, Accounts: accounts(admin), Data: coord.EncodeInstruction(ix)})
		check(ix.Name(), ix, coord.Pubkey(soltest.Pub(admin)))
	}

	clients := map[coord.Pubkey]ed25519.PrivateKey{}
	c.unique = true
	for i := 0; i < 256; i++ {
		_, key, _ := ed25519.GenerateKey(nil)
		id := coord.ClientID{Signer: coord.Pubkey(soltest.Pub(key)), P2P: coord.Pubkey(sha256.Sum256([]byte(fmt.Sprint("p2p", i))))}
		clients[id.Signer] = key
		join := &coord.JoinRun{ID: id}
		label := "join"
		if i == 255 {
			label = "join (256th)"
		}
		c.send(label, admin, []ed25519.PrivateKey{key}, soltest.Instruction{Program: c.program, Accounts: accounts(key), Data: coord.EncodeInstruction(join)})
		if i == 0 || i == 255 {
			check(label, join, id.Signer)
		} else {
			r.goAcct = c.account(coordKey)
		}
	}
	c.unique = false
	tick := soltest.Instruction{Program: c.program, Accounts: accounts(admin, soltest.Meta{Key: slotHashes, Signer: false, Writable: false}), Data: coord.EncodeInstruction(&coord.Tick{})}
	for ticks := 0; ; ticks++ {
		if ticks == 10 {
			t.Fatal("the epoch never started")
		}
		c.setClock(c.clock() + 1) // the validator's clock is manual
		before := c.account(coordKey)
		c.send("tick (start epoch, 256)", admin, nil, tick)
		if after := c.account(coordKey); string(before) != string(after) {
			check("tick", &coord.Tick{}, coord.Pubkey(soltest.Pub(admin)))
			break
		}
	}

	// Witnesses: every warmup witness (the last one starts the first round),
	// then one round witness.
	witness := func(label string, warmup bool) {
		s, _ := coord.DecodeAccount(r.goAcct)
		r := s.CurrentRound()
		for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
			p := s.Config.WitnessProofFor(r, i)
			dup := false
			for j := 0; j < int(r.WitnessesLen); j++ {
				dup = dup || r.Witnesses[j].Proof.Index == i
			}
			if !p.IsWitness || dup {
				continue
			}
			key := clients[s.Epoch.Clients[i].ID.Signer]
			rep := witnessReport(s, i, uint64(i), nil)
			var ix coord.Instruction = &coord.WitnessRound{Report: rep}
			if warmup {
				ix = &coord.WarmupWitness{Report: rep}
			}
			c.send(label, admin, []ed25519.PrivateKey{key}, soltest.Instruction{Program: c.program, Accounts: accounts(key, soltest.Meta{Key: slotHashes, Signer: false, Writable: false}), Data: coord.EncodeInstruction(ix)})
			check(label, ix, s.Epoch.Clients[i].ID.Signer)
			return
		}
		t.Fatalf("%s: no witness left", label)
	}
	for n := 0; ; n++ {
		s, _ := coord.DecodeAccount(r.goAcct)
		if s.RunState != coord.Warmup {
			break
		}
		if n > 32 {
			t.Fatal("warmup never ended")
		}
		c.unique = true
		witness("warmup_witness (256)", true)
	}
	witness("witness (256)", false)
	t.Logf("compute units at 256 clients (simulated): %v", c.units)
	for what, cu := range c.units {
		if cu > 200_000 {
			t.Errorf("%s: %d CU, over the default 200,000 per instruction", what, cu)
		}
	}
}
