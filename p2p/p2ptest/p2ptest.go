// Package p2ptest is the one suite every p2p.Network implementation passes
// (p2p/libp2p over real hosts, p2p/memnet in memory): the contract the
// trainer relies on, tested the same way for both.
package p2ptest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// RunID is the run every node of the suite belongs to.
const RunID = "p2ptest"

// Harness makes the nodes under test.
type Harness struct {
	// New returns a running node of run RunID with p2p key key that
	// publishes as signer. The suite closes nothing: the harness cleans up
	// when the test ends.
	New func(t *testing.T, key ed25519.PrivateKey, signer coordinator.Pubkey) p2p.Network
}

// Key is the suite's p2p key for name.
func Key(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("p2ptest key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// ID is name's client identity.
func ID(name string) coordinator.ClientID {
	var id coordinator.ClientID
	copy(id.P2P[:], Key(name).Public().(ed25519.PublicKey))
	id.Signer = sha256.Sum256([]byte("p2ptest signer " + name))
	return id
}

type node struct {
	p2p.Network
	name string
}

// cluster starts named nodes that are the epoch's clients, at step 5, with
// batch [i, i+1) of steps 4 to 6 assigned to the i-th, each connected to
// the ones before it.
func cluster(t *testing.T, h Harness, names ...string) []node {
	var ids []coordinator.ClientID
	for _, n := range names {
		ids = append(ids, ID(n))
	}
	var as []p2p.Assignment
	for step := uint32(4); step <= 6; step++ {
		for i, id := range ids {
			as = append(as, p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: uint64(i), End: uint64(i) + 1}, Trainer: id})
		}
	}
	var out []node
	for i, n := range names {
		nd := node{Network: h.New(t, Key(n), ID(n).Signer), name: n}
		nd.SetClients(ids)
		nd.SetAssignments(as)
		nd.SetStep(5)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, prev := range out[:i] {
			if err := nd.Connect(ctx, prev.Addrs()[0]); err != nil {
				cancel()
				t.Fatalf("%s connecting to %s: %v", n, prev.name, err)
			}
		}
		cancel()
		out = append(out, nd)
	}
	return out
}

// await returns the announcement with commitment c once n has it, from
// gossip or, when gossip is slow, a pull (a guard of 30 s stops a hang).
func await(t *testing.T, n node, step uint32, c coordinator.Hash) p2p.Announcement {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case a := <-n.Announcements():
			if a.Commitment == c {
				return a
			}
		case <-time.After(100 * time.Millisecond):
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			list, _ := n.Pull(ctx, step)
			cancel()
			for _, a := range list {
				if a.Commitment == c {
					return a
				}
			}
		}
	}
	t.Fatalf("%s never received %x", n.name, c[:4])
	return p2p.Announcement{}
}

