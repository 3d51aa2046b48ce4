package coordinator_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	coord "github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/soltest"
	"github.com/psyche-go/psyche/programs/abi"
	"github.com/psyche-go/psyche/programs/validator"
)

// TestOnChain runs the committed coordinator.so on the local validator
// (LiteSVM: the real SBPF loader and runtime) through real transactions —
// create + init, update, resume, join, ticks into warmup, a warmup witness,
// a rejected update, pause and free — and after each one compares the
// account bytes with the Go coordinator given the same time and seed (read
// back from the account the program wrote).
func TestOnChain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the local validator")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	// 1. create_account + fund the instance PDA + init_coordinator.
	r := startOnChain(t, "psyche/coordinator-program-test", "chain-run", 10_000_000_000)
	c, admin, check := r.c, r.admin, r.check
	programID, instance, coordKey := r.program, r.instance, r.coordKey
	_, client, _ := ed25519.GenerateKey(nil)
	c.rpc.Call(t, "requestAirdrop", coord.Base58(soltest.Pub(client)), 1_000_000_000)
	system, slotHashes := abi.SystemProgram[:], abi.SlotHashes[:]
	accounts := func(sender ed25519.PrivateKey, writableSender bool, extra ...soltest.Meta) []soltest.Meta {
		return append([]soltest.Meta{{Key: instance, Signer: false, Writable: true}, {Key: coordKey, Signer: false, Writable: true}, {Key: soltest.Pub(sender), Signer: true, Writable: writableSender}}, extra...)
	}
	rec, err := abi.DecodeInstance(c.account(instance))
	if err != nil || rec.Bump != r.instanceBump || rec.RunID != r.runID || !bytes.Equal(rec.Coordinator[:], coordKey) {
		t.Fatalf("instance record %+v, %v", rec, err)
	}

	// 2. update (config + model), and an update by someone else (refused
	// with the coordinator's error code).
	k, m := testConfig(), testModel()
	k.InitMinClients, k.MinClients, k.WitnessNodes, k.GlobalBatchSizeEnd = 1, 1, 1, 12
	k.WaitingForMembersExtraTime, k.WarmupTime = 1, 30
	update := &coord.Update{Config: &k, Model: &m}
	c.send("update", admin, nil, soltest.Instruction{Program: c.program, Accounts: accounts(admin, false), Data: coord.EncodeInstruction(update)})
	check("update", update, coord.Pubkey(soltest.Pub(admin)))
	if code := c.fail("update by a client", client, nil, soltest.Instruction{Program: c.program, Accounts: accounts(client, false), Data: coord.EncodeInstruction(update)}); code != coord.ErrUnauthorized.Code {
		t.Fatalf("update by a client: got %d, want %d", code, coord.ErrUnauthorized.Code)
	}

	// 3. resume, 4. join.
	resume := &coord.SetPaused{Paused: false}
	c.send("resume", admin, nil, soltest.Instruction{Program: c.program, Accounts: accounts(admin, false), Data: coord.EncodeInstruction(resume)})
	check("resume", resume, coord.Pubkey(soltest.Pub(admin)))
	id := coord.ClientID{Signer: coord.Pubkey(soltest.Pub(client)), P2P: key("client p2p")}
	join := &coord.JoinRun{ID: id}
	c.send("join", client, nil, soltest.Instruction{Program: c.program, Accounts: accounts(client, false), Data: coord.EncodeInstruction(join)})
	check("join", join, id.Signer)

	// 5. tick until the epoch starts, moving the chain's (manual) clock a
	// second before each tick. A tick without the SlotHashes sysvar is
	// refused.
	if code := c.fail("tick without SlotHashes", client, nil, soltest.Instruction{Program: c.program, Accounts: accounts(client, false), Data: coord.EncodeInstruction(&coord.Tick{})}); code != 0 {
		t.Fatalf("tick without SlotHashes: custom error %d, want NotEnoughAccountKeys", code)
	}
	tick := soltest.Instruction{Program: c.program, Accounts: accounts(client, false, soltest.Meta{Key: slotHashes, Signer: false, Writable: false}), Data: coord.EncodeInstruction(&coord.Tick{})}
	for ticks := 0; ; ticks++ {
		if ticks == 10 {
			t.Fatal("the run never left WaitingForMembers")
		}
		c.setClock(c.clock() + 1)
		before := c.account(coordKey)
		if rerr := c.submit("tick", client, nil, tick); rerr != nil && customCode(rerr) != coord.ErrNothingDue.Code {
			t.Fatalf("tick: %s %s", rerr.Message, rerr.Data)
		}
		after := c.account(coordKey)
		if !bytes.Equal(before, after) {
			check("tick", &coord.Tick{}, id.Signer)
			s, _ := coord.DecodeAccount(after)
			if s.RunState == coord.Warmup {
				break
			}
		}
	}

	// 6. the warmup witness: swap-or-not proofs and the round seed on chain.
	s, _ := coord.DecodeAccount(r.goAcct)
	rep := witnessReport(s, 0, 42, nil)
	ww := &coord.WarmupWitness{Report: rep}
	c.send("warmup_witness", client, nil, soltest.Instruction{Program: c.program, Accounts: accounts(client, false, soltest.Meta{Key: slotHashes, Signer: false, Writable: false}), Data: coord.EncodeInstruction(ww)})
	check("warmup_witness", ww, id.Signer)
	if s, _ := coord.DecodeAccount(r.goAcct); s.RunState != coord.RoundTrain {
		t.Fatalf("after the warmup witness: %s, want RoundTrain", s.RunState)
	}

	// 7. pause (pending while training), then free is refused while active.
	pause := &coord.SetPaused{Paused: true}
	c.send("pause", admin, nil, soltest.Instruction{Program: c.program, Accounts: accounts(admin, false), Data: coord.EncodeInstruction(pause)})
	check("pause", pause, coord.Pubkey(soltest.Pub(admin)))
	free := soltest.Instruction{Program: c.program, Accounts: accounts(admin, true), Data: coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free while active", admin, nil, free); code != coord.ErrNotHalted.Code {
		t.Fatalf("free while active: got %d, want %d", code, coord.ErrNotHalted.Code)
	}

	// 8. a second run, freed while still uninitialized: both accounts close
	// and their lamports go to the authority.
	_, acct2, _ := ed25519.GenerateKey(nil)
	var runID2 [coord.MaxRunIDLen]byte
	copy(runID2[:], "chain-run-2")
	instance2, _ := instanceOf("chain-run-2", programID)
	accounts2 := func(sender ed25519.PrivateKey, writableSender bool, extra ...soltest.Meta) []soltest.Meta {
		return append([]soltest.Meta{{Key: instance2, Signer: false, Writable: true}, {Key: soltest.Pub(acct2), Signer: false, Writable: true}, {Key: soltest.Pub(sender), Signer: true, Writable: writableSender}}, extra...)
	}
	createData, transfer := r.createData(), r.transferData()
	init2 := &coord.InitCoordinator{MainAuthority: coord.Pubkey(soltest.Pub(admin)), RunID: runID2}
	// The instance of the first run does not fit the second run id.
	if code := c.fail("init with another run's PDA", admin, []ed25519.PrivateKey{acct2},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: soltest.Pub(acct2), Signer: true, Writable: true}}, Data: createData},
		soltest.Instruction{Program: c.program, Accounts: append([]soltest.Meta{{Key: instance, Signer: false, Writable: true}, {Key: soltest.Pub(acct2), Signer: false, Writable: true}, {Key: soltest.Pub(admin), Signer: true, Writable: true}}, soltest.Meta{Key: system, Signer: false, Writable: false}), Data: coord.EncodeInstruction(init2)}); code != 0 {
		t.Fatalf("init with another run's PDA: custom error %d, want a seeds error", code)
	}
	create2 := soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: soltest.Pub(acct2), Signer: true, Writable: true}}, Data: createData}
	fund2 := func(lamports uint64) soltest.Instruction {
		d := binary.LittleEndian.AppendUint32(nil, 2)
		return soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: instance2, Signer: false, Writable: true}},
			Data: binary.LittleEndian.AppendUint64(d, lamports)}
	}
	// An instance left unfunded would be dropped at the end of the
	// transaction and strand the coordinator account's rent (nothing could
	// free it): the program refuses it, and the whole transaction with it.
	if code := c.fail("init without funding the instance", admin, []ed25519.PrivateKey{acct2}, create2,
		soltest.Instruction{Program: c.program, Accounts: accounts2(admin, true, soltest.Meta{Key: system, Signer: false, Writable: false}), Data: coord.EncodeInstruction(init2)}); code != coord.ErrInstanceNotFunded.Code {
		t.Fatalf("init without funding the instance: custom error %d, want %d (InstanceNotFunded)", code, coord.ErrInstanceNotFunded.Code)
	}
	// Funded below the rent-exempt minimum: the runtime refuses an account
	// that goes from empty to rent-paying.
	if rerr := c.submit("init with an underfunded instance", admin, []ed25519.PrivateKey{acct2}, create2, fund2(1),
		soltest.Instruction{Program: c.program, Accounts: accounts2(admin, true, soltest.Meta{Key: system, Signer: false, Writable: false}), Data: coord.EncodeInstruction(init2)}); rerr == nil || !bytes.Contains(rerr.Data, []byte("InsufficientFundsForRent")) {
		t.Fatalf("init with an underfunded instance: %v, want InsufficientFundsForRent", rerr)
	}
	// Only the main authority may sign its run's creation (here the admin
	// pays for the accounts, and the client signs an init naming the admin).
	if code := c.fail("init signed by someone else", admin, []ed25519.PrivateKey{acct2, client}, create2, fund2(c.rent(abi.InstanceSize)),
		soltest.Instruction{Program: c.program, Accounts: accounts2(client, true, soltest.Meta{Key: system, Signer: false, Writable: false}), Data: coord.EncodeInstruction(init2)}); code != coord.ErrUnauthorized.Code {
		t.Fatalf("init signed by someone else: custom error %d, want %d (Unauthorized)", code, coord.ErrUnauthorized.Code)
	}
	if a, b := c.account(soltest.Pub(acct2)), c.account(instance2); a != nil || b != nil {
		t.Fatalf("after the refused inits: coordinator account %d bytes, instance %d bytes, want neither created", len(a), len(b))
	}
	c.send("init 2", admin, []ed25519.PrivateKey{acct2},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: soltest.Pub(acct2), Signer: true, Writable: true}}, Data: createData},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: instance2, Signer: false, Writable: true}}, Data: transfer},
		soltest.Instruction{Program: c.program, Accounts: accounts2(admin, true, soltest.Meta{Key: system, Signer: false, Writable: false}), Data: coord.EncodeInstruction(init2)})
	free2 := soltest.Instruction{Program: c.program, Accounts: accounts2(client, true), Data: coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free by a client", client, nil, free2); code != coord.ErrUnauthorized.Code {
		t.Fatalf("free by a client: got %d, want %d", code, coord.ErrUnauthorized.Code)
	}
	// Someone else's instance account with this coordinator account.
	wrong := soltest.Instruction{Program: c.program, Accounts: []soltest.Meta{{Key: instance, Signer: false, Writable: true}, {Key: soltest.Pub(acct2), Signer: false, Writable: true}, {Key: soltest.Pub(admin), Signer: true, Writable: true}}, Data: coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free with the other run's instance", admin, nil, wrong); code != 0 {
		t.Fatalf("free with the other run's instance: custom error %d, want InvalidAccountData", code)
	}
	c.send("free", admin, nil, soltest.Instruction{Program: c.program, Accounts: accounts2(admin, true), Data: coord.EncodeInstruction(&coord.FreeCoordinator{})})
	if a, b := c.account(soltest.Pub(acct2)), c.account(instance2); a != nil || b != nil {
		t.Fatalf("after free: coordinator account %d bytes, instance %d bytes, want both closed", len(a), len(b))
	}
	t.Logf("compute units (simulated): %v", c.units)
}

