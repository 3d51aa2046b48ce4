package libp2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// runRound has every node publish one payload for step and every node fetch
// and check everyone else's. It returns how long the slowest node took.
func runRound(t testing.TB, nodes []*testNode, step uint32, size int) time.Duration {
	t.Helper()
	d, _ := runRoundOf(t, nodes, step, roundPayloads(nodes, step, size))
	return d
}

// roundPayloads are the results the nodes publish at step, by p2p key.
func roundPayloads(nodes []*testNode, step uint32, size int) map[coordinator.Pubkey][]byte {
	payloads := map[coordinator.Pubkey][]byte{}
	for i, nd := range nodes {
		payloads[nd.ID()] = randomBytes(uint64(step)<<8|uint64(i), size)
	}
	return payloads
}

// runRoundOf is runRound with the payloads made beforehand (the benchmark
// keeps making them out of the CPU time it measures). It also returns the
// process's usage when the round ended, before the payloads are compared.
func runRoundOf(t testing.TB, nodes []*testNode, step uint32, payloads map[coordinator.Pubkey][]byte) (time.Duration, resources) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, nd := range nodes {
		nd.SetStep(step)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes)*len(nodes))
	// What each node fetched, compared with what was published once the
	// round is timed: a trainer decodes its results rather than comparing
	// them with a copy it could not have, so the comparison is no part of
	// the round.
	type fetched struct {
		by, from string
		want     []byte
		got      []byte
	}
	var mu sync.Mutex
	var results []fetched
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := p2p.BatchRange{Start: uint64(i) * 4, End: uint64(i)*4 + 4}
			if _, err := nd.Publish(ctx, step, batch, payloads[nd.ID()]); err != nil {
				errs <- fmt.Errorf("%s publish: %w", nd.name, err)
				return
			}
			// As a trainer does: each result is fetched as soon as its
			// announcement arrives.
			var fetches sync.WaitGroup
			err := collectEach(ctx, nd, step, len(nodes)-1, func(a p2p.Announcement) {
				fetches.Add(1)
				go func() {
					defer fetches.Done()
					got, err := nd.Fetch(ctx, a)
					if err != nil {
						errs <- fmt.Errorf("%s fetch from %x: %w", nd.name, a.Trainer.P2P[:4], err)
						return
					}
					mu.Lock()
					results = append(results, fetched{nd.name, fmt.Sprintf("%x", a.Trainer.P2P[:4]), payloads[a.Trainer.P2P], got})
					mu.Unlock()
				}()
			})
			fetches.Wait()
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	d, used := time.Since(start), usage()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, r := range results {
		if !bytes.Equal(r.got, r.want) {
			t.Errorf("%s: payload from %s differs", r.by, r.from)
		}
	}
	if want := len(nodes) * (len(nodes) - 1); len(results) != want && !t.Failed() {
		t.Errorf("%d payloads fetched, want %d", len(results), want)
	}
	return d, used
}

func TestAllToAllRounds(t *testing.T) {
	nodes := startCluster(t, 8)
	for step := uint32(1); step <= 5; step++ {
		d := runRound(t, nodes, step, 1<<20)
		t.Logf("round %d: 8 nodes x 1 MiB all-to-all in %v", step, d)
		if t.Failed() {
			return
		}
	}
	for _, nd := range nodes {
		if s := nd.Stats(); s.BlobsFetched != 5*7 {
			t.Errorf("%s fetched %d blobs, want 35", nd.name, s.BlobsFetched)
		}
	}
}

