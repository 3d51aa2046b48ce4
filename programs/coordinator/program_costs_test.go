package coordinator_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coord "github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/soltest"
	"github.com/psyche-go/psyche/programs/validator"
)

var (
	costsReport  = flag.Bool("costs", false, "print the compute units of every instruction at -costs.clients (scripts/bench-program)")
	costsClients = flag.String("costs.clients", "4,64,256", "client counts of the -costs table (each at least 4)")
)

const (
	// costSlot is the validator's slot: the chain clock moves once a slot.
	costSlot = 50 * time.Millisecond
	// defaultBudget is the compute units an instruction gets when its
	// transaction asks for no more; witnessTarget is the target for
	// a witness report.
	defaultBudget = 200_000
	witnessTarget = 60_000
)

// costRows are the table's rows in the order a run meets them. A label sent
// several times (joins, witnesses) keeps its most expensive instance.
var costRows = []struct {
	label   string
	witness bool // compared with the witness target
}{
	{label: "init_coordinator"},
	{label: "update (config, model)"},
	{label: "set_paused (resume)"},
	{label: "join_run"},
	{label: "join_run (co-signed by the join authority)"},
	{label: "tick (nothing due)"},
	{label: "tick WaitingForMembers->Warmup"},
	{label: "warmup_witness", witness: true},
	{label: "warmup_witness (last: starts round 1)", witness: true},
	{label: "tick Warmup->RoundTrain (warmup time over)"},
	{label: "witness", witness: true},
	{label: "tick RoundTrain->RoundWitness (train time over)"},
	{label: "tick RoundWitness->RoundTrain (next round)"},
	{label: "health_check"},
	{label: "tick RoundWitness->Cooldown (last step)"},
	{label: "checkpoint"},
	{label: "tick Cooldown->WaitingForMembers (next epoch)"},
	{label: "set_paused (pause, withdraws the clients)"},
	{label: "free_coordinator"},
}

