package libp2p

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pubsubpb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// messageID names a gossip message by the sha2-256 of its data.
func messageID(m *pubsubpb.Message) string {
	h := sha256.Sum256(m.GetData())
	return string(h[:])
}

func (n *Node) startGossip() error {
	name := TopicName(*n.cfg.runID)
	params, thresholds := scoreParams(name, n.appScore)
	ps, err := pubsub.NewGossipSub(n.life, n.host,
		// Without flood publishing gossipsub drops what is published before
		// the mesh forms (measured here: docs/architecture.md §7).
		pubsub.WithFloodPublish(true),
		// An announcement is signed by its trainer's p2p key, which is
		// also its host's key, and the validator checks that signature:
		// a second one by gossipsub over the same bytes cost each node a
		// signature check per message (2.4% of a 16-node round's CPU).
		// Unsigned messages carry no author and no sequence number, so a
		// message is named by a digest of its bytes; a changed copy is
		// another message and cannot shadow the real one.
		pubsub.WithNoAuthor(),
		pubsub.WithMessageIdFn(messageID),
		// Peers come from the coordinator, not from gossip.
		pubsub.WithPeerExchange(false),
		pubsub.WithPeerScore(params, thresholds),
	)
	if err != nil {
		return fmt.Errorf("p2p: pubsub: %w", err)
	}
	n.ps = ps
	if err := ps.RegisterTopicValidator(name, n.validate, pubsub.WithValidatorInline(true)); err != nil {
		return fmt.Errorf("p2p: validator: %w", err)
	}
	if n.topic, err = ps.Join(name); err != nil {
		return fmt.Errorf("p2p: join topic: %w", err)
	}
	if n.sub, err = n.topic.Subscribe(pubsub.WithBufferSize(1024)); err != nil {
		return fmt.Errorf("p2p: subscribe: %w", err)
	}
	return nil
}

// Peer scoring (gossipsub v1.1): a peer that forwards invalid announcements
// or training notices (bad signature, malformed, another run's, oversized)
// loses 20 points for the first, 80 for two (the penalty is squared), and
// the trainer's reports (ReportPeer: equivocation, results that do not
// decode) cost 100 each. At
// −80 a peer is graylisted: everything it sends is ignored. Announcements
// that are only outside this node's view (the step window, the
// assignments, which can lag the sender's by a snapshot) are ignored, not
// rejected, so an honest forwarder is never penalised for them. Penalties
// decay by 10% a second, so graylisting is short: a reported peer is
// graylisted for about 2 s per report (100·0.9^t passes −80 at t = 2.1 s;
// two reports at once, 8.7 s), and one that forwarded a third invalid
// announcement for 3 to 4 s (its count, 3, falls below 2 — 80 points — at
// the fourth decay; they come once a second), during which what it sends
// is dropped unread (TestGraylistDuration). That is what the graylist is for: sparing this
// node the validation of a flooder's messages. It is no sentence: a
// reported trainer's results are already refused (and the witnesses drop
// it), and a long one would hide from this node the next round's results
// of a peer reported once by mistake. Colocation is not penalised: trainers
// may share an address (one machine, one NAT).
func scoreParams(topic string, app func(peer.ID) float64) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	return &pubsub.PeerScoreParams{
			Topics: map[string]*pubsub.TopicScoreParams{topic: {
				TopicWeight:                    1,
				TimeInMeshQuantum:              time.Second,
				InvalidMessageDeliveriesWeight: -20,
				InvalidMessageDeliveriesDecay:  0.9,
			}},
			AppSpecificScore:  app,
			AppSpecificWeight: 1,
			DecayInterval:     time.Second,
			DecayToZero:       0.01,
			RetainScore:       10 * time.Minute,
		}, &pubsub.PeerScoreThresholds{
			GossipThreshold:   -10,
			PublishThreshold:  -50,
			GraylistThreshold: -80,
		}
}

// misconduct is what the trainer reported against peers (ReportPeer), by
// peer: a penalty that decays like gossipsub's own.
type misconduct struct {
	points float64
	at     time.Time
}

// appScore is the application-specific part of a peer's score.
func (n *Node) appScore(p peer.ID) float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.reports[p]
	if !ok {
		return 0
	}
	// 10% a second, as the topic penalties.
	return -m.points * math.Pow(0.9, time.Since(m.at).Seconds())
}

