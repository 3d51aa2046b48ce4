package validator

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

type accountMeta struct {
	key              []byte
	signer, writable bool
}

type instruction struct {
	program  []byte
	accounts []accountMeta
	data     []byte
}

// compileTx builds and signs a legacy transaction: accounts ordered as the
// runtime requires (writable signers from the payer on, read-only signers,
// writable others, read-only others), every signer's key in signers.
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
	add(payer.Public().(ed25519.PublicKey), true, true)
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
	keysByPub := map[string]ed25519.PrivateKey{string(payer.Public().(ed25519.PublicKey)): payer}
	for _, s := range signers {
		keysByPub[string(s.Public().(ed25519.PublicKey))] = s
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

func mustB58(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base58Decode(s)
	if err != nil || len(b) > 32 {
		t.Fatalf("base58 %q: %v", s, err)
	}
	return append(make([]byte, 32-len(b)), b...)
}

// onCurve reports whether 32 bytes decode to a point of edwards25519 (RFC
// 8032 §5.1.3): program-derived addresses must not.
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
	// d = -121665/121666
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
	// Euler's criterion: x² must be a square.
	e := new(big.Int).Rsh(new(big.Int).Sub(p, big.NewInt(1)), 1)
	return new(big.Int).Exp(x2, e, p).Cmp(big.NewInt(1)) == 0
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

func TestOnCurve(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	if !onCurve(pub) {
		t.Error("an ed25519 public key is not on the curve")
	}
	// About half of all 32-byte strings decode to a point. (That derived
	// addresses are right is shown by the loader accepting them below.)
	on := 0
	for i := 0; i < 256; i++ {
		h := sha256.Sum256([]byte{byte(i)})
		if onCurve(h[:]) {
			on++
		}
	}
	if on < 96 || on > 160 {
		t.Errorf("%d of 256 hashes on the curve, want about half", on)
	}
}

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
	rpc := &rpcClient{url: v.RPC}
	ws, err := dialWS(v.WebSocket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	deadline := time.Now().Add(60 * time.Second)

	_, payer, _ := ed25519.GenerateKey(nil)
	_, buffer, _ := ed25519.GenerateKey(nil)
	_, program, _ := ed25519.GenerateKey(nil)
	pub := func(k ed25519.PrivateKey) []byte { return k.Public().(ed25519.PublicKey) }
	rpc.call(t, "requestAirdrop", base58Encode(pub(payer)), 10_000_000_000)

	loader, system := mustB58(t, loaderV3), mustB58(t, systemProgram)
	rent := func(n int) uint64 {
		var l uint64
		rpc.decode(t, rpc.call(t, "getMinimumBalanceForRentExemption", n), &l)
		return l
	}
	blockhash := func() []byte {
		var latest struct{ Value struct{ Blockhash string } }
		rpc.decode(t, rpc.call(t, "getLatestBlockhash"), &latest)
		return mustB58(t, latest.Value.Blockhash)
	}
	send := func(what string, signers []ed25519.PrivateKey, ixs ...instruction) {
		t.Helper()
		tx := compileTx(payer, signers, blockhash(), ixs...)
		if _, rerr := rpc.try("sendTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}); rerr != nil {
			t.Fatalf("%s: %+v", what, rerr)
		}
	}
	createAccount := func(to ed25519.PrivateKey, space int) instruction {
		data := binary.LittleEndian.AppendUint32(nil, 0) // SystemInstruction::CreateAccount
		data = binary.LittleEndian.AppendUint64(data, rent(space))
		data = binary.LittleEndian.AppendUint64(data, uint64(space))
		data = append(data, loader...)
		return instruction{system, []accountMeta{{pub(payer), true, true}, {pub(to), true, true}}, data}
	}

	// Buffer: 37 bytes of loader state, then the program.
	const bufferHeader = 37
	send("create buffer", []ed25519.PrivateKey{buffer},
		createAccount(buffer, bufferHeader+len(so)),
		instruction{loader, []accountMeta{{pub(buffer), false, true}, {pub(payer), false, false}},
			binary.LittleEndian.AppendUint32(nil, 0)}) // InitializeBuffer
	const chunk = 900 // fits a 1232-byte transaction
	for off := 0; off < len(so); off += chunk {
		part := so[off:min(off+chunk, len(so))]
		data := binary.LittleEndian.AppendUint32(nil, 1) // Write { offset, bytes }
		data = binary.LittleEndian.AppendUint32(data, uint32(off))
		data = binary.LittleEndian.AppendUint64(data, uint64(len(part)))
		data = append(data, part...)
		send("write", nil, instruction{loader, []accountMeta{{pub(buffer), false, true}, {pub(payer), true, false}}, data})
	}
	programData := findProgramAddress([][]byte{pub(program)}, loader)
	deploy := binary.LittleEndian.AppendUint32(nil, 2) // DeployWithMaxDataLen
	deploy = binary.LittleEndian.AppendUint64(deploy, uint64(len(so)))
	send("deploy", []ed25519.PrivateKey{program},
		createAccount(program, 36),
		instruction{loader, []accountMeta{
			{pub(payer), true, true}, {programData, false, true}, {pub(program), false, true}, {pub(buffer), false, true},
			{mustB58(t, sysvarRent), false, false}, {mustB58(t, sysvarClock), false, false}, {system, false, false},
			{pub(payer), true, false},
		}, deploy})

	// A deployed program becomes callable from the next slot on.
	var deployedAt uint64
	rpc.decode(t, rpc.call(t, "getSlot"), &deployedAt)
	slotSub := subscribe(t, ws, deadline, 3, "slotSubscribe")
	for {
		var n struct{ Slot uint64 }
		rpc.decode(t, notification(t, ws, deadline, "slotNotification", slotSub), &n)
		if n.Slot > deployedAt {
			break
		}
	}
	tx := compileTx(payer, nil, blockhash(), instruction{pub(program), nil, []byte{1}})
	var sim struct {
		Value struct {
			Err  any
			Logs []string
		}
	}
	rpc.decode(t, rpc.call(t, "simulateTransaction", base64.StdEncoding.EncodeToString(tx), map[string]any{"encoding": "base64"}), &sim)
	if logs := strings.Join(sim.Value.Logs, "\n"); sim.Value.Err != nil || !strings.Contains(logs, "Program log: hello from sbpf") {
		t.Errorf("deployed program: err %v, logs:\n%s", sim.Value.Err, logs)
	}
}