// awaitAll is await for several commitments, in whatever order they come.
func awaitAll(t *testing.T, n node, step uint32, cs ...coordinator.Hash) []p2p.Announcement {
	t.Helper()
	want := map[coordinator.Hash]bool{}
	for _, c := range cs {
		want[c] = true
	}
	var out []p2p.Announcement
	take := func(a p2p.Announcement) {
		if want[a.Commitment] {
			delete(want, a.Commitment)
			out = append(out, a)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(want) > 0 && time.Now().Before(deadline) {
		select {
		case a := <-n.Announcements():
			take(a)
		case <-time.After(100 * time.Millisecond):
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			list, _ := n.Pull(ctx, step)
			cancel()
			for _, a := range list {
				take(a)
			}
		}
	}
	if len(want) > 0 {
		t.Fatalf("%s never received %d of %d announcements", n.name, len(want), len(cs))
	}
	return out
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("addresses", func(t *testing.T) {
		n := h.New(t, Key("addr"), ID("addr").Signer)
		if n.ID() != ID("addr").P2P {
			t.Fatalf("ID %s, want the key's %s", n.ID(), ID("addr").P2P)
		}
		for _, a := range n.Addrs() {
			if k, err := n.AddrKey(a); err != nil || k != n.ID() {
				t.Errorf("AddrKey(%q) = %s, %v; want its own key", a, k, err)
			}
		}
		if _, err := n.AddrKey("not an address"); !errors.Is(err, p2p.ErrBadAddress) {
			t.Errorf("AddrKey of garbage: %v, want ErrBadAddress", err)
		}
	})

	t.Run("publish_deliver_fetch", func(t *testing.T) {
		ns := cluster(t, h, "a", "b", "c")
		a, b, c := ns[0], ns[1], ns[2]
		payload := bytes.Repeat([]byte("a's result "), 1000)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ann, err := a.Publish(ctx, 5, p2p.BatchRange{Start: 0, End: 1}, payload)
		if err != nil {
			t.Fatal(err)
		}
		if ann.Trainer.Signer != ID("a").Signer || ann.Commitment != p2p.Commitment(5, p2p.BatchRange{Start: 0, End: 1}, payload) {
			t.Fatalf("announcement %+v", ann)
		}
		for _, n := range []node{b, c} {
			got := await(t, n, 5, ann.Commitment)
			data, err := n.Fetch(ctx, got)
			if err != nil || !bytes.Equal(data, payload) {
				t.Fatalf("%s fetched %d bytes, %v", n.name, len(data), err)
			}
			// Delivered once: a pull does not return it again.
			list, _ := n.Pull(ctx, 5)
			for _, l := range list {
				if l.Commitment == ann.Commitment {
					t.Fatalf("%s got the announcement twice", n.name)
				}
			}
		}
		// A tampered announcement's payload does not match its commitment.
		bad := ann
		bad.Commitment[0] ^= 1
		if _, err := b.Fetch(ctx, bad); err == nil {
			t.Fatal("fetched a payload for a commitment it does not match")
		}
		// A result larger than the run's model allows is not fetched.
		c.SetMaxPayload(int64(len(payload)) - 1)
		if _, err := c.Fetch(ctx, ann); !errors.Is(err, p2p.ErrOversize) {
			t.Fatalf("an oversized result: %v, want ErrOversize", err)
		}
		c.SetMaxPayload(0)
	})

	t.Run("conflicting_announcements_are_all_delivered", func(t *testing.T) {
		// A trainer that signs two different results for one batch is
		// equivocating; its peers can only tell if the network hands them
		// both announcements, not just the first as a duplicate.
		ns := cluster(t, h, "k", "l", "o")
		k := ns[0]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		batch := p2p.BatchRange{Start: 0, End: 1}
		first, err := k.Publish(ctx, 5, batch, []byte("k's result"))
		if err != nil {
			t.Fatal(err)
		}
		second, err := k.Publish(ctx, 5, batch, []byte("k's other result"))
		if err != nil {
			t.Fatal(err)
		}
		if first.Commitment == second.Commitment {
			t.Fatal("two payloads, one commitment")
		}
		for _, n := range ns[1:] {
			for _, got := range awaitAll(t, n, 5, first.Commitment, second.Commitment) {
				if got.Trainer != ID("k") || got.Batch != batch {
					t.Fatalf("%s got %+v", n.name, got)
				}
				if _, err := n.Fetch(ctx, got); err != nil {
					t.Fatalf("%s fetching %x: %v", n.name, got.Commitment[:4], err)
				}
			}
			// Each once: a pull returns neither again.
			list, _ := n.Pull(ctx, 5)
			for _, l := range list {
				if l.Commitment == first.Commitment || l.Commitment == second.Commitment {
					t.Fatalf("%s got an announcement twice", n.name)
				}
			}
		}
	})

	t.Run("unassigned_is_refused", func(t *testing.T) {
		ns := cluster(t, h, "d", "e")
		d, e := ns[0], ns[1]
		// d's view gives batch [1,2) of step 5 to someone else than e.
		var as []p2p.Assignment
		for step := uint32(4); step <= 6; step++ {
			as = append(as, p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: 0, End: 1}, Trainer: ID("d")},
				p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: 1, End: 2}, Trainer: ID("nobody")})
		}
		d.SetAssignments(as)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ann, err := e.Publish(ctx, 5, p2p.BatchRange{Start: 1, End: 2}, []byte("e's result"))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for d.Stats().Rejected["not_assigned"] == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the unassigned announcement was never refused")
			}
			list, _ := d.Pull(ctx, 5)
			for _, l := range list {
				if l.Commitment == ann.Commitment {
					t.Fatal("an unassigned announcement was delivered")
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("notices", func(t *testing.T) {
		// A trainer's notice that it trains its batch reaches its peers,
		// as its trainer signed it; one for a batch a peer's view assigns
		// to someone else is refused there and not delivered.
		ns := cluster(t, h, "m", "p", "q")
		m, p, q := ns[0], ns[1], ns[2]
		var as []p2p.Assignment
		for step := uint32(4); step <= 6; step++ {
			as = append(as, p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: 0, End: 1}, Trainer: ID("m")},
				p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: 1, End: 2}, Trainer: ID("nobody")},
				p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: 2, End: 3}, Trainer: ID("q")})
		}
		m.SetAssignments(as)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Notify(ctx, 5, p2p.BatchRange{Start: 0, End: 1}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []node{p, q} {
			select {
			case no := <-n.Notices():
				if no.Trainer != ID("m") || no.Step != 5 || no.Batch != (p2p.BatchRange{Start: 0, End: 1}) || no.RunID != RunID || no.Verify() != nil {
					t.Fatalf("%s got %+v", n.name, no)
				}
			case <-ctx.Done():
				t.Fatalf("%s never got m's notice", n.name)
			}
		}
		if err := p.Notify(ctx, 5, p2p.BatchRange{Start: 1, End: 2}); err != nil {
			t.Fatal(err)
		}
		for m.Stats().NoticesRejected["not_assigned"] == 0 {
			select {
			case no := <-m.Notices():
				if no.Trainer == ID("p") {
					t.Fatal("an unassigned notice was delivered")
				}
			case <-ctx.Done():
				t.Fatal("the unassigned notice was never refused")
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	t.Run("notice before the view", func(t *testing.T) {
		// A peer that has the round's step but not yet its batches (a
		// warmup's view carries the first round's step and assigns
		// nothing) still gets a trainer's notice of that round once its
		// view assigns the batch: without it the trainer would be a
		// silent one there, and left out of the round.
		ns := cluster(t, h, "k", "l")
		k, l := ns[0], ns[1]
		l.SetStep(7)
		l.SetAssignments([]p2p.Assignment{})
		k.SetStep(7)
		round := []p2p.Assignment{{Step: 7, Batch: p2p.BatchRange{Start: 0, End: 1}, Trainer: ID("k")}}
		k.SetAssignments(round)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := k.Notify(ctx, 7, p2p.BatchRange{Start: 0, End: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case no := <-l.Notices():
			t.Fatalf("delivered before l's view assigned its batch: %+v", no)
		case <-time.After(100 * time.Millisecond):
		}
		l.SetAssignments(round)
		select {
		case no := <-l.Notices():
			if no.Trainer != ID("k") || no.Step != 7 {
				t.Fatalf("l got %+v", no)
			}
		case <-ctx.Done():
			t.Fatal("k's notice never reached l once l's view assigned the batch")
		}
	})

	t.Run("checkpoints", func(t *testing.T) {
		ns := cluster(t, h, "f", "g", "j")
		f, g, j := ns[0], ns[1], ns[2]
		tensors := []p2p.Tensor{{Name: "w", DType: "F32", Shape: []uint64{2, 3}, Data: bytes.Repeat([]byte{1, 2, 3, 4}, 6)},
			{Name: "b", DType: "F32", Shape: []uint64{3}, Data: bytes.Repeat([]byte{9, 8, 7, 6}, 3)}}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var ids []coordinator.Hash
		for _, n := range []node{f, g} {
			id, err := n.ShareCheckpoint(ctx, 3, p2p.TensorsSource(tensors))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if ids[0] != ids[1] {
			t.Fatal("the same tensors got two manifest ids")
		}
		holders := []coordinator.Pubkey{f.ID(), g.ID()}
		id, err := j.FindCheckpoint(ctx, 3, holders)
		if err != nil || id != ids[0] {
			t.Fatalf("FindCheckpoint = %x, %v", id, err)
		}
		// A manifest that does not match the run's model is refused before
		// any tensor is fetched.
		bigger := p2p.SpecsOf(tensors)
		bigger[0].Shape = []uint64{2000, 3000}
		if _, err := FetchTensors(ctx, j, id, holders, bigger); !errors.Is(err, p2p.ErrMalformed) {
			t.Fatalf("a checkpoint of another shape: %v, want ErrMalformed", err)
		}
		if _, err := FetchTensors(ctx, j, id, holders, p2p.SpecsOf(tensors[:1])); !errors.Is(err, p2p.ErrMalformed) {
			t.Fatalf("a checkpoint with a tensor too many: %v, want ErrMalformed", err)
		}
		got, err := FetchTensors(ctx, j, id, holders, p2p.SpecsOf(tensors))
		if err != nil || len(got) != 2 || got[0].Name != "w" || !bytes.Equal(got[1].Data, tensors[1].Data) {
			t.Fatalf("FetchCheckpoint = %+v, %v", got, err)
		}
		if _, err := j.FindCheckpoint(ctx, 4, holders); !errors.Is(err, p2p.ErrNoCheckpoint) || !errors.Is(err, p2p.ErrNoHolder) {
			t.Fatalf("a checkpoint nobody offers: %v, want ErrNoCheckpoint and ErrNoHolder", err)
		}
	})
}

// FetchTensors fetches checkpoint id from holders into a file of want's
// tensors and reads them back.
func FetchTensors(ctx context.Context, n p2p.Network, id coordinator.Hash, holders []coordinator.Pubkey, want []p2p.TensorSpec) ([]p2p.Tensor, error) {
	f, err := p2p.NewCheckpointFile(want)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := n.FetchCheckpoint(ctx, id, holders, f); err != nil {
		return nil, err
	}
	return p2p.ReadTensors(f)
}
