package coordinator_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coord "github.com/psyche-go/psyche/coordinator"
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
	programID := sha256.Sum256([]byte("psyche/coordinator-program-test"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	v, err := validator.Start(ctx, validator.WithSlotDuration(50*time.Millisecond), validator.WithManualClock(),
		validator.WithProgram(base58Encode(programID[:]), filepath.Join(".", "coordinator.so")))
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	c := &chain{t: t, rpc: &rpcClient{url: v.RPC}, program: programID[:]}

	_, admin, _ := ed25519.GenerateKey(nil)
	_, acctKey, _ := ed25519.GenerateKey(nil)
	_, client, _ := ed25519.GenerateKey(nil)
	c.rpc.call(t, "requestAirdrop", base58Encode(pub(admin)), 10_000_000_000)
	c.rpc.call(t, "requestAirdrop", base58Encode(pub(client)), 1_000_000_000)

	var runID [coord.MaxRunIDLen]byte
	copy(runID[:], "chain-run")
	instance := findProgramAddress([][]byte{[]byte("coordinator"), []byte("chain-run")}, programID[:])
	coordKey := pub(acctKey)
	system := make([]byte, 32)
	slotHashes := mustB58(t, "SysvarS1otHashes111111111111111111111111111")
	accounts := func(sender ed25519.PrivateKey, writableSender bool, extra ...accountMeta) []accountMeta {
		return append([]accountMeta{{instance, false, true}, {coordKey, false, true}, {pub(sender), true, writableSender}}, extra...)
	}

	// Go's view of the same account.
	goAcct := make([]byte, coord.AccountSize)
	check := func(label string, ix coord.Instruction, sender coord.Pubkey) {
		t.Helper()
		onChain := c.account(coordKey)
		s, err := coord.DecodeAccount(onChain)
		if err != nil {
			t.Fatalf("%s: the program wrote an account Go cannot decode: %v", label, err)
		}
		// The time and seed the program used, as it recorded them.
		gctx := coord.Context{Sender: sender, Now: s.RunStateStart, Seed: s.CurrentRound().RandomSeed}
		want := goRun(goAcct, coord.EncodeInstruction(ix), gctx)
		if want.code != 0 {
			t.Fatalf("%s: Go rejects what the program accepted: %s", label, codeName(want.code))
		}
		if d := diff(want, result{acct: onChain}); d != "" {
			t.Fatalf("%s: %s", label, d)
		}
		goAcct = onChain
	}

	// 1. create_account + fund the instance PDA + init_coordinator.
	createData := binary.LittleEndian.AppendUint32(nil, 0)
	createData = binary.LittleEndian.AppendUint64(createData, c.rent(coord.AccountSize))
	createData = binary.LittleEndian.AppendUint64(createData, uint64(coord.AccountSize))
	createData = append(createData, programID[:]...)
	transfer := binary.LittleEndian.AppendUint32(nil, 2)
	transfer = binary.LittleEndian.AppendUint64(transfer, c.rent(80))
	init := &coord.InitCoordinator{MainAuthority: coord.Pubkey(pub(admin)), RunID: runID}
	c.send("init", admin, []ed25519.PrivateKey{acctKey},
		instruction{system, []accountMeta{{pub(admin), true, true}, {coordKey, true, true}}, createData},
		instruction{system, []accountMeta{{pub(admin), true, true}, {instance, false, true}}, transfer},
		instruction{c.program, accounts(admin, true, accountMeta{system, false, false}), coord.EncodeInstruction(init)})
	check("init", init, coord.Pubkey(pub(admin)))
	instDisc := sha256.Sum256([]byte("account:CoordinatorInstance"))
	if inst := c.account(instance); len(inst) != 80 || !bytes.Equal(inst[:8], instDisc[:8]) || inst[8] != bump(instance, "chain-run", programID[:]) ||
		!bytes.Equal(inst[9:16], make([]byte, 7)) || !bytes.Equal(inst[16:48], runID[:]) || !bytes.Equal(inst[48:], coordKey) {
		t.Fatalf("instance record %x", inst)
	}

	// 2. update (config + model), and an update by someone else (refused
	// with the coordinator's error code).
	k, m := testConfig(), testModel()
	k.InitMinClients, k.MinClients, k.WitnessNodes, k.GlobalBatchSizeEnd = 1, 1, 1, 12
	k.WaitingForMembersExtraTime, k.WarmupTime = 1, 30
	update := &coord.Update{Config: &k, Model: &m}
	c.send("update", admin, nil, instruction{c.program, accounts(admin, false), coord.EncodeInstruction(update)})
	check("update", update, coord.Pubkey(pub(admin)))
	if code := c.fail("update by a client", client, nil, instruction{c.program, accounts(client, false), coord.EncodeInstruction(update)}); code != coord.ErrUnauthorized.Code {
		t.Fatalf("update by a client: got %d, want %d", code, coord.ErrUnauthorized.Code)
	}

	// 3. resume, 4. join.
	resume := &coord.SetPaused{Paused: false}
	c.send("resume", admin, nil, instruction{c.program, accounts(admin, false), coord.EncodeInstruction(resume)})
	check("resume", resume, coord.Pubkey(pub(admin)))
	id := coord.ClientID{Signer: coord.Pubkey(pub(client)), P2P: key("client p2p")}
	join := &coord.JoinRun{ID: id}
	c.send("join", client, nil, instruction{c.program, accounts(client, false), coord.EncodeInstruction(join)})
	check("join", join, id.Signer)

	// 5. tick until the epoch starts, moving the chain's (manual) clock a
	// second before each tick. A tick without the SlotHashes sysvar is
	// refused.
	if code := c.fail("tick without SlotHashes", client, nil, instruction{c.program, accounts(client, false), coord.EncodeInstruction(&coord.Tick{})}); code != 0 {
		t.Fatalf("tick without SlotHashes: custom error %d, want NotEnoughAccountKeys", code)
	}
	tick := instruction{c.program, accounts(client, false, accountMeta{slotHashes, false, false}), coord.EncodeInstruction(&coord.Tick{})}
	for ticks := 0; ; ticks++ {
		if ticks == 10 {
			t.Fatal("the run never left WaitingForMembers")
		}
		c.setClock(c.clock() + 1)
		before := c.account(coordKey)
		c.send("tick", client, nil, tick)
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
	s, _ := coord.DecodeAccount(goAcct)
	rep := witnessReport(s, 0, 42, nil)
	ww := &coord.WarmupWitness{Report: rep}
	c.send("warmup_witness", client, nil, instruction{c.program, accounts(client, false, accountMeta{slotHashes, false, false}), coord.EncodeInstruction(ww)})
	check("warmup_witness", ww, id.Signer)
	if s, _ := coord.DecodeAccount(goAcct); s.RunState != coord.RoundTrain {
		t.Fatalf("after the warmup witness: %s, want RoundTrain", s.RunState)
	}

	// 7. pause (pending while training), then free is refused while active.
	pause := &coord.SetPaused{Paused: true}
	c.send("pause", admin, nil, instruction{c.program, accounts(admin, false), coord.EncodeInstruction(pause)})
	check("pause", pause, coord.Pubkey(pub(admin)))
	free := instruction{c.program, accounts(admin, true), coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free while active", admin, nil, free); code != coord.ErrNotHalted.Code {
		t.Fatalf("free while active: got %d, want %d", code, coord.ErrNotHalted.Code)
	}

	// 8. a second run, freed while still uninitialized: both accounts close
	// and their lamports go to the authority.
	_, acct2, _ := ed25519.GenerateKey(nil)
	var runID2 [coord.MaxRunIDLen]byte
	copy(runID2[:], "chain-run-2")
	instance2 := findProgramAddress([][]byte{[]byte("coordinator"), []byte("chain-run-2")}, programID[:])
	accounts2 := func(sender ed25519.PrivateKey, writableSender bool, extra ...accountMeta) []accountMeta {
		return append([]accountMeta{{instance2, false, true}, {pub(acct2), false, true}, {pub(sender), true, writableSender}}, extra...)
	}
	createData = binary.LittleEndian.AppendUint32(nil, 0)
	createData = binary.LittleEndian.AppendUint64(createData, c.rent(coord.AccountSize))
	createData = binary.LittleEndian.AppendUint64(createData, uint64(coord.AccountSize))
	createData = append(createData, programID[:]...)
	init2 := &coord.InitCoordinator{MainAuthority: coord.Pubkey(pub(admin)), RunID: runID2}
	// The instance of the first run does not fit the second run id.
	if code := c.fail("init with another run's PDA", admin, []ed25519.PrivateKey{acct2},
		instruction{system, []accountMeta{{pub(admin), true, true}, {pub(acct2), true, true}}, createData},
		instruction{c.program, append([]accountMeta{{instance, false, true}, {pub(acct2), false, true}, {pub(admin), true, true}}, accountMeta{system, false, false}), coord.EncodeInstruction(init2)}); code != 0 {
		t.Fatalf("init with another run's PDA: custom error %d, want a seeds error", code)
	}
	c.send("init 2", admin, []ed25519.PrivateKey{acct2},
		instruction{system, []accountMeta{{pub(admin), true, true}, {pub(acct2), true, true}}, createData},
		instruction{system, []accountMeta{{pub(admin), true, true}, {instance2, false, true}}, transfer},
		instruction{c.program, accounts2(admin, true, accountMeta{system, false, false}), coord.EncodeInstruction(init2)})
	free2 := instruction{c.program, accounts2(client, true), coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free by a client", client, nil, free2); code != coord.ErrUnauthorized.Code {
		t.Fatalf("free by a client: got %d, want %d", code, coord.ErrUnauthorized.Code)
	}
	// Someone else's instance account with this coordinator account.
	wrong := instruction{c.program, []accountMeta{{instance, false, true}, {pub(acct2), false, true}, {pub(admin), true, true}}, coord.EncodeInstruction(&coord.FreeCoordinator{})}
	if code := c.fail("free with the other run's instance", admin, nil, wrong); code != 0 {
		t.Fatalf("free with the other run's instance: custom error %d, want InvalidAccountData", code)
	}
	c.send("free", admin, nil, instruction{c.program, accounts2(admin, true), coord.EncodeInstruction(&coord.FreeCoordinator{})})
	if a, b := c.account(pub(acct2)), c.account(instance2); a != nil || b != nil {
		t.Fatalf("after free: coordinator account %d bytes, instance %d bytes, want both closed", len(a), len(b))
	}
	t.Logf("compute units (simulated): %v", c.units)
}

// chain is a minimal Solana RPC client for the test.
type chain struct {
	t       *testing.T
	rpc     *rpcClient
	program []byte
	units   map[string]uint64
	unique  bool   // the transactions differ anyway: no need to wait for a new blockhash
	last    string // the signature of the last transaction sent
}

func pub(k ed25519.PrivateKey) []byte { return k.Public().(ed25519.PublicKey) }

func (c *chain) rent(n int) uint64 {
	var l uint64
	c.rpc.decode(c.t, c.rpc.call(c.t, "getMinimumBalanceForRentExemption", n), &l)
	return l
}

func (c *chain) blockhash() []byte {
	var latest struct{ Value struct{ Blockhash string } }
	c.rpc.decode(c.t, c.rpc.call(c.t, "getLatestBlockhash"), &latest)
	return mustB58(c.t, latest.Value.Blockhash)
}

func (c *chain) account(k []byte) []byte {
	var info struct {
		Value *struct{ Data []string }
	}
	c.rpc.decode(c.t, c.rpc.call(c.t, "getAccountInfo", base58Encode(k), map[string]any{"encoding": "base64"}), &info)
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
func (c *chain) submit(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...instruction) *rpcError {
	old := c.blockhash()
	bh := old
	for i := 0; i < 100 && bytes.Equal(bh, old) && !c.unique; i++ {
		time.Sleep(20 * time.Millisecond)
		bh = c.blockhash()
	}
	tx := compileTx(payer, signers, bh, ixs...)
	var sim struct {
		Value struct{ UnitsConsumed uint64 }
	}
	if raw, err := c.rpc.try("simulateTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}); err == nil {
		json.Unmarshal(raw, &sim)
	}
	sig, rerr := c.rpc.try("sendTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"})
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

func (c *chain) send(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...instruction) {
	c.t.Helper()
	if err := c.submit(what, payer, signers, ixs...); err != nil {
		c.t.Fatalf("%s: %s %s", what, err.Message, err.Data)
	}
}

// fail sends a transaction that must fail and returns its custom error code
// (0 for a failure that is not a custom program error).
func (c *chain) fail(what string, payer ed25519.PrivateKey, signers []ed25519.PrivateKey, ixs ...instruction) uint32 {
	c.t.Helper()
	err := c.submit(what, payer, signers, ixs...)
	if err == nil {
		c.t.Fatalf("%s: accepted", what)
	}
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

// Transactions, as in programs/validator's tests.

type accountMeta struct {
	key              []byte
	signer, writable bool
}

type instruction struct {
	program  []byte
	accounts []accountMeta
	data     []byte
}

// compileTx builds and signs a legacy transaction.
func compileTx(payer ed25519.PrivateKey, signers []ed25519.PrivateKey, blockhash []byte, ixs ...instruction) []byte {
	type entry struct {
		key              []byte
		signer, writable bool
	}
	var keys []*entry
	index := map[string]*entry{}
	add := func(k []byte, signer, writable bool) {
		if e, ok := index[string(k)]; ok {
			e.signer, e.writable = e.signer || signer, e.writable || writable
			return
		}
		e := &entry{k, signer, writable}
		index[string(k)] = e
		keys = append(keys, e)
	}
	add(pub(payer), true, true)
	for _, ix := range ixs {
		for _, a := range ix.accounts {
			add(a.key, a.signer, a.writable)
		}
		add(ix.program, false, false)
	}
	rank := func(e *entry) int {
		switch {
		case e.signer && e.writable:
			return 0
		case e.signer:
			return 1
		case e.writable:
			return 2
		}
		return 3
	}
	var ordered []*entry
	for r := 0; r < 4; r++ {
		for _, e := range keys {
			if rank(e) == r {
				ordered = append(ordered, e)
			}
		}
	}
	pos := map[string]byte{}
	var nsig, roSigned, roUnsigned byte
	for i, e := range ordered {
		pos[string(e.key)] = byte(i)
		switch rank(e) {
		case 0:
			nsig++
		case 1:
			nsig++
			roSigned++
		case 3:
			roUnsigned++
		}
	}
	msg := []byte{nsig, roSigned, roUnsigned}
	msg = appendCompact(msg, len(ordered))
	for _, e := range ordered {
		msg = append(msg, e.key...)
	}
	msg = append(msg, blockhash...)
	msg = appendCompact(msg, len(ixs))
	for _, ix := range ixs {
		msg = append(msg, pos[string(ix.program)])
		msg = appendCompact(msg, len(ix.accounts))
		for _, a := range ix.accounts {
			msg = append(msg, pos[string(a.key)])
		}
		msg = appendCompact(msg, len(ix.data))
		msg = append(msg, ix.data...)
	}
	keysByPub := map[string]ed25519.PrivateKey{string(pub(payer)): payer}
	for _, s := range signers {
		keysByPub[string(pub(s))] = s
	}
	tx := appendCompact(nil, int(nsig))
	for _, e := range ordered[:nsig] {
		tx = append(tx, ed25519.Sign(keysByPub[string(e.key)], msg)...)
	}
	return append(tx, msg...)
}

func appendCompact(b []byte, n int) []byte {
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// onCurve reports whether 32 bytes decode to a point of edwards25519:
// program-derived addresses must not.
func onCurve(k []byte) bool {
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	le := make([]byte, 32)
	for i := range k {
		le[31-i] = k[i]
	}
	le[0] &= 0x7f
	y := new(big.Int).SetBytes(le)
	if y.Cmp(p) >= 0 {
		return false
	}
	d := new(big.Int).Mul(big.NewInt(-121665), new(big.Int).ModInverse(big.NewInt(121666), p))
	d.Mod(d, p)
	y2 := new(big.Int).Mul(y, y)
	u := new(big.Int).Sub(y2, big.NewInt(1))
	v := new(big.Int).Add(new(big.Int).Mul(d, y2), big.NewInt(1))
	x2 := new(big.Int).Mul(u, new(big.Int).ModInverse(v.Mod(v, p), p))
	x2.Mod(x2, p)
	if x2.Sign() == 0 {
		return k[31]&0x80 == 0
	}
	e := new(big.Int).Rsh(new(big.Int).Sub(p, big.NewInt(1)), 1)
	return new(big.Int).Exp(x2, e, p).Cmp(big.NewInt(1)) == 0
}

// bump returns the bump seed of a program address derived from ["coordinator", runID].
func bump(address []byte, runID string, program []byte) byte {
	for b := 255; b >= 0; b-- {
		h := sha256.New()
		h.Write([]byte("coordinator"))
		h.Write([]byte(runID))
		h.Write([]byte{byte(b)})
		h.Write(program)
		h.Write([]byte("ProgramDerivedAddress"))
		if bytes.Equal(h.Sum(nil), address) {
			return byte(b)
		}
	}
	panic("not a program address of this run id")
}

// findProgramAddress is Solana's find_program_address.
func findProgramAddress(seeds [][]byte, program []byte) []byte {
	for bump := 255; bump >= 0; bump-- {
		h := sha256.New()
		for _, s := range seeds {
			h.Write(s)
		}
		h.Write([]byte{byte(bump)})
		h.Write(program)
		h.Write([]byte("ProgramDerivedAddress"))
		if k := h.Sum(nil); !onCurve(k) {
			return k
		}
	}
	panic("no program address")
}

// JSON-RPC over HTTP.

type rpcClient struct {
	url string
	id  int
}

type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (c *rpcClient) try(method string, params ...any) (json.RawMessage, *rpcError) {
	c.id++
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	resp, err := http.Post(c.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, &rpcError{Code: -1, Message: err.Error()}
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, &rpcError{Code: -1, Message: err.Error()}
	}
	return out.Result, out.Error
}

func (c *rpcClient) call(t *testing.T, method string, params ...any) json.RawMessage {
	t.Helper()
	res, err := c.try(method, params...)
	if err != nil {
		t.Fatalf("%s: %+v", method, err)
	}
	return res
}

func (c *rpcClient) decode(t *testing.T, raw json.RawMessage, v any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
}

// Base58 (Bitcoin alphabet), as Solana writes keys.

const b58Alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

func base58Encode(b []byte) string {
	n := new(big.Int).SetBytes(b)
	var out []byte
	mod, radix := new(big.Int), big.NewInt(58)
	for n.Sign() > 0 {
		n.DivMod(n, radix, mod)
		out = append(out, b58Alphabet[mod.Int64()])
	}
	for _, c := range b {
		if c != 0 {
			break
		}
		out = append(out, '1')
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return string(out)
}

func mustB58(t *testing.T, s string) []byte {
	t.Helper()
	n := new(big.Int)
	for _, c := range []byte(s) {
		i := strings.IndexByte(b58Alphabet, c)
		if i < 0 {
			t.Fatal(errors.New("invalid base58 " + s))
		}
		n.Mul(n, big.NewInt(58)).Add(n, big.NewInt(int64(i)))
	}
	b := n.Bytes()
	return append(make([]byte, 32-len(b)), b...)
}
