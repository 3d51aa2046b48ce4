package validator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/soltest"
)

// The test programs of programs/sbpf, linked by its linker, and what each
// logs when it runs: running them here shows the runtime's own loader
// accepts the linker's output.
var testPrograms = map[string][]string{
	"syscall": {"Program log: hello from sbpf"},
	"rodata":  {"Program log: rodata: sum of primes", "Program log: 0x4d, 0x13, "},
	"call":    {"Program log: 0x31, 0x5f4, "},
	"fnptr":   {"Program log: 0x1f, 0x0, "},
}

func programID(name string) []byte {
	h := sha256.Sum256([]byte("psyche/validator-test/" + name))
	return h[:]
}

func TestValidator(t *testing.T) {
	if _, err := lookNode(); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := []Option{WithSlotDuration(20 * time.Millisecond)}
	for name := range testPrograms {
		opts = append(opts, WithProgram(coordinator.Base58(programID(name)), filepath.Join("..", "sbpf", "testdata", name+".so")))
	}
	v, err := Start(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	rpc := &soltest.RPC{URL: v.RPC}

	if got := rpc.Call(t, "getHealth"); string(got) != `"ok"` {
		t.Errorf("getHealth = %s", got)
	}
	var version map[string]any
	rpc.Decode(t, rpc.Call(t, "getVersion"), &version)
	if _, ok := version["solana-core"].(string); !ok {
		t.Errorf("getVersion = %v, want a solana-core string", version)
	}

	ws, err := dialWS(v.WebSocket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	deadline := time.Now().Add(30 * time.Second)

	// Slots advance: two slot notifications in a row, and getSlot catches up.
	slotSub := subscribe(t, ws, deadline, 7, "slotSubscribe")
	var slots []uint64
	for len(slots) < 2 {
		var n struct {
			Slot uint64 `json:"slot"`
		}
		rpc.Decode(t, notification(t, ws, deadline, "slotNotification", slotSub), &n)
		slots = append(slots, n.Slot)
	}
	if slots[1] <= slots[0] {
		t.Errorf("slot notifications %v do not advance", slots)
	}
	var slot uint64
	rpc.Decode(t, rpc.Call(t, "getSlot"), &slot)
	if slot < slots[1] {
		t.Errorf("getSlot = %d after slot %d was notified", slot, slots[1])
	}
	unsubscribe(t, ws, deadline, "slotUnsubscribe", slotSub)

	// The Clock sysvar follows: its slot is the chain's, its time the wall's.
	clockSlot, unix := readClock(t, rpc)
	if clockSlot < slot || time.Since(time.Unix(unix, 0)).Abs() > 3*time.Second {
		t.Errorf("Clock sysvar: slot %d (chain at %d), unix_timestamp %d (now %d)", clockSlot, slot, unix, time.Now().Unix())
	}

	// An airdrop to a fresh key, observed through accountSubscribe. The
	// request id is above 2^53, as solana-go's are: it must come back
	// digit for digit.
	pub, priv, _ := ed25519.GenerateKey(nil)
	payer := coordinator.Base58(pub)
	const bigID = "18446744073709551557"
	sub := subscribe(t, ws, deadline, bigID, "accountSubscribe", payer, map[string]string{"encoding": "base64", "commitment": "confirmed"})
	const amount = 5_000_000_000
	var airdropSig string
	rpc.Decode(t, rpc.Call(t, "requestAirdrop", payer, amount), &airdropSig)
	note := notification(t, ws, deadline, "accountNotification", sub)
	var acct struct {
		Value struct {
			Lamports  uint64      `json:"lamports"`
			Owner     string      `json:"owner"`
			RentEpoch json.Number `json:"rentEpoch"`
		} `json:"value"`
	}
	rpc.Decode(t, note, &acct)
	if acct.Value.Lamports != amount || acct.Value.RentEpoch != "18446744073709551615" {
		t.Errorf("account notification %s: want %d lamports and rentEpoch u64::MAX exactly", note, amount)
	}

	var bal struct{ Value uint64 }
	rpc.Decode(t, rpc.Call(t, "getBalance", payer), &bal)
	if bal.Value != amount {
		t.Errorf("getBalance = %d, want %d", bal.Value, amount)
	}
	var info struct {
		Context struct{ Slot uint64 }
		Value   struct {
			Data      []string
			Lamports  uint64
			Owner     string
			RentEpoch json.Number
			Space     uint64
		}
	}
	rpc.Decode(t, rpc.Call(t, "getAccountInfo", payer, map[string]string{"encoding": "base64"}), &info)
	if info.Value.Lamports != amount || info.Value.Owner != "11111111111111111111111111111111" ||
		info.Value.RentEpoch != "18446744073709551615" || len(info.Value.Data) != 2 || info.Value.Data[1] != "base64" {
		t.Errorf("getAccountInfo = %+v", info.Value)
	}
	var missing struct{ Value *json.RawMessage }
	rpc.Decode(t, rpc.Call(t, "getAccountInfo", coordinator.Base58(programID("nobody")), map[string]string{"encoding": "base64"}), &missing)
	if missing.Value != nil {
		t.Errorf("getAccountInfo of a missing account = %s, want null", *missing.Value)
	}
	var rent uint64
	rpc.Decode(t, rpc.Call(t, "getMinimumBalanceForRentExemption", 100), &rent)
	if rent == 0 {
		t.Error("getMinimumBalanceForRentExemption(100) = 0")
	}

	var latest struct {
		Value struct {
			Blockhash            string
			LastValidBlockHeight uint64
		}
	}
	rpc.Decode(t, rpc.Call(t, "getLatestBlockhash", map[string]string{"commitment": "finalized"}), &latest)
	blockhash, err := coordinator.DecodeBase58(latest.Value.Blockhash)
	if err != nil || len(blockhash) != 32 || latest.Value.LastValidBlockHeight <= slot {
		t.Fatalf("getLatestBlockhash = %+v (%v)", latest.Value, err)
	}

	// Each preloaded program runs: simulate shows its logs, send lands it.
	for name, want := range testPrograms {
		tx := soltest.CompileTx(priv, nil, blockhash, soltest.Instruction{Program: programID(name), Data: []byte{7}})
		enc := map[string]any{"encoding": "base64"}
		var sim struct {
			Value struct {
				Err           any
				Logs          []string
				UnitsConsumed uint64
			}
		}
		rpc.Decode(t, rpc.Call(t, "simulateTransaction", base64.StdEncoding.EncodeToString(tx), enc), &sim)
		logs := strings.Join(sim.Value.Logs, "\n")
		if sim.Value.Err != nil || sim.Value.UnitsConsumed == 0 {
			t.Errorf("%s: simulate err %v, %d CU, logs:\n%s", name, sim.Value.Err, sim.Value.UnitsConsumed, logs)
		}
		for _, w := range want {
			if !strings.Contains(logs, w) {
				t.Errorf("%s: logs lack %q:\n%s", name, w, logs)
			}
		}
		var sig string
		rpc.Decode(t, rpc.Call(t, "sendTransaction", base64.StdEncoding.EncodeToString(tx), enc), &sig)
		var st struct {
			Value []*struct {
				Err                any
				ConfirmationStatus string
			}
		}
		rpc.Decode(t, rpc.Call(t, "getSignatureStatuses", []string{sig, airdropSig}), &st)
		if len(st.Value) != 2 || st.Value[0] == nil || st.Value[0].Err != nil || st.Value[1] == nil {
			t.Errorf("%s: getSignatureStatuses = %s", name, rpc.Call(t, "getSignatureStatuses", []string{sig, airdropSig}))
		}
	}

	// A failing instruction comes back as the RPC's TransactionError JSON:
	// one byte of data is no system instruction.
	bogus := soltest.CompileTx(priv, nil, blockhash, soltest.Instruction{Program: make([]byte, 32), Data: []byte{7}})
	var failed struct{ Value struct{ Err json.RawMessage } }
	rpc.Decode(t, rpc.Call(t, "simulateTransaction", base64.StdEncoding.EncodeToString(bogus), map[string]any{"encoding": "base64"}), &failed)
	if got := string(failed.Value.Err); got != `{"InstructionError":[0,"InvalidInstructionData"]}` {
		t.Errorf("simulate of a bad system instruction: err %s", got)
	}
	_, rerr := rpc.Try("sendTransaction", base64.StdEncoding.EncodeToString(bogus), map[string]any{"encoding": "base64"})
	if rerr == nil || rerr.Code != -32002 || !strings.Contains(string(rerr.Data), `"InstructionError":[0,"InvalidInstructionData"]`) {
		t.Errorf("send of a bad system instruction: error %+v, want preflight failure -32002", rerr)
	}

	// Without preflight it lands, failed: its status carries the error.
	var failedSig string
	rpc.Decode(t, rpc.Call(t, "sendTransaction", base64.StdEncoding.EncodeToString(bogus),
		map[string]any{"encoding": "base64", "skipPreflight": true}), &failedSig)
	var fst struct {
		Value []*struct {
			Err    json.RawMessage
			Status map[string]json.RawMessage
		}
	}
	rpc.Decode(t, rpc.Call(t, "getSignatureStatuses", []string{failedSig}), &fst)
	if len(fst.Value) != 1 || fst.Value[0] == nil || string(fst.Value[0].Err) != `{"InstructionError":[0,"InvalidInstructionData"]}` || fst.Value[0].Status["Err"] == nil {
		t.Errorf("status of a failed transaction: %s", rpc.Call(t, "getSignatureStatuses", []string{failedSig}))
	}

	// A transaction with an unknown blockhash fails preflight.
	stale := soltest.CompileTx(priv, nil, programID("not a blockhash"), soltest.Instruction{Program: programID("syscall"), Data: []byte{7}})
	_, rerr = rpc.Try("sendTransaction", base64.StdEncoding.EncodeToString(stale), map[string]any{"encoding": "base64"})
	if rerr == nil || rerr.Code != -32002 || !strings.Contains(string(rerr.Data), "BlockhashNotFound") {
		t.Errorf("stale blockhash: error %+v, want -32002 BlockhashNotFound", rerr)
	}

	// Run stops the validator when its context ends.
	runCtx, stop := context.WithCancel(context.Background())
	stop()
	if err := v.Run(runCtx); err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-v.Done():
	default:
		t.Error("validator still running after Run returned")
	}
	if err := v.Close(); err != nil {
		t.Errorf("Close after Run: %v", err)
	}
}

func lookNode() (string, error) { return exec.LookPath("node") }

func TestOptions(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []Option
	}{
		{"port twice", []Option{WithPort(1), WithPort(2)}},
		{"bad port", []Option{WithPort(70000)}},
		{"short slot", []Option{WithSlotDuration(time.Microsecond)}},
		{"missing program", []Option{WithProgram("x", filepath.Join(t.TempDir(), "none.so"))}},
		{"no node", []Option{WithNode(filepath.Join(t.TempDir(), "node")), WithDir(t.TempDir())}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if v, err := Start(context.Background(), tt.opts...); err == nil {
				v.Close()
				t.Fatal("Start succeeded")
			}
		})
	}
}