// TestProgramCosts sends every instruction through real transactions on the
// local validator, in every state a tick can leave, and reads the compute
// units each one consumed from its transaction's log (meta.logMessages of
// getTransaction: "Program <id> consumed N of M compute units"). After each
// instruction the account is compared with the Go coordinator given the time
// and seed the program used, as in TestOnChain. The instruction accounts are
// built from idl.json, so the IDL's account lists are checked by the program
// itself.
//
// The validator's clock is manual: each timeout is passed by moving it, not
// waited for. By default it runs with 4 clients (about a second); with -costs
// it runs at each of -costs.clients and prints the table
// (scripts/bench-program).
func TestProgramCosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the local validator")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	sizes := []int{4}
	if *costsReport {
		sizes = nil
		for _, f := range strings.Split(*costsClients, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 4 || n > coord.MaxClients {
				t.Fatalf("-costs.clients: %q is not a client count from 4 to %d", f, coord.MaxClients)
			}
			sizes = append(sizes, n)
		}
	}
	programID := sha256.Sum256([]byte("psyche/coordinator-program-costs"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	v, err := validator.Start(ctx, validator.WithSlotDuration(costSlot), validator.WithManualClock(),
		validator.WithProgram(coord.Base58(programID[:]), filepath.Join(".", "coordinator.so")))
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	rpc := &soltest.RPC{URL: v.RPC}
	idl := loadIDL(t)

	table := map[int]map[string]uint64{}
	for _, n := range sizes {
		ok := t.Run(fmt.Sprintf("%d_clients", n), func(t *testing.T) {
			table[n] = measureCosts(&chain{t: t, rpc: rpc, program: programID[:]}, idl, n)
		})
		if !ok {
			return
		}
	}
	for _, n := range sizes {
		for _, row := range costRows {
			cu, ok := table[n][row.label]
			if !ok {
				t.Errorf("%d clients: %s was not measured", n, row.label)
			}
			if cu > defaultBudget {
				t.Errorf("%d clients: %s consumed %d CU, over the default %d per instruction", n, row.label, cu, defaultBudget)
			}
		}
	}

	c := &chain{t: t, rpc: rpc}
	var version map[string]any
	rpc.Decode(t, rpc.Call(t, "getVersion"), &version)
	var out strings.Builder
	printCosts(&out, sizes, table, fmt.Sprintf("litesvm %v, solana-core %v", version["litesvm"], version["solana-core"]),
		c.rent(coord.AccountSize), c.rent(80))
	if *costsReport {
		fmt.Fprint(os.Stdout, out.String())
	} else {
		t.Log("\n" + out.String())
	}
}

func printCosts(w io.Writer, sizes []int, table map[int]map[string]uint64, runtime string, rentAccount, rentInstance uint64) {
	fmt.Fprintf(w, "\nCompute units per instruction: coordinator.so (%d bytes) on the local validator (%s),\nfrom each transaction's log; the last columns divide the largest figure of the row by\nthe default budget of one instruction (200,000 CU) and by the witness target (60,000 CU).\n\n",
		programSize(), runtime)
	fmt.Fprintf(w, "%-48s", "instruction")
	for _, n := range sizes {
		fmt.Fprintf(w, " %12s", fmt.Sprintf("%d clients", n))
	}
	fmt.Fprintf(w, " %9s %8s\n", "max/200k", "max/60k")
	for _, row := range costRows {
		fmt.Fprintf(w, "%-48s", row.label)
		var most uint64
		for _, n := range sizes {
			cu, ok := table[n][row.label]
			if !ok {
				fmt.Fprintf(w, " %12s", "-")
				continue
			}
			most = max(most, cu)
			fmt.Fprintf(w, " %12d", cu)
		}
		fmt.Fprintf(w, " %9.3f", float64(most)/defaultBudget)
		if row.witness {
			fmt.Fprintf(w, " %8.3f\n", float64(most)/witnessTarget)
		} else {
			fmt.Fprintf(w, " %8s\n", "-")
		}
	}
	fmt.Fprintf(w, "\njoin_run, warmup_witness and witness: the most expensive of all those sent (the last join\nscans the whole pending list; later witnesses check more earlier ones). init_coordinator\nvaries with the run id: finding the PDA's bump costs about 1,500 CU per candidate.\n")
	fmt.Fprintf(w, "coordinator account: %d bytes, rent-exempt minimum %d lamports (%.4f SOL)\n", coord.AccountSize, rentAccount, float64(rentAccount)/1e9)
	fmt.Fprintf(w, "instance PDA:        %d bytes, rent-exempt minimum %d lamports (%.4f SOL)\n", 80, rentInstance, float64(rentInstance)/1e9)
}

func programSize() int {
	fi, err := os.Stat("coordinator.so")
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

// costConfig is a run of n clients whose every timeout the scenario waits
// for is one second, the shortest the chain clock (whole seconds) allows.
// The epoch time of two seconds has passed when round 1 ends, so the epoch
// ends after round 3; the cooldown ends only with the checkpoint. With
// min(n-1, 32) witnesses, dropping one client leaves min_clients, and a
// round one witness short still has a quorum.
//
// No outcome depends on how fast the transactions go: the only instruction
// besides tick that looks at the clock is warmup_witness (the warmup may
// time out under it), so a run that sends warmup witnesses gets a warmup
// time they cannot reach (longWarmup), and the other run sends none.
func costConfig(n int, longWarmup bool) coord.Config {
	w := uint16(min(n-1, coord.MaxWitnesses))
	k := testConfig()
	k.InitMinClients, k.MinClients, k.WitnessNodes = uint16(n), w, w
	k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd = uint16(n), uint16(2*n)
	k.WaitingForMembersExtraTime, k.WarmupTime, k.MaxRoundTrainTime, k.RoundWitnessTime = 1, 1, 1, 1
	k.EpochTime, k.CooldownTime = 2, 60
	if longWarmup {
		k.WarmupTime, k.EpochTime = 600, 1200
	}
	return k
}

// measureCosts drives two runs of n clients and returns the compute units of
// each row. A permissioned run (with a join authority) fills up with
// co-signed joins and completes its warmup by witnesses; an open run fills
// up, lets its warmup time out (no witness reports), trains three rounds (the first one witness
// short, so a tick ends it; a client absent from every bloom of round 1 is
// dropped by a health check in round 2), records a checkpoint in cooldown,
// starts the next epoch, pauses and is freed.
func measureCosts(c *chain, idl *idlFile, n int) map[string]uint64 {
	t := c.t
	units := map[string]uint64{}
	m := testModel()
	w := min(n-1, coord.MaxWitnesses)

	perm := newCostRun(c, idl, units, fmt.Sprintf("costs-%d-permissioned", n), true)
	perm.configure(costConfig(n, true), m)
	perm.joinAll(n, "join_run (co-signed by the join authority)")
	perm.tickUntil("tick WaitingForMembers->Warmup", coord.Warmup)
	sent := perm.witnesses("warmup_witness", w-1, nil)
	sent += perm.witnesses("warmup_witness (last: starts round 1)", 1, nil)
	if s := perm.state(); sent != w || s.RunState != coord.RoundTrain {
		t.Fatalf("after %d of %d warmup witnesses: %s, want RoundTrain", sent, w, s.RunState)
	}

	open := newCostRun(c, idl, units, fmt.Sprintf("costs-%d-open", n), false)
	open.configure(costConfig(n, false), m)
	open.joinAll(n, "join_run")
	open.tickUntil("tick WaitingForMembers->Warmup", coord.Warmup)
	open.tickUntil("tick Warmup->RoundTrain (warmup time over)", coord.RoundTrain)

	// Round 1: one witness short, and no witness saw the last client.
	absent := uint16(n - 1)
	skip := map[uint16]bool{absent: true}
	if sent := open.witnesses("witness", w-1, skip); sent != w-1 {
		t.Fatalf("round 1: %d witnesses, want %d", sent, w-1)
	}
	open.tickUntil("tick RoundTrain->RoundWitness (train time over)", coord.RoundWitness)
	open.tickUntil("tick RoundWitness->RoundTrain (next round)", coord.RoundTrain)

	// Round 2: client 0 reports the absent client, which exits when the
	// round ends (and cannot witness any more).
	s := open.state()
	prev := s.PreviousRound()
	if prev == nil || coord.HealthScore(prev, s.Epoch.Clients[absent].ID.Signer) != 0 {
		t.Fatal("round 1 is not there or its witnesses saw the absent client")
	}
	hc := &coord.HealthCheck{ID: s.Epoch.Clients[absent].ID, Proof: s.Config.HealthCheckProofFor(s.CurrentRound(), absent)}
	open.do("health_check", hc, open.keys[s.Epoch.Clients[0].ID.Signer])
	if st := open.state().Epoch.Clients[absent].State; st != coord.Dropped {
		t.Fatalf("after the health check the client is %s, want Dropped", st)
	}
	open.witnesses("witness", w, skip)
	if open.state().RunState == coord.RoundTrain { // the absent client was one of the witnesses
		open.tickUntil("tick RoundTrain->RoundWitness (train time over)", coord.RoundWitness)
	}
	open.tickUntil("tick RoundWitness->RoundTrain (next round)", coord.RoundTrain)
	if s := open.state(); int(s.Epoch.ClientsLen) != n-1 || s.Epoch.LastStep == 0 {
		t.Fatalf("round 3 has %d clients and last step %d, want %d and the epoch's end set", s.Epoch.ClientsLen, s.Epoch.LastStep, n-1)
	}

	// Round 3 is the last of the epoch; then the cooldown, which waits for
	// a checkpoint.
	open.witnesses("witness", w, nil)
	open.tickUntil("tick RoundWitness->Cooldown (last step)", coord.Cooldown)
	open.refusedTick("tick (nothing due)")
	if s := open.state(); s.RunState != coord.Cooldown {
		t.Fatalf("a tick at the start of the cooldown left %s", s.RunState)
	}
	s = open.state()
	checkpointer := -1
	for i := uint16(0); i < s.Epoch.ClientsLen && checkpointer < 0; i++ {
		if s.IsCheckpointer(i) && s.Epoch.Clients[i].State == coord.Healthy {
			checkpointer = int(i)
		}
	}
	if checkpointer < 0 {
		t.Fatal("no healthy checkpointer was elected")
	}
	var src coord.CheckpointSource
	_ = coord.SetFixedString(src.URL[:], "https://example.org/psyche/costs")
	_ = coord.SetFixedString(src.Revision[:], "epoch-0")
	open.do("checkpoint", &coord.RecordCheckpoint{Source: src}, open.keys[s.Epoch.Clients[checkpointer].ID.Signer])
	open.tickUntil("tick Cooldown->WaitingForMembers (next epoch)", coord.WaitingForMembers)
	if s := open.state(); s.Progress.Epoch != 1 || s.Model.Checkpoint.Source != src {
		t.Fatalf("next epoch: epoch %d, checkpoint %q", s.Progress.Epoch, coord.FixedString(s.Model.Checkpoint.Source.URL[:]))
	}

	open.do("set_paused (pause, withdraws the clients)", &coord.SetPaused{Paused: true}, open.admin)
	open.free()
	return units
}

// costRun is one run on the validator and Go's copy of its account.
type costRun struct {
	t        *testing.T
	c        *chain
	idl      *idlFile
	units    map[string]uint64
	runID    string
	instance []byte
	acct     []byte
	admin    ed25519.PrivateKey
	joinAuth ed25519.PrivateKey // nil: anyone may join
	keys     map[coord.Pubkey]ed25519.PrivateKey
	goAcct   []byte
}

// newCostRun creates the coordinator account and the instance in one
// transaction with init_coordinator, and checks the instance record with
// the IDL's CoordinatorInstance type.
func newCostRun(c *chain, idl *idlFile, units map[string]uint64, runID string, permissioned bool) *costRun {
	t := c.t
	t.Helper()
	_, admin, _ := ed25519.GenerateKey(nil)
	_, acct, _ := ed25519.GenerateKey(nil)
	r := &costRun{t: t, c: c, idl: idl, units: units, runID: runID, admin: admin, acct: soltest.Pub(acct),
		keys: map[coord.Pubkey]ed25519.PrivateKey{}, goAcct: make([]byte, coord.AccountSize),
	}
	var instanceBump byte
	r.instance, instanceBump = instanceOf(runID, c.program)
	init := &coord.InitCoordinator{MainAuthority: coord.Pubkey(soltest.Pub(admin))}
	copy(init.RunID[:], runID)
	if permissioned {
		_, r.joinAuth, _ = ed25519.GenerateKey(nil)
		init.JoinAuthority = coord.Pubkey(soltest.Pub(r.joinAuth))
	}
	c.rpc.Call(t, "requestAirdrop", coord.Base58(soltest.Pub(admin)), 100_000_000_000)

	create := binary.LittleEndian.AppendUint32(nil, 0)
	create = binary.LittleEndian.AppendUint64(create, c.rent(coord.AccountSize))
	create = binary.LittleEndian.AppendUint64(create, uint64(coord.AccountSize))
	create = append(create, c.program...)
	transfer := binary.LittleEndian.AppendUint32(nil, 2)
	transfer = binary.LittleEndian.AppendUint64(transfer, c.rent(80))
	system := make([]byte, 32)
	c.unique = true
	c.send("init_coordinator", admin, []ed25519.PrivateKey{acct},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: r.acct, Signer: true, Writable: true}}, Data: create},
		soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(admin), Signer: true, Writable: true}, {Key: r.instance, Signer: false, Writable: true}}, Data: transfer},
		soltest.Instruction{Program: c.program, Accounts: r.metas(init.Name(), admin), Data: coord.EncodeInstruction(init)})
	r.record("init_coordinator", c.programUnits())
	r.check("init_coordinator", init, admin)

	d := newBorshDecoder(idl, c.account(r.instance))
	name, v := d.account()
	if d.err != nil || name != "CoordinatorInstance" || d.off != len(d.buf) {
		t.Fatalf("instance %x: decoded %s with the IDL (%v)", d.buf, name, d.err)
	}
	rec := v.(structValue)
	fields := map[string]any{}
	for i, n := range rec.names {
		fields[n] = rec.vals[i]
	}
	if string(fields["run_id"].([]byte)) != string(init.RunID[:]) || string(fields["coordinator"].([]byte)) != string(r.acct) ||
		fields["bump"] != uint64(instanceBump) {
		t.Fatalf("instance record %v", fields)
	}
	return r
}