// onChain is a run created on the local validator by startOnChain, and Go's
// view of its account.
type onChain struct {
	t            *testing.T
	c            *chain
	program      []byte
	admin        ed25519.PrivateKey
	runID        [coord.MaxRunIDLen]byte
	instance     []byte
	instanceBump byte
	coordKey     []byte
	goAcct       []byte
}

// startOnChain starts the local validator (manual clock) with the committed
// coordinator.so at sha256(programSeed), funds an admin key with lamports
// and creates the run: system create_account + fund the instance PDA +
// init_coordinator in one transaction, checked against Go.
func startOnChain(t *testing.T, programSeed, run string, lamports uint64) *onChain {
	t.Helper()
	programID := sha256.Sum256([]byte(programSeed))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	v, err := validator.Start(ctx, validator.WithSlotDuration(50*time.Millisecond), validator.WithManualClock(),
		validator.WithProgram(coord.Base58(programID[:]), filepath.Join(".", "coordinator.so")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	r := &onChain{t: t, c: &chain{t: t, rpc: &soltest.RPC{URL: v.RPC}, program: programID[:]}, program: programID[:],
		goAcct: make([]byte, coord.AccountSize)}
	var acctKey ed25519.PrivateKey
	_, r.admin, _ = ed25519.GenerateKey(nil)
	_, acctKey, _ = ed25519.GenerateKey(nil)
	r.coordKey = soltest.Pub(acctKey)
	copy(r.runID[:], run)
	r.instance, r.instanceBump = instanceOf(run, r.program)
	r.c.rpc.Call(t, "requestAirdrop", coord.Base58(soltest.Pub(r.admin)), lamports)
	init := &coord.InitCoordinator{MainAuthority: coord.Pubkey(soltest.Pub(r.admin)), RunID: r.runID}
	accounts, err := abi.Accounts(init.Name(), abi.Keys{Instance: coord.Pubkey(r.instance), Coordinator: coord.Pubkey(r.coordKey),
		Sender: coord.Pubkey(soltest.Pub(r.admin))})
	if err != nil {
		t.Fatal(err)
	}
	var metas []soltest.Meta
	for _, a := range accounts {
		metas = append(metas, soltest.Meta{Key: append([]byte(nil), a.Key[:]...), Signer: a.Signer, Writable: a.Writable})
	}
	system := abi.SystemProgram[:]
	r.c.send("init", r.admin, []ed25519.PrivateKey{acctKey},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(r.admin), Signer: true, Writable: true}, {Key: r.coordKey, Signer: true, Writable: true}}, Data: r.createData()},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(r.admin), Signer: true, Writable: true}, {Key: r.instance, Signer: false, Writable: true}}, Data: r.transferData()},
		soltest.Instruction{Program: r.program, Accounts: metas, Data: coord.EncodeInstruction(init)})
	r.check("init", init, coord.Pubkey(soltest.Pub(r.admin)))
	return r
}