// JSON-RPC over HTTP.

// Websocket subscriptions. subscribe waits for the confirmation, so the
// subscription is live when it returns (see the package doc).

func subscribe(t *testing.T, ws *wsConn, deadline time.Time, id any, method string, params ...any) uint64 {
	t.Helper()
	if params == nil {
		params = []any{}
	}
	p, _ := json.Marshal(params)
	// The id is written by hand: a Go int64 cannot hold every id, and
	// big ones must survive the round trip as raw digits.
	req := fmt.Sprintf(`{"jsonrpc":"2.0","id":%v,"method":%q,"params":%s}`, id, method, p)
	if err := ws.WriteText([]byte(req)); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := ws.ReadText(deadline)
		if err != nil {
			t.Fatalf("%s: waiting for the confirmation: %v", method, err)
		}
		var resp struct {
			ID     json.RawMessage   `json:"id"`
			Result uint64            `json:"result"`
			Error  *soltest.RPCError `json:"error"`
		}
		if json.Unmarshal(msg, &resp) != nil || resp.ID == nil {
			continue // a notification of an earlier subscription
		}
		if string(resp.ID) != fmt.Sprint(id) || resp.Error != nil {
			t.Fatalf("%s: response %s, want id %v and a result", method, msg, id)
		}
		return resp.Result
	}
}