// metas builds an instruction's accounts from the IDL: the instance, the
// coordinator account, the sender (always the third), the fixed addresses,
// and the join authority when the run has one.
func (r *costRun) metas(name string, sender ed25519.PrivateKey) []soltest.Meta {
	r.t.Helper()
	for _, ix := range r.idl.Instructions {
		if ix.Name != name {
			continue
		}
		var out []soltest.Meta
		for i, a := range ix.Accounts {
			var key []byte
			switch {
			case a.Address != "":
				key = soltest.Key(r.t, a.Address)
			case i == 2:
				key = soltest.Pub(sender)
			case a.Name == "instance":
				key = r.instance
			case a.Name == "coordinator":
				key = r.acct
			case a.Name == "join_authority" && r.joinAuth != nil:
				key = soltest.Pub(r.joinAuth)
			case a.Optional:
				continue
			default:
				r.t.Fatalf("%s: no key for the IDL's account %s", name, a.Name)
			}
			out = append(out, soltest.Meta{Key: key, Signer: a.Signer, Writable: a.Writable})
		}
		return out
	}
	r.t.Fatalf("the IDL has no instruction %s", name)
	return nil
}

func (r *costRun) record(label string, cu uint64) {
	if label != "" {
		r.units[label] = max(r.units[label], cu)
	}
}