// ReportPeer records misconduct the trainer found in what a peer sent (a
// result that does not decode or fit the model, two results for one batch):
// it costs the peer 100 points of gossip score, enough to graylist it.
func (n *Node) ReportPeer(k coordinator.Pubkey, why string) {
	p, err := peerIDOf(k)
	if err != nil {
		return
	}
	n.mu.Lock()
	m := n.reports[p]
	if m == nil {
		m = &misconduct{}
		n.reports[p] = m
	}
	m.points = m.points*math.Pow(0.9, time.Since(m.at).Seconds()) + 100
	m.at = time.Now()
	n.mu.Unlock()
	n.m.Reported.WithLabelValues(why).Inc()
	n.log.Warn("peer reported", "remote", p.String(), "why", why)
}

// viewDependent says whether a refusal depends on this node's view of the
// run (which can lag the sender's), rather than on the message itself.
func viewDependent(err error) bool {
	return errors.Is(err, p2p.ErrStepOutOfWindow) || errors.Is(err, p2p.ErrNotAssigned)
}

// reason names a rejection for Stats.Rejected.
func reason(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{p2p.ErrBadSignature, "bad_signature"}, {p2p.ErrWrongRun, "wrong_run"}, {p2p.ErrStepOutOfWindow, "step_window"},
		{p2p.ErrNotAssigned, "not_assigned"}, {p2p.ErrOversize, "oversize"}, {p2p.ErrReplayed, "replayed"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "malformed"
}

// check decodes and validates an announcement from outside: structure,
// signature, run, step window and assignment. Replay is checked separately
// because a pulled copy of a message already seen is not an offence.
func (n *Node) check(data []byte) (p2p.Announcement, error) {
	if len(data) > p2p.MaxAnnouncementSize {
		return p2p.Announcement{}, fmt.Errorf("%w: %d bytes", p2p.ErrOversize, len(data))
	}
	a, err := p2p.DecodeAnnouncement(data)
	var malformed error
	if err != nil {
		ev, everr := p2p.DecodeMalformed(data)
		if !errors.Is(err, p2p.ErrMalformed) || everr != nil {
			return a, err
		}
		// Signed by its trainer: refused, but evidence if the trainer is
		// the one assigned the batch (checked below like any other).
		a, malformed = ev, signedMalformed{err}
	} else if err := n.verifyOnce(data, &a); err != nil {
		return a, err
	}
	if err := n.checkView(a.RunID, a.Step, a.Batch, a.Trainer); err != nil || malformed == nil {
		return a, err
	}
	return a, malformed
}

// verifyOnce verifies a's signature unless these very bytes were verified
// before. Every trainer's announcement reaches a node many times (gossip
// relays, re-announcements, and every pull, which asks all peers for all of
// a step's announcements: at 32 trainers, ~1,000 signatures a pull, a
// quarter of a trainer's CPU); the same bytes verify the same way each time.
// Digests of steps that left the window go when the table grows.
func (n *Node) verifyOnce(data []byte, a *p2p.Announcement) error {
	if err := a.Check(); err != nil {
		return err
	}
	d := coordinator.Hash(sha256.Sum256(data))
	n.verifiedMu.Lock()
	_, ok := n.verified[d]
	n.verifiedMu.Unlock()
	if ok {
		return nil
	}
	if err := a.Verify(); err != nil {
		return err
	}
	n.verifiedMu.Lock()
	defer n.verifiedMu.Unlock()
	if n.verified == nil {
		n.verified = map[coordinator.Hash]uint32{}
	}
	if len(n.verified) >= maxVerified {
		cur := n.step.Load()
		lo := cur - min(cur, 2)
		for k, st := range n.verified {
			if st < lo {
				delete(n.verified, k)
			}
		}
		if len(n.verified) >= maxVerified {
			clear(n.verified) // a window this full is not an honest run's: start over
		}
	}
	n.verified[d] = a.Step
	return nil
}

// maxVerified bounds verifyOnce's table: the announcements of a 256-trainer
// run's step window, with room for re-announcements' other nonces.
const maxVerified = 16 * coordinator.MaxClients

// signedMalformed is the refusal of an announcement that is malformed but
// signed by the trainer assigned its batch (p2p.Announcement.SignedMalformed):
// nobody relays it, and this node's trainer takes it as that trainer's
// refused result rather than wait for one that will not come.
type signedMalformed struct{ err error }

func (e signedMalformed) Error() string { return e.err.Error() }
func (e signedMalformed) Unwrap() error { return e.err }

// checkView checks what depends on the run and this node's view of it:
// the run id, the step window, and the batch's assignment.
// A notice (Notice) is checked the same way.
func (n *Node) checkView(runID string, step uint32, batch p2p.BatchRange, trainer coordinator.ClientID) error {
	if runID != *n.cfg.runID {
		return fmt.Errorf("%w: %q", p2p.ErrWrongRun, runID)
	}
	cur := n.step.Load()
	lo := cur - min(cur, 2)
	if step < lo || step > cur+1 {
		return fmt.Errorf("%w: step %d at %d", p2p.ErrStepOutOfWindow, step, cur)
	}
	n.mu.Lock()
	assignments := n.assignments
	n.mu.Unlock()
	if assignments != nil {
		return assignments.Check(step, batch, trainer)
	}
	if n.cfg.allowAll {
		return nil
	}
	n.mu.Lock()
	id, ok := n.clients[trainer.P2P]
	n.mu.Unlock()
	if !ok || id != trainer {
		return fmt.Errorf("%w: not a client of the epoch", p2p.ErrNotAssigned)
	}
	return nil
}

// markSeen records an announcement's nonce and reports whether it was new.
func (n *Node) markSeen(a *p2p.Announcement) bool { return n.markNonce(a.Trainer.P2P, a.Nonce, a.Step) }

// markNonce records a nonce of key's, of a message for step, and reports
// whether it was new. A node's announcements and notices draw on one
// counter, so one table serves both.
func (n *Node) markNonce(key coordinator.Pubkey, nonce uint64, step uint32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := nonceKey{key, nonce}
	if _, dup := n.seen[k]; dup {
		return false
	}
	n.seen[k] = step
	return true
}

// reject counts a refused announcement and logs it: the first refusal of
// each reason from each peer at warning level (someone should look), the
// rest at debug (a misbehaving peer must not flood the log).
func (n *Node) reject(err error, from peer.ID) { n.refuse(announcementMessage, err, from) }

// What a refused message was: they are counted and logged apart.
const (
	announcementMessage = "announcement"
	noticeMessage       = "notice"
)

// refuse counts and logs a refused message of kind what (announcementMessage
// or noticeMessage).
func (n *Node) refuse(what string, err error, from peer.ID) {
	r := reason(err)
	counter := n.m.Rejected
	if what == noticeMessage {
		counter = n.m.NoticesRejected
	}
	counter.WithLabelValues(r).Inc()
	k := rejectKey{what, from, r}
	n.mu.Lock()
	first := !n.rejectLogged[k] && len(n.rejectLogged) < maxRejectLogged
	if first {
		n.rejectLogged[k] = true
	}
	n.mu.Unlock()
	level := slog.LevelDebug
	// A replay is ignored, not punished: a copy of an announcement this
	// node has (a restarted trainer's peers forward what it had seen) is
	// harmless, and warned of on every healthy restart.
	if first && !viewDependent(err) && !errors.Is(err, p2p.ErrReplayed) {
		level = slog.LevelWarn
	}
	n.log.Log(context.Background(), level, what+" refused", "reason", r, "remote", from.String(), "err", err)
}

// rejectKey is a kind of message, a peer and a reason, logged once at
// warning level.
type rejectKey struct {
	what   string
	peer   peer.ID
	reason string
}

// maxRejectLogged bounds the set of (peer, reason) pairs remembered.
const maxRejectLogged = 4096

// validate is the topic validator. Reject (the sender misbehaved) for
// anything invalid; Ignore for an exact replay of a nonce already seen, since
// an honest relay can race a pull and is not to be punished for it.
func (n *Node) validate(_ context.Context, from peer.ID, m *pubsub.Message) pubsub.ValidationResult {
	if p2p.IsNotice(m.Data) {
		return n.validateNotice(from, m)
	}
	if from == n.host.ID() {
		// Our own publish (Publish signed it; the assignment is the
		// trainer's business). Record the nonce so a replay is caught.
		if a, err := p2p.DecodeAnnouncement(m.Data); err == nil {
			n.markSeen(&a)
			m.ValidatorData = a
		}
		return pubsub.ValidationAccept
	}
	view := n.views.Load() // the view check judges by, or a later one
	a, err := n.check(m.Data)
	for tries := 0; err != nil && tries < 3; tries++ {
		r := n.holdEarly(a, m.Data, from, err, view)
		if r == earlyKept {
			return pubsub.ValidationIgnore
		}
		if r != earlyViewMoved {
			break
		}
		// SetAssignments ran meanwhile: judge it by the new view.
		view = n.views.Load()
		a, err = n.check(m.Data)
	}
	if err != nil {
		n.reject(err, from)
		if errors.As(err, new(signedMalformed)) && n.markSeen(&a) {
			n.deliverOnly(a)
		}
		if viewDependent(err) {
			return pubsub.ValidationIgnore
		}
		return pubsub.ValidationReject
	}
	if !n.markSeen(&a) {
		n.reject(p2p.ErrReplayed, from)
		return pubsub.ValidationIgnore
	}
	n.m.Accepted.Inc()
	m.ValidatorData = a
	return pubsub.ValidationAccept
}

func (n *Node) receiveLoop(ctx context.Context) error {
	for {
		m, err := n.sub.Next(ctx)
		if err != nil {
			return err
		}
		if m.ReceivedFrom == n.host.ID() {
			continue // our own, already held by Publish
		}
		if no, ok := m.ValidatorData.(p2p.Notice); ok {
			n.handOverNotice(no)
			continue
		}
		a, ok := m.ValidatorData.(p2p.Announcement)
		if !ok || !n.hold(&a, m.Data) {
			continue
		}
		n.handOver(a)
	}
}

// handOver gives a delivered announcement to the trainer without blocking.
func (n *Node) handOver(a p2p.Announcement) {
	select {
	case n.out <- a:
	default:
		// The trainer is not draining; the batch is still recoverable
		// through Pull, so losing it here beats stalling gossip.
		n.mu.Lock()
		delete(n.delivered, keyOf(&a)) // so that Pull can still return it
		n.mu.Unlock()
		n.m.Dropped.Inc()
		n.log.Warn("announcement dropped: channel full", "step", a.Step)
	}
}

// deliverOnly gives this node's trainer an announcement it must not relay
// or serve to pullers (a signed malformed one): once, like any other.
func (n *Node) deliverOnly(a p2p.Announcement) {
	k := keyOf(&a)
	n.mu.Lock()
	_, done := n.delivered[k]
	n.delivered[k] = struct{}{}
	n.mu.Unlock()
	if !done {
		n.m.Delivered.Inc()
		n.handOver(a)
	}
}

// Announcements delivers each valid announcement of other trainers once
// (re-announcements and pulled copies are filtered out).
func (n *Node) Announcements() <-chan p2p.Announcement { return n.out }

// Publish stores payload as raw blocks, then signs and gossips an
// announcement of it for step and batch. The announcement is re-sent every
// reannounce interval while its step is in the window.
func (n *Node) Publish(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	if err := n.alive(); err != nil {
		return p2p.Announcement{}, err
	}
	ref, err := n.putBlob(ctx, step, payload)
	if err != nil {
		return p2p.Announcement{}, err
	}
	a := p2p.Announcement{
		RunID: *n.cfg.runID, Step: step, Batch: batch,
		Trainer:    coordinator.ClientID{Signer: n.signer},
		Commitment: p2p.CommitmentOf(step, batch, ref), Blob: ref,
	}
	raw, err := n.signAndPublish(ctx, &a)
	if err != nil {
		return a, err
	}
	k := keyOf(&a)
	n.mu.Lock()
	n.own[k] = a
	n.delivered[k] = struct{}{}
	delete(n.ownNotices, p2p.NoticeKey{P2P: a.Trainer.P2P, Step: step, Batch: batch}) // the result says it now
	n.mu.Unlock()
	n.m.Published.Inc()
	n.hold(&a, raw)
	return a, nil
}

func (n *Node) signAndPublish(ctx context.Context, a *p2p.Announcement) ([]byte, error) {
	a.Nonce = n.nonce.Add(1)
	if err := a.Sign(n.key); err != nil {
		return nil, err
	}
	raw, err := a.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return raw, n.topic.Publish(ctx, raw)
}

func (n *Node) reannounceLoop(ctx context.Context) {
	if n.cfg.reannounce <= 0 {
		return
	}
	t := time.NewTicker(n.cfg.reannounce)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		var again []p2p.Announcement
		for _, a := range n.own {
			again = append(again, a)
		}
		n.mu.Unlock()
		for _, a := range again {
			cur := n.step.Load()
			if a.Step+2 < cur || a.Step > cur+1 {
				continue // peers would reject it; SetStep forgets it soon
			}
			if _, err := n.signAndPublish(ctx, &a); err != nil {
				n.log.Debug("re-announce failed", "step", a.Step, "err", err)
				continue
			}
			n.m.Reannounced.Inc()
		}
		n.renotify(ctx)
	}
}
