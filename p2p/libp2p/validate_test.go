package libp2p

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	golibp2p "github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pubsubpb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
	"github.com/psyche-go/psyche/p2p"
)

// rogue is a client of the epoch running plain gossipsub with no validator:
// it can put any bytes on the topic, as a modified client could.
type rogue struct {
	key   ed25519.PrivateKey
	topic *pubsub.Topic
	sub   *pubsub.Subscription
	id    peer.ID
	addrs peer.AddrInfo
}

func startRogue(t *testing.T, name string) *rogue {
	t.Helper()
	lk, err := crypto.UnmarshalEd25519PrivateKey(testKey(name))
	if err != nil {
		t.Fatal(err)
	}
	h, err := golibp2p.New(golibp2p.Identity(lk), golibp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), golibp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); h.Close() })
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true), pubsub.WithNoAuthor(), pubsub.WithMessageIdFn(messageID))
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(TopicName(testRun))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	return &rogue{key: testKey(name), topic: topic, sub: sub, id: h.ID(), addrs: peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}}
}

// assignments is the coordinator's data assignment as the node pushes it
// to the validator: in steps from..to, each batch [i, i+1) to trainers[i].
func assignments(from, to uint32, trainers ...coordinator.ClientID) []p2p.Assignment {
	var out []p2p.Assignment
	for step := from; step <= to; step++ {
		for i, tr := range trainers {
			out = append(out, p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: uint64(i), End: uint64(i) + 1}, Trainer: tr})
		}
	}
	return out
}