func unsubscribe(t *testing.T, ws *wsConn, deadline time.Time, method string, sub uint64) {
	t.Helper()
	if err := ws.WriteText([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":%q,"params":[%d]}`, method, sub))); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := ws.ReadText(deadline)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if bytes.Contains(msg, []byte(`"id":1`)) {
			if !bytes.Contains(msg, []byte(`"result":true`)) {
				t.Fatalf("%s: %s", method, msg)
			}
			return
		}
	}
}

// notification returns the result of the next notification of sub.
func notification(t *testing.T, ws *wsConn, deadline time.Time, method string, sub uint64) json.RawMessage {
	t.Helper()
	for {
		msg, err := ws.ReadText(deadline)
		if err != nil {
			t.Fatalf("waiting for %s: %v", method, err)
		}
		var n struct {
			Method string `json:"method"`
			Params struct {
				Result       json.RawMessage `json:"result"`
				Subscription uint64          `json:"subscription"`
			} `json:"params"`
		}
		if json.Unmarshal(msg, &n) == nil && n.Method == method && n.Params.Subscription == sub {
			return n.Params.Result
		}
	}
}

// Base58 (Bitcoin alphabet), as Solana writes keys and signatures.

// TestManualClock: with WithManualClock the Clock sysvar's time stands still
// while slots pass, moves to what SetClock says, and never goes back.
func TestManualClock(t *testing.T) {
	if _, err := lookNode(); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	v, err := Start(ctx, WithSlotDuration(5*time.Millisecond), WithManualClock())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	rpc := &soltest.RPC{URL: v.RPC}
	clock := func() (uint64, int64) { return readClock(t, rpc) }
	slot0, start := clock()
	// Wait for slots to pass (an event the chain reports), not for time.
	var slot uint64
	for slot <= slot0+20 {
		rpc.Decode(t, rpc.Call(t, "getSlot"), &slot)
	}
	if _, unix := clock(); unix != start {
		t.Fatalf("the manual clock moved from %d to %d by itself", start, unix)
	}
	if err := v.SetClock(ctx, time.Unix(start+90, 0)); err != nil {
		t.Fatal(err)
	}
	if _, unix := clock(); unix != start+90 {
		t.Fatalf("after SetClock(+90s) the Clock sysvar reads %d, want %d", unix, start+90)
	}
	if err := v.SetClock(ctx, time.Unix(start, 0)); err == nil || !strings.Contains(err.Error(), "cannot go back") {
		t.Fatalf("SetClock backwards: %v, want a refusal", err)
	}

	// A validator on wall time refuses.
	wall, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer wall.Close()
	if err := wall.SetClock(ctx, time.Now().Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "--manual-clock") {
		t.Fatalf("SetClock on a wall-time validator: %v, want a refusal naming --manual-clock", err)
	}
}

// readClock reads the Clock sysvar: its slot and unix_timestamp.
func readClock(t *testing.T, rpc *soltest.RPC) (slot uint64, unix int64) {
	t.Helper()
	var acct struct {
		Value struct{ Data []string }
	}
	rpc.Decode(t, rpc.Call(t, "getAccountInfo", "SysvarC1ock11111111111111111111111111111111", map[string]string{"encoding": "base64"}), &acct)
	raw, err := base64.StdEncoding.DecodeString(acct.Value.Data[0])
	if err != nil || len(raw) != 40 {
		t.Fatalf("Clock sysvar data %q (%v)", acct.Value.Data, err)
	}
	return binary.LittleEndian.Uint64(raw[0:]), int64(binary.LittleEndian.Uint64(raw[32:]))
}