// createData is the system program's create_account of a coordinator
// account owned by the program, rent-exempt.
func (r *onChain) createData() []byte {
	d := binary.LittleEndian.AppendUint32(nil, 0)
	d = binary.LittleEndian.AppendUint64(d, r.c.rent(coord.AccountSize))
	d = binary.LittleEndian.AppendUint64(d, uint64(coord.AccountSize))
	return append(d, r.program...)
}

// transferData is the system program's transfer of the instance record's
// rent.
func (r *onChain) transferData() []byte {
	d := binary.LittleEndian.AppendUint32(nil, 2)
	return binary.LittleEndian.AppendUint64(d, r.c.rent(abi.InstanceSize))
}

// check compares the account the program wrote with the Go coordinator's
// result for ix, given the time and seed the program recorded.
func (r *onChain) check(label string, ix coord.Instruction, sender coord.Pubkey) {
	r.t.Helper()
	onChain := r.c.account(r.coordKey)
	s, err := coord.DecodeAccount(onChain)
	if err != nil {
		r.t.Fatalf("%s: the program wrote an account Go cannot decode: %v", label, err)
	}
	want := goRun(r.goAcct, coord.EncodeInstruction(ix), coord.Context{Sender: sender, Now: s.RunStateStart, Seed: drawnSeed(s)})
	if want.code != 0 {
		r.t.Fatalf("%s: Go rejects what the program accepted: %s", label, codeName(want.code))
	}
	if d := diff(want, result{acct: onChain}); d != "" {
		r.t.Fatalf("%s: %s", label, d)
	}
	r.goAcct = onChain
}

