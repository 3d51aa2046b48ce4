// Package solana is the chain.Backend of a coordinator that lives in a Solana
// program account (programs/coordinator), reached over JSON-RPC and websocket
// with gagliardetto/solana-go.
//
// A run has two accounts: the instance, a PDA ["coordinator", run_id] of 80
// bytes that names the run's coordinator account, and the coordinator account
// itself (too large to create from inside a program, so the creator's
// transaction creates it with the system program, funds the instance and
// calls init_coordinator). Every program instruction takes the accounts
// [instance, coordinator, sender, extras…]; the extras are the system program
// for init_coordinator, the join authority's co-signature for join_run, and
// the SlotHashes sysvar for tick and warmup_witness (the program derives the
// round seed from it).
package solana

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sol "github.com/gagliardetto/solana-go"
	computebudget "github.com/gagliardetto/solana-go/programs/compute-budget"
	"github.com/gagliardetto/solana-go/programs/system"
	"github.com/gagliardetto/solana-go/rpc"
	"github.com/gagliardetto/solana-go/rpc/jsonrpc"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/programs/abi"
)

// LocalProgramID is abi.LocalProgramID, where `psyche validator` and the
// tests preload the coordinator program (a deployment names its own id).
var LocalProgramID = sol.PublicKeyFromBytes(abi.LocalProgramID[:])

// Errors a caller can branch on.
var (
	ErrRPCDown      = errors.New("solana: no RPC endpoint answered")
	ErrWrongOwner   = errors.New("solana: account is not owned by the coordinator program")
	ErrNotConfirmed = errors.New("solana: transaction was not confirmed in time")
	ErrInsufficient = errors.New("solana: insufficient lamports")
)

// Backend is the Solana chain.Backend.
type Backend struct {
	cfg     config
	clients []*rpc.Client

	mu       sync.Mutex
	accounts map[string]sol.PublicKey // run id -> coordinator account, as its instance named it
	bh       blockhashCache
	repeats  atomic.Uint32 // uniqueLimit's counter
}

// blockhashCache keeps a recent blockhash for blockhashReuse, so that a
// send is not one more RPC round trip behind getLatestBlockhash (a blockhash
// stays valid for ~150 slots, a minute). Two identical messages under one
// blockhash would be one transaction (the same signature: the second is
// refused as already processed), so the signatures sent under it are kept
// and a repeat is made unique (uniqueLimit).
type blockhashCache struct {
	hash    sol.Hash
	fetched time.Time
	sent    map[sol.Signature]bool
}

// blockhashReuse is how long a fetched blockhash is reused: far inside its
// validity, so a send that is retried or waits a while still lands.
const blockhashReuse = 10 * time.Second

var _ chain.Backend = (*Backend)(nil)

// New returns a backend; it does not connect until used.
func New(opts ...Option) (*Backend, error) {
	cfg := config{program: LocalProgramID, log: slog.New(slog.DiscardHandler), retries: 3, confirm: 30 * time.Second}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if len(cfg.rpcs) == 0 {
		return nil, errors.New("solana: no RPC endpoint given")
	}
	if len(cfg.wss) == 0 {
		return nil, errors.New("solana: no websocket endpoint given")
	}
	b := &Backend{cfg: cfg, accounts: map[string]sol.PublicKey{}}
	for _, u := range cfg.rpcs {
		b.clients = append(b.clients, rpc.New(u))
	}
	return b, nil
}