func (r *costRun) state() *coord.Coordinator {
	s, err := coord.DecodeAccount(r.goAcct)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// do sends ix signed by sender (the admin pays the fee), records its compute
// units under label and checks the account against the Go coordinator.
func (r *costRun) do(label string, ix coord.Instruction, sender ed25519.PrivateKey) {
	r.t.Helper()
	var signers []ed25519.PrivateKey
	if !bytes.Equal(soltest.Pub(sender), soltest.Pub(r.admin)) {
		signers = append(signers, sender)
	}
	var co coord.Pubkey
	if _, join := ix.(*coord.JoinRun); join && r.joinAuth != nil {
		signers = append(signers, r.joinAuth)
		co = coord.Pubkey(soltest.Pub(r.joinAuth))
	}
	// Only ticks repeat the same bytes: they wait for a new blockhash so
	// that each one gets its own signature.
	_, tick := ix.(*coord.Tick)
	r.c.unique = !tick
	r.c.send(label, r.admin, signers, soltest.Instruction{Program: r.c.program, Accounts: r.metas(ix.Name(), sender), Data: coord.EncodeInstruction(ix)})
	r.record(label, r.c.programUnits())
	r.checkWith(label, ix, sender, co)
}

// refusedTick sends a tick with nothing due: the preflight simulation must
// refuse it with NothingDue (so it lands nowhere and costs no fee) and the
// account must not change. Its row is the units the simulation used.
func (r *costRun) refusedTick(label string) {
	r.t.Helper()
	before := r.c.account(r.acct)
	r.c.unique = false
	rerr := r.c.submit(label, r.admin, nil, soltest.Instruction{Program: r.c.program, Accounts: r.metas("tick", r.admin), Data: coord.EncodeInstruction(&coord.Tick{})})
	if rerr == nil {
		r.t.Fatalf("%s: accepted", label)
	}
	var data struct {
		Err struct {
			InstructionError []json.RawMessage
		}
		UnitsConsumed uint64
	}
	var custom struct{ Custom uint32 }
	if json.Unmarshal(rerr.Data, &data) != nil || len(data.Err.InstructionError) != 2 ||
		json.Unmarshal(data.Err.InstructionError[1], &custom) != nil || custom.Custom != coord.ErrNothingDue.Code {
		r.t.Fatalf("%s: %s %s, want custom error %d (NothingDue)", label, rerr.Message, rerr.Data, coord.ErrNothingDue.Code)
	}
	if !bytes.Equal(before, r.c.account(r.acct)) {
		r.t.Fatalf("%s: the refused tick changed the account", label)
	}
	r.record(label, data.UnitsConsumed)
}

func (r *costRun) check(label string, ix coord.Instruction, sender ed25519.PrivateKey) {
	r.t.Helper()
	r.checkWith(label, ix, sender, coord.Pubkey{})
}

// checkWith applies ix to Go's copy of the account with the time and seed
// the program recorded, and requires the program's account bytes.
func (r *costRun) checkWith(label string, ix coord.Instruction, sender ed25519.PrivateKey, co coord.Pubkey) {
	r.t.Helper()
	onChain := r.c.account(r.acct)
	s, err := coord.DecodeAccount(onChain)
	if err != nil {
		r.t.Fatalf("%s: the program wrote an account Go cannot decode: %v", label, err)
	}
	ctx := coord.Context{Sender: coord.Pubkey(soltest.Pub(sender)), CoSigner: co, Now: s.RunStateStart, Seed: drawnSeed(s)}
	want := goRun(r.goAcct, coord.EncodeInstruction(ix), ctx)
	if want.code != 0 {
		r.t.Fatalf("%s: Go rejects what the program accepted: %s", label, codeName(want.code))
	}
	if d := diff(want, result{acct: onChain}); d != "" {
		r.t.Fatalf("%s: %s", label, d)
	}
	r.goAcct = onChain
}

func (r *costRun) configure(k coord.Config, m coord.Model) {
	r.do("update (config, model)", &coord.Update{Config: &k, Model: &m}, r.admin)
	r.do("set_paused (resume)", &coord.SetPaused{Paused: false}, r.admin)
}

// joinAll joins n new clients; in a permissioned run a join without the
// join authority's signature is refused first.
func (r *costRun) joinAll(n int, label string) {
	for i := range n {
		_, key, _ := ed25519.GenerateKey(nil)
		id := coord.ClientID{Signer: coord.Pubkey(soltest.Pub(key)), P2P: coord.Pubkey(sha256.Sum256([]byte(fmt.Sprint(r.runID, "p2p", i))))}
		r.keys[id.Signer] = key
		join := &coord.JoinRun{ID: id}
		if i == 0 && r.joinAuth != nil {
			metas := r.metas(join.Name(), key)[:3]
			r.c.unique = true
			if code := r.c.fail("join without the join authority", r.admin, []ed25519.PrivateKey{key},
				soltest.Instruction{Program: r.c.program, Accounts: metas, Data: coord.EncodeInstruction(join)}); code != coord.ErrJoinNotAuthorized.Code {
				r.t.Fatalf("join without the join authority: error %d, want %d", code, coord.ErrJoinNotAuthorized.Code)
			}
		}
		r.do(label, join, key)
	}
}

// witnesses sends up to count witness reports (warmup witnesses in Warmup)
// from the round's witnesses that have not reported, in client order,
// leaving out the clients in skip both as senders and from the participant
// blooms. It returns how many it sent.
func (r *costRun) witnesses(label string, count int, skip map[uint16]bool) int {
	r.t.Helper()
	sent := 0
	for i := uint16(0); sent < count; i++ {
		s := r.state()
		if i >= s.Epoch.ClientsLen {
			break
		}
		rd := s.CurrentRound()
		p := s.Config.WitnessProofFor(rd, i)
		done := false
		for j := range rd.WitnessesLen {
			done = done || rd.Witnesses[j].Proof.Index == i
		}
		if !p.IsWitness || done || skip[i] || s.Epoch.Clients[i].State != coord.Healthy {
			continue
		}
		rep := witnessReport(s, i, uint64(i)+uint64(rd.Height)<<16, skip)
		var ix coord.Instruction = &coord.WitnessRound{Report: rep}
		if s.RunState == coord.Warmup {
			ix = &coord.WarmupWitness{Report: rep}
		}
		r.do(label, ix, r.keys[s.Epoch.Clients[i].ID.Signer])
		sent++
	}
	return sent
}

// tickUntil waits until the current state's timeout has passed on the chain
// clock, ticks once, and requires the run to be in state want.
func (r *costRun) tickUntil(label string, want coord.RunState) {
	r.t.Helper()
	s := r.state()
	k := &s.Config
	d := map[coord.RunState]uint64{coord.WaitingForMembers: k.WaitingForMembersExtraTime, coord.Warmup: k.WarmupTime,
		coord.RoundTrain: k.MaxRoundTrainTime, coord.RoundWitness: k.RoundWitnessTime, coord.Cooldown: k.CooldownTime}[s.RunState]
	if !(s.RunState == coord.Cooldown && s.Epoch.Checkpointed) {
		// The coordinator's timeout rule: d seconds after the state began,
		// and never in the second it began.
		r.waitClock(s.RunStateStart + max(d, 1))
	}
	from := s.RunState
	r.do(label, &coord.Tick{}, r.admin)
	if got := r.state().RunState; got != want {
		r.t.Fatalf("%s: the tick left %s in %s, want %s", label, from, got, want)
	}
}

// waitClock moves the chain's clock (the validator runs a manual one) to
// due, if it is not there yet.
func (r *costRun) waitClock(due uint64) {
	r.t.Helper()
	if r.c.clock() < due {
		r.c.setClock(due)
	}
}

// free closes the run; both accounts must be gone.
func (r *costRun) free() {
	r.t.Helper()
	ix := &coord.FreeCoordinator{}
	r.c.unique = true
	r.c.send("free_coordinator", r.admin, nil, soltest.Instruction{Program: r.c.program, Accounts: r.metas(ix.Name(), r.admin), Data: coord.EncodeInstruction(ix)})
	r.record("free_coordinator", r.c.programUnits())
	if a, b := r.c.account(r.acct), r.c.account(r.instance); a != nil || b != nil {
		r.t.Fatalf("after free: coordinator account %d bytes, instance %d bytes, want both closed", len(a), len(b))
	}
}

// programUnits returns the compute units the program consumed in the last
// transaction, from the runtime's log line for its top-level invocation (the
// system program's instructions in the same transaction are not counted).
func (c *chain) programUnits() uint64 {
	c.t.Helper()
	var tx struct {
		Meta struct{ LogMessages []string }
	}
	c.rpc.Decode(c.t, c.rpc.Call(c.t, "getTransaction", c.last, map[string]any{"encoding": "json"}), &tx)
	prefix := "Program " + coord.Base58(c.program) + " consumed "
	for _, l := range tx.Meta.LogMessages {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			n, err := strconv.ParseUint(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				c.t.Fatalf("log line %q: %v", l, err)
			}
			return n
		}
	}
	c.t.Fatalf("transaction %s: no %q line in its log %q", c.last, prefix, tx.Meta.LogMessages)
	return 0
}

// clock reads unix_timestamp from the Clock sysvar.
// setClock moves the Clock sysvar of a validator started WithManualClock.
func (c *chain) setClock(unix uint64) {
	c.t.Helper()
	c.rpc.Call(c.t, "psycheSetClock", unix)
	if got := c.clock(); got != unix {
		c.t.Fatalf("the Clock sysvar reads %d after psycheSetClock(%d)", got, unix)
	}
}

func (c *chain) clock() uint64 {
	c.t.Helper()
	b := c.account(soltest.Key(c.t, "SysvarC1ock11111111111111111111111111111111"))
	if len(b) < 40 {
		c.t.Fatalf("Clock sysvar: %d bytes", len(b))
	}
	return binary.LittleEndian.Uint64(b[32:40])
}