// drawnSeed is the seed the program drew for the instruction that wrote s,
// where it matters: a warmup's is its round's, and a training round that
// starts stores its draw as the next round's seed.
func drawnSeed(s *coord.Coordinator) uint64 {
	if s.RunState == coord.Warmup {
		return s.CurrentRound().RandomSeed
	}
	return s.NextRoundSeed
}

// chain is a minimal Solana RPC client for the test.
type chain struct {
	t       *testing.T
	rpc     *soltest.RPC
	program []byte
	units   map[string]uint64
	unique  bool   // the transactions differ anyway: no need to wait for a new blockhash
	last    string // the signature of the last transaction sent
}

func (c *chain) rent(n int) uint64 {
	var l uint64
	c.rpc.Decode(c.t, c.rpc.Call(c.t, "getMinimumBalanceForRentExemption", n), &l)
	return l
}

func (c *chain) blockhash() []byte {
	var latest struct{ Value struct{ Blockhash string } }
	c.rpc.Decode(c.t, c.rpc.Call(c.t, "getLatestBlockhash"), &latest)
	return soltest.Key(c.t, latest.Value.Blockhash)
}

func (c *chain) account(k []byte) []byte {
	var info struct {
		Value *struct{ Data []string }
	}
	c.rpc.Decode(c.t, c.rpc.Call(c.t, "getAccountInfo", coord.Base58(k), map[string]any{"encoding": "base64"}), &info)
	if info.Value == nil {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(info.Value.Data[0])
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// submit sends a transaction and returns the RPC error, if any. Each one
// waits for a new blockhash, so identical transactions get new signatures.
func (c *chain) submit(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...soltest.Instruction) *soltest.RPCError {
	old := c.blockhash()
	bh := old
	for i := 0; i < 100 && bytes.Equal(bh, old) && !c.unique; i++ {
		time.Sleep(20 * time.Millisecond)
		bh = c.blockhash()
	}
	tx := soltest.CompileTx(payer, signers, bh, ixs...)
	var sim struct {
		Value struct{ UnitsConsumed uint64 }
	}
	if raw, err := c.rpc.Try("simulateTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}); err == nil {
		json.Unmarshal(raw, &sim)
	}
	sig, rerr := c.rpc.Try("sendTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"})
	if rerr == nil {
		json.Unmarshal(sig, &c.last)
	}
	if rerr == nil && len(ixs) > 0 {
		if c.units == nil {
			c.units = map[string]uint64{}
		}
		c.units[what] = sim.Value.UnitsConsumed
	}
	return rerr
}

func (c *chain) send(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...soltest.Instruction) {
	c.t.Helper()
	if err := c.submit(what, payer, signers, ixs...); err != nil {
		c.t.Fatalf("%s: %s %s", what, err.Message, err.Data)
	}
}

// fail sends a transaction that must fail and returns its custom error code
// (0 for a failure that is not a custom program error).
func (c *chain) fail(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...soltest.Instruction) uint32 {
	c.t.Helper()
	err := c.submit(what, payer, signers, ixs...)
	if err == nil {
		c.t.Fatalf("%s: accepted", what)
	}
	return customCode(err)
}

// customCode is the custom program error in a refused transaction's
// preflight error (0 if it is not one).
func customCode(err *soltest.RPCError) uint32 {
	var data struct {
		Err struct {
			InstructionError []json.RawMessage
		}
	}
	json.Unmarshal(err.Data, &data)
	if len(data.Err.InstructionError) == 2 {
		var custom struct{ Custom uint32 }
		if json.Unmarshal(data.Err.InstructionError[1], &custom) == nil {
			return custom.Custom
		}
	}
	return 0
}

// instanceOf is a run's instance PDA (the program's seeds, Solana's
// derivation written independently in soltest) and its bump.
func instanceOf(runID string, program []byte) ([]byte, byte) {
	id, err := coord.ParseRunID(runID)
	if err != nil {
		panic(err)
	}
	return soltest.FindProgramAddress(abi.InstanceSeeds(id), program)
}
