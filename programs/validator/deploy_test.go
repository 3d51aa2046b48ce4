package validator

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/soltest"
)

// The real deployment path: a program written through the upgradeable loader
// (loader-v3) in ordinary transactions — buffer, writes, deploy — as the
// Solana CLI does it, then invoked.

const (
	systemProgram = "11111111111111111111111111111111"
	loaderV3      = "BPFLoaderUpgradeab1e11111111111111111111111"
	sysvarRent    = "SysvarRent111111111111111111111111111111111"
	sysvarClock   = "SysvarC1ock11111111111111111111111111111111"
)

func TestDeployLoaderV3(t *testing.T) {
	if testing.Short() {
		t.Skip("deploys through the validator")
	}
	if _, err := lookNode(); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	so, err := os.ReadFile(filepath.Join("..", "sbpf", "testdata", "syscall.so"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	v, err := Start(ctx, WithSlotDuration(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	rpc := &soltest.RPC{URL: v.RPC}
	ws, err := dialWS(v.WebSocket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	deadline := time.Now().Add(60 * time.Second)

	_, payer, _ := ed25519.GenerateKey(nil)
	_, buffer, _ := ed25519.GenerateKey(nil)
	_, program, _ := ed25519.GenerateKey(nil)
	rpc.Call(t, "requestAirdrop", coordinator.Base58(soltest.Pub(payer)), 10_000_000_000)

	loader, system := soltest.Key(t, loaderV3), soltest.Key(t, systemProgram)
	rent := func(n int) uint64 {
		var l uint64
		rpc.Decode(t, rpc.Call(t, "getMinimumBalanceForRentExemption", n), &l)
		return l
	}
	blockhash := func() []byte {
		var latest struct{ Value struct{ Blockhash string } }
		rpc.Decode(t, rpc.Call(t, "getLatestBlockhash"), &latest)
		return soltest.Key(t, latest.Value.Blockhash)
	}
	send := func(what string, signers []ed25519.PrivateKey, ixs ...soltest.Instruction) {
		t.Helper()
		tx := soltest.CompileTx(payer, signers, blockhash(), ixs...)
		if _, rerr := rpc.Try("sendTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}); rerr != nil {
			t.Fatalf("%s: %+v", what, rerr)
		}
	}
	createAccount := func(to ed25519.PrivateKey, space int) soltest.Instruction {
		data := binary.LittleEndian.AppendUint32(nil, 0) // SystemInstruction::CreateAccount
		data = binary.LittleEndian.AppendUint64(data, rent(space))
		data = binary.LittleEndian.AppendUint64(data, uint64(space))
		data = append(data, loader...)
		return soltest.Instruction{Program: system, Accounts: []soltest.Meta{{Key: soltest.Pub(payer), Signer: true, Writable: true}, {Key: soltest.Pub(to), Signer: true, Writable: true}}, Data: data}
	}

	// Buffer: 37 bytes of loader state, then the program.
	const bufferHeader = 37
	send("create buffer", []ed25519.PrivateKey{buffer},
		createAccount(buffer, bufferHeader+len(so)),
		soltest.Instruction{Program: loader, Accounts: []soltest.Meta{{Key: soltest.Pub(buffer), Signer: false, Writable: true}, {Key: soltest.Pub(payer), Signer: false, Writable: false}}, Data: binary.LittleEndian.AppendUint32(nil, 0)}) // InitializeBuffer
	const chunk = 900 // fits a 1232-byte transaction
	for off := 0; off < len(so); off += chunk {
		part := so[off:min(off+chunk, len(so))]
		data := binary.LittleEndian.AppendUint32(nil, 1) // Write { offset, bytes }
		data = binary.LittleEndian.AppendUint32(data, uint32(off))
		data = binary.LittleEndian.AppendUint64(data, uint64(len(part)))
		data = append(data, part...)
		send("write", nil, soltest.Instruction{Program: loader, Accounts: []soltest.Meta{{Key: soltest.Pub(buffer), Signer: false, Writable: true}, {Key: soltest.Pub(payer), Signer: true, Writable: false}}, Data: data})
	}
	programData, _ := soltest.FindProgramAddress([][]byte{soltest.Pub(program)}, loader)
	deploy := binary.LittleEndian.AppendUint32(nil, 2) // DeployWithMaxDataLen
	deploy = binary.LittleEndian.AppendUint64(deploy, uint64(len(so)))
	send("deploy", []ed25519.PrivateKey{program},
		createAccount(program, 36),
		soltest.Instruction{Program: loader, Accounts: []soltest.Meta{{Key: soltest.Pub(payer), Signer: true, Writable: true}, {Key: programData, Signer: false, Writable: true}, {Key: soltest.Pub(program), Signer: false, Writable: true}, {Key: soltest.Pub(buffer), Signer: false, Writable: true}, {Key: soltest.Key(t, sysvarRent), Signer: false, Writable: false}, {Key: soltest.Key(t, sysvarClock), Signer: false, Writable: false}, {Key: system, Signer: false, Writable: false}, {Key: soltest.Pub(payer), Signer: true, Writable: false}}, Data: deploy})

	// A deployed program becomes callable from the next slot on.
	var deployedAt uint64
	rpc.Decode(t, rpc.Call(t, "getSlot"), &deployedAt)
	slotSub := subscribe(t, ws, deadline, 3, "slotSubscribe")
	for {
		var n struct{ Slot uint64 }
		rpc.Decode(t, notification(t, ws, deadline, "slotNotification", slotSub), &n)
		if n.Slot > deployedAt {
			break
		}
	}
	tx := soltest.CompileTx(payer, nil, blockhash(), soltest.Instruction{Program: soltest.Pub(program), Accounts: nil, Data: []byte{1}})
	var sim struct {
		Value struct {
			Err  any
			Logs []string
		}
	}
	rpc.Decode(t, rpc.Call(t, "simulateTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}), &sim)
	if logs := strings.Join(sim.Value.Logs, "\n"); sim.Value.Err != nil || !strings.Contains(logs, "Program log: hello from sbpf") {
		t.Errorf("deployed program: err %v, logs:\n%s", sim.Value.Err, logs)
	}
}