// call runs f on each endpoint in turn, retrying transport failures with
// backoff; an answer from the node (including a JSON-RPC error such as a
// failed simulation) is final.
func (b *Backend) call(ctx context.Context, f func(*rpc.Client) error) error {
	var last error
	backoff := 100 * time.Millisecond
	for attempt := 0; attempt <= b.cfg.retries; attempt++ {
		for _, c := range b.clients {
			err := f(c)
			if err == nil || !isTransport(err) {
				return err
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	return fmt.Errorf("%w: %v", ErrRPCDown, last)
}

func isTransport(err error) bool {
	var rpcErr *jsonrpc.RPCError
	return !errors.As(err, &rpcErr) && !errors.Is(err, rpc.ErrNotFound) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, context.DeadlineExceeded)
}

// Instance is the address of a run's instance PDA.
func (b *Backend) Instance(runID string) (sol.PublicKey, error) {
	id, err := coordinator.ParseRunID(runID)
	if err != nil {
		return sol.PublicKey{}, err
	}
	addr, _, err := sol.FindProgramAddress(abi.InstanceSeeds(id), b.cfg.program)
	return addr, err
}

func (b *Backend) accountData(ctx context.Context, key sol.PublicKey) ([]byte, sol.PublicKey, error) {
	return b.accountSlice(ctx, key, nil)
}

// accountSlice is accountData of the first head bytes only (all with nil).
func (b *Backend) accountSlice(ctx context.Context, key sol.PublicKey, head *uint64) ([]byte, sol.PublicKey, error) {
	var res *rpc.GetAccountInfoResult
	opts := &rpc.GetAccountInfoOpts{Encoding: sol.EncodingBase64, Commitment: rpc.CommitmentConfirmed}
	if head != nil {
		zero := uint64(0)
		opts.DataSlice = &rpc.DataSlice{Offset: &zero, Length: head}
	}
	err := b.call(ctx, func(c *rpc.Client) error {
		var err error
		res, err = c.GetAccountInfoWithOpts(ctx, key, opts)
		return err
	})
	if errors.Is(err, rpc.ErrNotFound) || (err == nil && (res == nil || res.Value == nil)) {
		return nil, sol.PublicKey{}, rpc.ErrNotFound
	}
	if err != nil {
		return nil, sol.PublicKey{}, err
	}
	return res.Value.Data.GetBinary(), res.Value.Owner, nil
}

// coordinatorAccount finds a run's coordinator account through its instance.
func (b *Backend) coordinatorAccount(ctx context.Context, runID string) (instance, account sol.PublicKey, err error) {
	if instance, err = b.Instance(runID); err != nil {
		return
	}
	data, owner, err := b.accountData(ctx, instance)
	if errors.Is(err, rpc.ErrNotFound) {
		return instance, account, fmt.Errorf("%w: %q", chain.ErrRunNotFound, runID)
	}
	if err != nil {
		return
	}
	if owner != b.cfg.program {
		return instance, account, fmt.Errorf("%w: instance of %q is owned by %s", ErrWrongOwner, runID, owner)
	}
	rec, err := abi.DecodeInstance(data)
	if err != nil {
		return instance, account, fmt.Errorf("solana: instance of %q: %w", runID, err)
	}
	return instance, sol.PublicKeyFromBytes(rec.Coordinator[:]), nil
}

// Snapshot implements chain.Backend.
func (b *Backend) Snapshot(ctx context.Context, runID string) (chain.Snapshot, error) {
	_, account, err := b.coordinatorAccount(ctx, runID)
	if err != nil {
		return chain.Snapshot{}, err
	}
	return b.snapshotOf(ctx, account)
}

// headOf is the nonce and run state of a coordinator account, read from
// the account's first coordinator.AccountHeadSize bytes: a receipt needs no
// more, and the whole account is ~160 KB of base64 JSON for the node to
// encode and this process to decode, twice per instruction.
func (b *Backend) headOf(ctx context.Context, account sol.PublicKey) (nonce uint64, state coordinator.RunState, err error) {
	n := uint64(coordinator.AccountHeadSize)
	data, owner, err := b.accountSlice(ctx, account, &n)
	if errors.Is(err, rpc.ErrNotFound) {
		return 0, 0, fmt.Errorf("%w: coordinator account %s", chain.ErrRunNotFound, account)
	}
	if err != nil {
		return 0, 0, err
	}
	if owner != b.cfg.program {
		return 0, 0, fmt.Errorf("%w: coordinator account %s is owned by %s", ErrWrongOwner, account, owner)
	}
	if nonce, state, err = coordinator.DecodeAccountHead(data); err != nil {
		return 0, 0, fmt.Errorf("solana: coordinator account %s: %w", account, err)
	}
	return nonce, state, nil
}

func (b *Backend) snapshotOf(ctx context.Context, account sol.PublicKey) (chain.Snapshot, error) {
	data, owner, err := b.accountData(ctx, account)
	if errors.Is(err, rpc.ErrNotFound) {
		return chain.Snapshot{}, fmt.Errorf("%w: coordinator account %s", chain.ErrRunNotFound, account)
	}
	if err != nil {
		return chain.Snapshot{}, err
	}
	if owner != b.cfg.program {
		return chain.Snapshot{}, fmt.Errorf("%w: coordinator account %s is owned by %s", ErrWrongOwner, account, owner)
	}
	state, err := coordinator.DecodeAccount(data)
	if err != nil {
		return chain.Snapshot{}, fmt.Errorf("solana: coordinator account %s: %w", account, err)
	}
	return chain.Snapshot{State: state}, nil
}

// Send implements chain.Backend.
func (b *Backend) Send(ctx context.Context, runID string, signer, coSigner chain.Signer, ix coordinator.Instruction) (chain.Receipt, error) {
	signers := map[sol.PublicKey]chain.Signer{key(signer): signer}
	var ixs []sol.Instruction
	var instance, account sol.PublicKey
	var before coordinator.RunState
	var beforeNonce uint64 // 0: unknown
	sender := key(signer)
	data := coordinator.EncodeInstruction(ix)
	t0 := time.Now() // phase timings for the debug log: where an instruction's latency goes
	switch ix.(type) {
	case *coordinator.InitCoordinator:
		var err error
		if instance, err = b.Instance(runID); err != nil {
			return chain.Receipt{}, err
		}
		// The program refuses a second init too; asking first gives the
		// same error as the server backend instead of a runtime one.
		if _, _, err := b.accountData(ctx, instance); err == nil {
			return chain.Receipt{}, fmt.Errorf("init_coordinator: %w", coordinator.ErrAlreadyInitialized)
		} else if !errors.Is(err, rpc.ErrNotFound) {
			return chain.Receipt{}, err
		}
		acct, err := chain.NewKeypair()
		if err != nil {
			return chain.Receipt{}, err
		}
		account = key(acct)
		signers[account] = acct
		var big, small uint64
		if err := b.call(ctx, func(c *rpc.Client) error {
			var err error
			if big, err = c.GetMinimumBalanceForRentExemption(ctx, uint64(coordinator.AccountSize), rpc.CommitmentConfirmed); err != nil {
				return err
			}
			small, err = c.GetMinimumBalanceForRentExemption(ctx, abi.InstanceSize, rpc.CommitmentConfirmed)
			return err
		}); err != nil {
			return chain.Receipt{}, err
		}
		ixs = append(ixs,
			system.NewCreateAccountInstruction(big, uint64(coordinator.AccountSize), b.cfg.program, sender, account).Build(),
			system.NewTransferInstruction(small, sender, instance).Build())
	default:
		var err error
		if instance, account, beforeNonce, before, err = b.current(ctx, runID); err != nil {
			return chain.Receipt{}, err
		}
	}
	keys := abi.Keys{Instance: coordinator.Pubkey(instance), Coordinator: coordinator.Pubkey(account), Sender: coordinator.Pubkey(sender)}
	if coSigner != nil {
		co := coSigner.Public()
		signers[sol.PublicKeyFromBytes(co[:])] = coSigner
		keys.CoSigner = &co
	}
	accounts, err := abi.Accounts(ix.Name(), keys)
	if err != nil {
		return chain.Receipt{}, fmt.Errorf("solana: %w", err)
	}
	metas := make(sol.AccountMetaSlice, 0, len(accounts))
	for _, a := range accounts {
		metas = append(metas, sol.NewAccountMeta(sol.PublicKeyFromBytes(a.Key[:]), a.Writable, a.Signer))
	}
	ixs = append(ixs, sol.NewInstruction(b.cfg.program, metas, data))
	t1 := time.Now()
	sent, err := b.submit(ctx, ix.Name(), sender, signers, ixs)
	if err != nil {
		return chain.Receipt{}, err
	}
	t2 := time.Now()
	defer func() {
		b.cfg.log.Debug("solana send", "ix", ix.Name(), "before", t1.Sub(t0).Round(time.Millisecond),
			"send", sent.Sub(t1).Round(time.Millisecond), "confirm", t2.Sub(sent).Round(time.Millisecond),
			"after", time.Since(t2).Round(time.Millisecond))
	}()
	if _, free := ix.(*coordinator.FreeCoordinator); free {
		b.mu.Lock()
		delete(b.accounts, runID)
		b.mu.Unlock()
		return chain.Receipt{Changed: true, From: before, To: before}, nil
	}
	nonce, state, err := b.headOf(ctx, account)
	if err != nil {
		return chain.Receipt{}, err
	}
	// Every change bumps the nonce, so an unchanged nonce means the
	// instruction changed nothing (a program older than the NothingDue
	// error let a tick with nothing due succeed). A changed one may include
	// someone else's instruction landing in between.
	changed := beforeNonce == 0 || nonce != beforeNonce
	return chain.Receipt{Changed: changed, From: before, To: state, Nonce: nonce}, nil
}

// current is a run's instance and coordinator account for Send, with the
// account's nonce and run state before the instruction (nonce 0: unknown).
// The coordinator account a run's instance names is remembered (asking the
// instance first is one more serial RPC round trip per instruction); a run
// freed and created again under the same id has a new account, and the old
// one is gone, so a remembered account that is not there is looked up again.
func (b *Backend) current(ctx context.Context, runID string) (instance, account sol.PublicKey, nonce uint64, state coordinator.RunState, err error) {
	if instance, err = b.Instance(runID); err != nil {
		return
	}
	b.mu.Lock()
	account, ok := b.accounts[runID]
	b.mu.Unlock()
	if ok {
		nonce, state, err = b.headOf(ctx, account)
		if err == nil {
			return
		}
		if !errors.Is(err, chain.ErrRunNotFound) && !errors.Is(err, ErrWrongOwner) {
			return instance, account, 0, 0, nil // unknown, as below
		}
	}
	if instance, account, err = b.coordinatorAccount(ctx, runID); err != nil {
		return
	}
	b.mu.Lock()
	b.accounts[runID] = account
	b.mu.Unlock()
	if nonce, state, err = b.headOf(ctx, account); err != nil {
		// The instruction goes ahead; the program checks the account. The
		// receipt then reports the state after it as changed.
		return instance, account, 0, 0, nil
	}
	return
}

func key(s chain.Signer) sol.PublicKey { p := s.Public(); return sol.PublicKeyFromBytes(p[:]) }

// submit signs, sends (with preflight, so program errors come back at once)
// and waits for confirmation.
// It returns when the node accepted the transaction, for the debug log.
func (b *Backend) submit(ctx context.Context, what string, payer sol.PublicKey, signers map[sol.PublicKey]chain.Signer, ixs []sol.Instruction) (sent time.Time, err error) {
	var sig sol.Signature
	msgIxs := ixs
	for fresh, tries := false, 0; ; tries++ {
		if tries == 8 {
			return sent, fmt.Errorf("solana: %s: no unique message after %d tries", what, tries)
		}
		bh, err := b.blockhash(ctx, fresh)
		if err != nil {
			return sent, err
		}
		tx, err := sol.NewTransaction(msgIxs, bh, sol.TransactionPayer(payer))
		if err != nil {
			return sent, fmt.Errorf("solana: building %s: %w", what, err)
		}
		msg, err := tx.Message.MarshalBinary()
		if err != nil {
			return sent, fmt.Errorf("solana: encoding %s: %w", what, err)
		}
		for _, k := range tx.Message.Signers() {
			s, ok := signers[k]
			if !ok {
				return sent, fmt.Errorf("solana: %s needs a signature of %s", what, k)
			}
			tx.Signatures = append(tx.Signatures, sol.SignatureFromBytes(s.Sign(msg)))
		}
		if !b.claim(bh, tx.Signatures[0]) {
			// The same message under this blockhash was sent before: a
			// repeated instruction (a tick carries no data of its own).
			// A compute-unit limit that differs from every earlier one
			// makes it a new transaction at once; the next blockhash would
			// take up to a slot.
			msgIxs = append([]sol.Instruction{b.uniqueLimit()}, ixs...)
			continue
		}
		err = b.call(ctx, func(c *rpc.Client) error {
			var err error
			sig, err = c.SendTransactionWithOpts(ctx, tx, rpc.TransactionOpts{PreflightCommitment: rpc.CommitmentConfirmed})
			return err
		})
		if err != nil && !fresh && strings.Contains(err.Error(), "BlockhashNotFound") {
			fresh = true
			continue // the reused blockhash expired after all (a node restarted, slots sped up)
		}
		if err != nil {
			return sent, programError(what, err)
		}
		break
	}
	sent = time.Now()
	// A short fixed interval first: a confirmation comes within a slot or
	// two (at once on the local validator, which executes on receipt), and a
	// doubling wait would add up to half of itself after it. Then back off.
	deadline := time.Now().Add(b.cfg.confirm)
	fast := time.Now().Add(3 * time.Second)
	for wait := 50 * time.Millisecond; ; {
		var st *rpc.GetSignatureStatusesResult
		err := b.call(ctx, func(c *rpc.Client) error {
			var err error
			st, err = c.GetSignatureStatuses(ctx, false, sig)
			return err
		})
		if err != nil {
			return sent, err
		}
		if len(st.Value) == 1 && st.Value[0] != nil {
			s := st.Value[0]
			if s.Err != nil {
				return sent, programError(what, fmt.Errorf("%v", jsonOf(s.Err)))
			}
			if s.ConfirmationStatus == rpc.ConfirmationStatusConfirmed || s.ConfirmationStatus == rpc.ConfirmationStatusFinalized {
				return sent, nil
			}
		}
		if time.Now().After(deadline) {
			return sent, fmt.Errorf("%w: %s %s", ErrNotConfirmed, what, sig)
		}
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-time.After(wait):
		}
		if time.Now().After(fast) {
			wait = min(2*wait, time.Second)
		}
	}
}

// blockhash is a recent blockhash: the cached one while it is younger than
// blockhashReuse, unless fresh asks for the node's latest.
func (b *Backend) blockhash(ctx context.Context, fresh bool) (sol.Hash, error) {
	b.mu.Lock()
	c := b.bh
	b.mu.Unlock()
	if !fresh && !c.fetched.IsZero() && time.Since(c.fetched) < blockhashReuse {
		return c.hash, nil
	}
	var bh *rpc.GetLatestBlockhashResult
	if err := b.call(ctx, func(c *rpc.Client) error {
		var err error
		bh, err = c.GetLatestBlockhash(ctx, rpc.CommitmentConfirmed)
		return err
	}); err != nil {
		return sol.Hash{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if bh.Value.Blockhash != b.bh.hash {
		b.bh = blockhashCache{hash: bh.Value.Blockhash, fetched: time.Now(), sent: map[sol.Signature]bool{}}
	}
	return bh.Value.Blockhash, nil
}

// uniqueLimit is a compute-budget instruction that sets the transaction's
// compute-unit limit to one no earlier call of this backend gave (within
// 2^16 calls): the most a transaction may use, less a counter. Without a
// unit price it costs nothing, and the limit stays far above what any
// coordinator instruction uses.
func (b *Backend) uniqueLimit() sol.Instruction {
	const maxUnits = 1_400_000
	n := b.repeats.Add(1)
	return computebudget.NewSetComputeUnitLimitInstruction(maxUnits - uint32(n%(1<<16))).Build()
}

// claim records a transaction's signature under blockhash bh; false means
// it was sent before (identical message and blockhash).
func (b *Backend) claim(bh sol.Hash, sig sol.Signature) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bh.hash != bh {
		return true // not the cached one (a newer one replaced it meanwhile)
	}
	if b.bh.sent[sig] {
		return false
	}
	b.bh.sent[sig] = true
	return true
}

var (
	customCode   = regexp.MustCompile(`"Custom"\s*:\s*(\d+)`)
	insufficient = regexp.MustCompile(`(?i)insufficient (funds|lamports)`)
)

// programError turns a failed transaction into the coordinator error with the
// program's custom code, so errors.Is works as with the server backend.
func programError(what string, err error) error {
	text := err.Error()
	var rpcErr *jsonrpc.RPCError
	if errors.As(err, &rpcErr) {
		text = rpcErr.Message + " " + jsonOf(rpcErr.Data)
	}
	if m := customCode.FindStringSubmatch(text); m != nil {
		if code, _ := strconv.ParseUint(m[1], 10, 32); code > 0 {
			if e := coordinator.ErrorFromCode(uint32(code)); e != nil {
				return fmt.Errorf("%s: %w", what, e)
			}
		}
	}
	switch {
	case insufficient.MatchString(text):
		return fmt.Errorf("%w: %s: %s", ErrInsufficient, what, text)
	case strings.Contains(text, "AccountNotFound"):
		// The fee payer has never held lamports.
		return fmt.Errorf("%w: %s: the paying key has no account (no lamports): %s", ErrInsufficient, what, text)
	}
	return fmt.Errorf("solana: %s failed: %s", what, text)
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Airdrop asks the node for lamports (local validators and test networks).
func (b *Backend) Airdrop(ctx context.Context, to coordinator.Pubkey, lamports uint64) error {
	var sig sol.Signature
	if err := b.call(ctx, func(c *rpc.Client) error {
		var err error
		sig, err = c.RequestAirdrop(ctx, sol.PublicKeyFromBytes(to[:]), lamports, rpc.CommitmentConfirmed)
		return err
	}); err != nil {
		return fmt.Errorf("solana: airdrop: %w", err)
	}
	for i := 0; i < 100; i++ {
		var st *rpc.GetSignatureStatusesResult
		if err := b.call(ctx, func(c *rpc.Client) error {
			var err error
			st, err = c.GetSignatureStatuses(ctx, false, sig)
			return err
		}); err != nil {
			return err
		}
		if len(st.Value) == 1 && st.Value[0] != nil && st.Value[0].ConfirmationStatus != "" && st.Value[0].ConfirmationStatus != rpc.ConfirmationStatusProcessed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%w: airdrop %s", ErrNotConfirmed, sig)
}