func TestValidatorRejectsForgedReplayedUnassigned(t *testing.T) {
	alice, mallory := clientIDOf("alice"), clientIDOf("mallory")
	ids := []coordinator.ClientID{alice, clientIDOf("carol"), mallory, clientIDOf("mallet")}
	a := startNode(t, "alice", WithReannounceInterval(0))
	reg := prometheus.NewRegistry()
	c := startNode(t, "carol", WithMetrics(NewMetrics(reg)))
	m := startRogue(t, "mallory")
	for _, nd := range []*testNode{a, c} {
		nd.SetClients(ids)
		nd.SetAssignments(assignments(8, 11, alice, mallory))
		nd.SetStep(10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connectAll(t, []*testNode{a, c})
	for _, nd := range []*testNode{a, c} {
		if err := nd.host.Connect(ctx, m.addrs); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "mesh with the rogue", func() bool {
		return len(c.topic.ListPeers()) == 2 && len(a.topic.ListPeers()) == 2 && len(m.topic.ListPeers()) == 2
	})

	// Alice's honest announcement reaches carol and, as a plain subscriber,
	// mallory, who keeps the bytes to replay.
	honest, err := a.Publish(ctx, 10, p2p.BatchRange{Start: 0, End: 1}, []byte("alice's result"))
	if err != nil {
		t.Fatal(err)
	}
	if got := <-c.Announcements(); got.Commitment != honest.Commitment {
		t.Fatal("carol did not get alice's announcement")
	}
	var honestBytes []byte
	for honestBytes == nil {
		msg, err := m.sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msg.ReceivedFrom != m.id {
			honestBytes = msg.Data
		}
	}

	sign := func(a p2p.Announcement) []byte {
		if err := a.Sign(m.key); err != nil {
			t.Fatal(err)
		}
		b, err := a.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	payload := []byte("mallory's result")
	own := func(step uint32, start uint64, run string) p2p.Announcement {
		return p2p.Announcement{RunID: run, Step: step, Batch: p2p.BatchRange{Start: start, End: start + 1}, Trainer: mallory,
			Commitment: p2p.Commitment(step, p2p.BatchRange{Start: start, End: start + 1}, payload), Nonce: uint64(time.Now().UnixNano())}
	}
	// Forged: claims to be alice but is signed by mallory's key.
	forged := own(10, 0, testRun)
	forged.Trainer = alice
	forgedBytes := sign(forged) // Sign puts mallory's p2p key in; put alice's back
	copy(forgedBytes[2+len(testRun)+54:], alice.P2P[:])
	type badCase struct {
		name   string
		data   []byte
		reason string
	}
	// Two rejections cost a peer 80 points, exactly the graylist threshold
	// (a peer is graylisted below it); a third graylists it, after which
	// gossipsub drops its messages before validating them. Which of a
	// burst's messages come in before that depends on how they are batched
	// on the wire, so each rogue sends at most two that are rejected (the
	// others are ignored, which costs nothing), and the rest come from a
	// second rogue.
	mallet := startRogue(t, "mallet")
	for _, nd := range []*testNode{a, c} {
		if err := nd.host.Connect(ctx, mallet.addrs); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "mesh with the second rogue", func() bool {
		return len(mallet.topic.ListPeers()) == 2
	})
	batches := []struct {
		from  *rogue
		cases []badCase
	}{
		{m, []badCase{
			{"forged signature", forgedBytes, "bad_signature"},
			{"unassigned batch", sign(own(10, 0, testRun)), "not_assigned"},
			{"another run", sign(own(10, 1, "other-run")), "wrong_run"},
			{"stale step", sign(own(7, 1, testRun)), "step_window"},
			{"future step", sign(own(12, 1, testRun)), "step_window"},
		}},
		{mallet, []badCase{
			{"oversize", make([]byte, p2p.MaxAnnouncementSize+1), "oversize"},
			{"garbage", []byte{1, 2, 3}, "malformed"},
		}},
		// Mallory's third rejection graylists her (checked below).
		{m, []badCase{{"garbage again", []byte{1, 2, 3, 4}, "malformed"}}},
	}
	want := map[string]uint64{}
	for _, b := range batches {
		for _, tc := range b.cases {
			if err := b.from.topic.Publish(ctx, tc.data); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			want[tc.reason]++
		}
		for _, nd := range []*testNode{a, c} {
			eventually(t, 60*time.Second, nd.name+" refusing every bad announcement", func() bool {
				got := nd.Stats().Rejected
				for r, n := range want {
					if got[r] < n {
						return false
					}
				}
				return true
			})
		}
	}
	// Mallory replays alice's message byte for byte. Gossip names a message
	// by its bytes, so the copy is a duplicate gossipsub drops unvalidated
	// (checked below: carol holds and delivers alice's once). Once its
	// seen-cache has forgotten the message (two minutes), the copy reaches
	// the validator, whose nonce set refuses it as a replay.
	if err := m.topic.Publish(ctx, honestBytes); err != nil {
		t.Fatal(err)
	}
	replay := &pubsub.Message{Message: &pubsubpb.Message{Data: honestBytes}, ReceivedFrom: m.id}
	if got := c.validate(ctx, m.id, replay); got != pubsub.ValidationIgnore {
		t.Errorf("a replay past gossip's seen-cache: %v, want ignored", got)
	}
	want["replayed"]++
	for r, n := range want {
		if got := gathered(t, reg, "psyche_p2p_announcements_rejected_total", "reason", r); got < float64(n) {
			t.Errorf("metrics: %v rejections for %s, want %d", got, r, n)
		}
	}
	// Mallory sent invalid announcements: gossip scoring has graylisted her,
	// so even a valid one of hers is ignored now, while alice's still
	// arrive.
	if err := m.topic.Publish(ctx, sign(own(10, 1, testRun))); err != nil {
		t.Fatal(err)
	}
	later, err := a.Publish(ctx, 9, p2p.BatchRange{Start: 0, End: 1}, []byte("alice's next result"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-c.Announcements():
		if got.Commitment != later.Commitment {
			t.Errorf("carol delivered %+v, want alice's announcement only", got)
		}
	case <-ctx.Done():
		t.Fatal("alice's announcement was not delivered")
	}
	select {
	case got := <-c.Announcements():
		t.Errorf("carol delivered an extra announcement: %+v", got)
	default:
	}
	// The replay was dropped, not relayed, and mallory's last one ignored:
	// the pull store holds alice's result only for step 10.
	c.mu.Lock()
	held := len(c.held[10])
	c.mu.Unlock()
	if held != 1 {
		t.Errorf("carol holds %d announcements for step 10, want 1", held)
	}
}

// A peer the trainer reported (a bad result, equivocation) gets a score
// below the graylist threshold, so gossipsub ignores what it sends (as it
// did mallory's above); other peers keep theirs.
func TestReportedPeerIsGraylisted(t *testing.T) {
	nodes := startCluster(t, 2)
	bad, judge := nodes[0], nodes[1]
	_, thresholds := scoreParams("t", nil)
	judge.ReportPeer(bad.ID(), "test")
	if s := judge.appScore(bad.host.ID()); s > thresholds.GraylistThreshold || s < -100 {
		t.Errorf("score after one report: %v, want in [-100, %v]", s, thresholds.GraylistThreshold)
	}
	judge.ReportPeer(bad.ID(), "test")
	if s := judge.appScore(bad.host.ID()); s > -190 {
		t.Errorf("score after two reports: %v, want about -200", s)
	}
	if s := judge.appScore(judge.host.ID()); s != 0 {
		t.Errorf("an unreported peer's score: %v", s)
	}
	if promread.Value(judge.m.Reported.WithLabelValues("test")) != 2 {
		t.Error("the reports were not counted")
	}
}

// Mallory, assigned a batch, signs an announcement that lists one block
// three times. Alice, her only neighbour, refuses it but hands it to her
// trainer (whose fetch fails at once: the result is refused, not awaited);
// she neither relays it to carol nor serves it to pullers.
func TestSignedMalformedIsDeliveredNotRelayed(t *testing.T) {
	alice, carol, mallory := clientIDOf("alice"), clientIDOf("carol"), clientIDOf("mallory")
	ids := []coordinator.ClientID{alice, carol, mallory}
	a := startNode(t, "alice", WithReannounceInterval(0))
	c := startNode(t, "carol", WithReannounceInterval(0))
	m := startRogue(t, "mallory")
	for _, nd := range []*testNode{a, c} {
		nd.SetClients(ids)
		nd.SetAssignments(assignments(10, 10, alice, mallory, carol))
		nd.SetStep(10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	connectAll(t, []*testNode{a, c})
	if err := a.host.Connect(ctx, m.addrs); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "mesh", func() bool {
		return len(a.topic.ListPeers()) == 2 && len(c.topic.ListPeers()) == 1 && len(m.topic.ListPeers()) == 1
	})
	payload := randomBytes(3, p2p.BlockSize+10)
	batch := p2p.BatchRange{Start: 1, End: 2}
	first := p2p.BlockDigests(payload)[0]
	bad := p2p.Announcement{RunID: testRun, Step: 10, Batch: batch, Trainer: mallory, Nonce: 1,
		Commitment: p2p.Commitment(10, batch, payload),
		Blob:       p2p.BlobRef{Size: 3 * p2p.BlockSize, Blocks: []coordinator.Hash{first, first, first}}}
	if err := m.topic.Publish(ctx, bad.SignUnchecked(m.key)); err != nil {
		t.Fatal(err)
	}
	var got p2p.Announcement
	select {
	case got = <-a.Announcements():
	case <-ctx.Done():
		t.Fatal("alice's trainer never saw mallory's signed malformed announcement")
	}
	if got.Trainer != mallory || got.Batch != batch {
		t.Fatalf("alice delivered %+v", got)
	}
	if _, err := a.Fetch(ctx, got); !errors.Is(err, p2p.ErrMalformed) {
		t.Errorf("fetching it: %v, want ErrMalformed before any block is asked for", err)
	}
	// Alice's own result reaches carol; mallory's never does, and alice
	// holds nothing of mallory's for pullers.
	honest, err := a.Publish(ctx, 10, p2p.BatchRange{Start: 0, End: 1}, []byte("alice's result"))
	if err != nil {
		t.Fatal(err)
	}
	if got := <-c.Announcements(); got.Commitment != honest.Commitment {
		t.Fatalf("carol delivered %+v first, want alice's result", got)
	}
	pulled, err := c.Pull(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pulled {
		if p.Trainer == mallory {
			t.Error("carol pulled mallory's malformed announcement from alice")
		}
	}
	if r := a.Stats().Rejected["malformed"]; r != 1 {
		t.Errorf("alice counted %d malformed refusals, want 1", r)
	}
}