// A node killed while others fetch its blob must not hold up the exchange of
// everyone else's, and the fetch of its own blob must end (from a peer that
// already has it, or with ErrFetchFailed) rather than hang.
//
// Every node's stall timers and attempt timeouts run on one clock the test
// holds still while the live blobs move, so a loaded machine can make them
// slow but never make them time out. Only then does the test move the clock,
// from one armed timer to the next, until every fetch of the victim's blob
// has ended: by its attempts timing out, within the time they are allowed.
func TestKilledNodeDoesNotStall(t *testing.T) {
	const (
		fetchTimeout = 5 * time.Second
		retries      = 2
		minRate      = 16 << 20
		victimSize   = 16 << 20 // long enough to be cut mid-transfer
	)
	// A clock per node: each node's fetch of the victim's blob is timed on
	// its own, as it would be on its own machine.
	clocks := make([]*fakeClock, 5)
	nodes := startClusterEach(t, 5, func(i int) []Option {
		clocks[i] = newFakeClock()
		return []Option{withClock(clocks[i]), WithFetchTimeout(fetchTimeout), WithFetchRetries(retries, 50*time.Millisecond),
			WithMinFetchRate(minRate, time.Second)}
	})
	victim, live := nodes[4], nodes[:4]
	// A hang guard only: nothing here waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	payloads := map[coordinator.Pubkey][]byte{}
	for i, nd := range nodes {
		nd.SetStep(1)
		size := 1 << 20
		if nd == victim {
			size = victimSize
		}
		payloads[nd.ID()] = randomBytes(uint64(i), size)
		if _, err := nd.Publish(ctx, 1, p2p.BatchRange{Start: uint64(i), End: uint64(i) + 1}, payloads[nd.ID()]); err != nil {
			t.Fatal(err)
		}
	}
	anns := make([][]p2p.Announcement, len(live))
	for i, nd := range live {
		as, err := collect(ctx, nd, 1, len(nodes)-1)
		if err != nil {
			t.Fatal(err)
		}
		anns[i] = as
	}
	// Kill the victim as soon as any block of its blob has left it.
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for ctx.Err() == nil {
			for _, nd := range live {
				if nd.Stats().BlocksFrom[victim.ID()] > 0 {
					victim.kill(t)
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var liveDone sync.WaitGroup
	victimEnded := make([]chan struct{}, len(live))
	for i, nd := range live {
		victimEnded[i] = make(chan struct{})
		for _, a := range anns[i] {
			fromVictim := a.Trainer.P2P == victim.ID()
			if !fromVictim {
				liveDone.Add(1)
			}
			go func() {
				if fromVictim {
					defer close(victimEnded[i])
				} else {
					defer liveDone.Done()
				}
				got, err := nd.Fetch(ctx, a)
				switch {
				case fromVictim:
					if err == nil && !bytes.Equal(got, payloads[a.Trainer.P2P]) {
						t.Errorf("%s: victim's payload differs", nd.name)
					}
					if err != nil && !errors.Is(err, p2p.ErrFetchFailed) {
						t.Errorf("%s: the fetch of the victim's blob ended with %v, want its attempts to run out (%v)", nd.name, err, p2p.ErrFetchFailed)
					}
				case err != nil:
					t.Errorf("%s: fetch from a live node failed: %v", nd.name, err)
				case !bytes.Equal(got, payloads[a.Trainer.P2P]):
					t.Errorf("%s: payload differs", nd.name)
				}
			}()
		}
	}
	liveDone.Wait()
	<-killed
	if ctx.Err() != nil {
		t.Fatal("the hang guard ran out before the live blobs moved")
	}
	// Three attempts, each of the fetch timeout plus the blob at the
	// minimum rate, bound a fetch whose source died.
	attempt := fetchTimeout + time.Duration(float64(victimSize)/minRate*float64(time.Second))
	bound := (retries + 1) * attempt
	for i, nd := range live {
		clk := clocks[i]
		for ended := false; !ended; {
			select {
			case <-victimEnded[i]:
				ended = true
			case <-ctx.Done():
				t.Fatalf("%s: the fetch of the victim's blob did not end; its clock stands at %v", nd.name, clk.elapsed())
			default:
				if !clk.advanceToNext() {
					// Nothing armed: the fetch is between attempts (its
					// backoff is real time) or has just ended.
					select {
					case <-victimEnded[i]:
						ended = true
					case <-clk.armed:
					case <-ctx.Done():
					}
				}
			}
		}
		t.Logf("%s: the fetch of the victim's blob ended after %v on its clock (at most %v)", nd.name, clk.elapsed(), bound)
		if got := clk.elapsed(); got > bound {
			t.Errorf("%s: the fetch of the victim's blob ended after %v on its clock, want at most %v", nd.name, got, bound)
		}
	}
}

// A node that missed the gossip gets announcements by pulling them from a
// peer, and the blob from a peer other than the unreachable announcer; a node
// that connects late to the announcer gets the re-announcement.
func TestPullFallbackAndReannounce(t *testing.T) {
	ids := []coordinator.ClientID{clientIDOf("a"), clientIDOf("b"), clientIDOf("c"), clientIDOf("d")}
	a := startNode(t, "a", WithReannounceInterval(50*time.Millisecond))
	b := startNode(t, "b")
	c := startNode(t, "c", WithFetchTimeout(2*time.Second), WithFetchRetries(1, 10*time.Millisecond))
	d := startNode(t, "d")
	for _, nd := range []*testNode{a, b, c, d} {
		nd.SetClients(ids)
		nd.SetStep(3)
	}
	// a refuses c, so c (which would otherwise find a through the DHT) can
	// only get a's result from b.
	a.SetClients([]coordinator.ClientID{ids[0], ids[1], ids[3]})
	connectAll(t, []*testNode{a, b})
	waitTopicPeers(t, []*testNode{a, b}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := randomBytes(7, 3<<20+5)
	ann, err := a.Publish(ctx, 3, p2p.BatchRange{Start: 10, End: 12}, payload)
	if err != nil {
		t.Fatal(err)
	}
	as, err := collect(ctx, b, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Fetch(ctx, as[0]); err != nil {
		t.Fatal(err)
	}

	// c knows only b: it pulls the announcement and fetches from b.
	if err := c.Connect(ctx, b.Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	pulled, err := c.Pull(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(pulled) != 1 || pulled[0].Commitment != ann.Commitment {
		t.Fatalf("pulled %d announcements, want a's", len(pulled))
	}
	if again, _ := c.Pull(ctx, 3); len(again) != 0 {
		t.Errorf("a second pull returned %d announcements already delivered", len(again))
	}
	got, err := c.Fetch(ctx, pulled[0])
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("fetch through b: %v", err)
	}
	if s := c.Stats(); s.BlocksFrom[b.ID()] == 0 || s.BlocksFrom[a.ID()] != 0 {
		t.Errorf("blocks by peer: %v, want all from b", s.BlocksFrom)
	}

	// d connects to a after the publish: the re-announcement reaches it.
	if err := d.Connect(ctx, a.Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-d.Announcements():
		if got.Commitment != ann.Commitment {
			t.Errorf("d got another announcement")
		}
	case <-ctx.Done():
		t.Fatal("no re-announcement reached d")
	}
	if a.Stats().Reannounced == 0 {
		t.Error("a did not re-announce")
	}
}

// Blobs are collected once their step is more than two steps old.
func TestBlobGarbageCollection(t *testing.T) {
	nd := startNode(t, "gc")
	ctx := context.Background()
	refs := map[uint32]p2p.BlobRef{}
	for step := uint32(1); step <= 5; step++ {
		nd.SetStep(step)
		a, err := nd.Publish(ctx, step, p2p.BatchRange{Start: 0, End: 1}, randomBytes(uint64(step), p2p.BlockSize+10))
		if err != nil {
			t.Fatal(err)
		}
		refs[step] = a.Blob
	}
	// Step 5: steps 3, 4 and 5 are kept, 1 and 2 are gone.
	for step, ref := range refs {
		has, _ := nd.bstore.Has(ctx, cidOf(ref.Blocks[0]))
		if want := step >= 3; has != want {
			t.Errorf("step %d blob held = %v, want %v", step, has, want)
		}
	}
	// A block shared with a live owner survives the collection of another.
	shared := randomBytes(99, 100)
	if _, err := nd.ShareCheckpoint(ctx, 1, p2p.TensorsSource([]p2p.Tensor{{Name: "w", DType: "F32", Shape: []uint64{25}, Data: shared}})); err != nil {
		t.Fatal(err)
	}
	a, err := nd.Publish(ctx, 5, p2p.BatchRange{Start: 1, End: 2}, shared)
	if err != nil {
		t.Fatal(err)
	}
	nd.SetStep(8)
	if has, _ := nd.bstore.Has(ctx, cidOf(a.Blob.Blocks[0])); !has {
		t.Error("a block still held by the checkpoint was collected")
	}
}

// The node listens on TCP and QUIC; a result moves over either alone.
func TestTCPAndQUIC(t *testing.T) {
	for _, tr := range []string{"/tcp/", "/quic-v1"} {
		t.Run(strings.Trim(tr, "/"), func(t *testing.T) {
			a, b := startNode(t, "a"+tr), startNode(t, "b"+tr)
			ids := []coordinator.ClientID{clientIDOf("a" + tr), clientIDOf("b" + tr)}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var addr string
			for _, s := range b.Addrs() {
				if strings.Contains(s, tr) {
					addr = s
				}
			}
			for _, nd := range []*testNode{a, b} {
				nd.SetClients(ids)
				nd.SetStep(1)
			}
			if err := a.Connect(ctx, addr); err != nil {
				t.Fatal(err)
			}
			for _, c := range a.host.Network().ConnsToPeer(b.host.ID()) {
				if !strings.Contains(c.RemoteMultiaddr().String(), tr) {
					t.Fatalf("connected over %s", c.RemoteMultiaddr())
				}
			}
			waitTopicPeers(t, []*testNode{a, b}, 1)
			payload := randomBytes(5, 2<<20)
			if _, err := b.Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 1}, payload); err != nil {
				t.Fatal(err)
			}
			as, err := collect(ctx, a, 1, 1)
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.Fetch(ctx, as[0])
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("fetch: %v", err)
			}
		})
	}
}
