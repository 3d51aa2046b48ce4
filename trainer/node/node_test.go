package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/psyche-go/psyche/internal/promread"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/internal/quietclock"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/localrun"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// cluster is a local run (trainer/localrun): a server backend and trainers
// over real libp2p on 127.0.0.1 (or memnet), in virtual time: the run's
// clock advances a second only once the server and every trainer have
// nothing left to do (quietclock), so each timeout measures waiting, never
// training, and a loaded machine plays the same run a fast one does, only
// slower. It holds the test, for failing it.
type cluster struct {
	t        *testing.T
	ctx      context.Context
	clock    *quietclock.Clock
	dir      string
	backend  *serverclient.Client
	admin    *chain.Keypair
	tokens   []uint32
	initial  *gpt.Model
	run      *localrun.Trainers
	trainers []*localrun.Trainer
	nodes    []*node.Node
	nets     []p2p.Network
	stopped  map[int]bool
}

func newCluster(t *testing.T, trainers int, edit func(*coordinator.Config), opts ...func(i int) []node.Option) *cluster {
	return newClusterOn(t, nil, trainers, edit, opts...)
}

// startServer is a cluster's server backend on a clock the test drives,
// in a fresh directory, and a context that guards the test against a hang:
// what every cluster starts with, before its run.
func startServer(t *testing.T, guard time.Duration) *cluster {
	t.Helper()
	dir := t.TempDir() // removed last: cleanups run in reverse order
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	c := &cluster{t: t, ctx: ctx, dir: dir, clock: quietclock.New(time.Unix(1_800_000_000, 0))}
	srv, err := localrun.StartServer(ctx, dir, localrun.WithClock(c.clock))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ticking := make(chan struct{})
	go func() { _ = c.clock.Run(ctx, time.Second, settle); close(ticking) }()
	t.Cleanup(func() { cancel(); _ = srv.Wait(); <-ticking })
	c.backend = srv.Client
	return c
}

// newClusterOn is newCluster over an in-memory network (hub), or over
// libp2p when hub is nil.
func newClusterOn(t *testing.T, hub *memnet.Hub, trainers int, edit func(*coordinator.Config), opts ...func(i int) []node.Option) *cluster {
	return newClusterServing(t, hub, trainers, edit, nil, opts...)
}

// newClusterServing is newClusterOn whose run reads its data at the
// http(s) URL that serve gives for the token file's path (nil: the file).
func newClusterServing(t *testing.T, hub *memnet.Hub, trainers int, edit func(*coordinator.Config), serve func(tokens string) string,
	opts ...func(i int) []node.Option) *cluster {
	// A guard against a hang, not a time budget: the runs below take seconds.
	c := startServer(t, 8*time.Minute)
	ctx, dir := c.ctx, c.dir

	// 12 sequences a round however many trainers share them; two trainers
	// are enough to go on.
	run := localrun.NewRun("e2e", trainers, 1, func(k *coordinator.Config, _ *coordinator.Model) {
		k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd, k.MinClients = 12, 12, 2
		if edit != nil {
			edit(k)
		}
	})
	c.tokens = data.Tokenize(data.Opticks()[:200_000])
	files, err := localrun.WriteFiles(ctx, dir, &run.Model, c.tokens[:150_000], 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	c.initial = files.Initial.(*gpt.Model)
	if err := run.UseFiles(files); err != nil {
		t.Fatal(err)
	}
	if serve != nil {
		run.Model.DataKind = coordinator.DataHTTP
		if err := coordinator.SetFixedString(run.Model.DataLocation[:], serve(files.Tokens)); err != nil {
			t.Fatal(err)
		}
	}
	keys := localrun.Keys{}
	c.admin = keys.Admin()
	if err := localrun.Create(ctx, c.backend, run, c.admin); err != nil {
		t.Fatal(err)
	}
	topts := []localrun.Option{localrun.WithClock(c.clock), localrun.WithCheckpointDir(dir),
		localrun.WithTrainerOptions(func(i int) []node.Option { return []node.Option{node.WithLogger(testLogger(t, i))} })}
	if hub != nil {
		topts = append(topts, localrun.WithMemnet(hub))
	} else {
		// A fetch holds the clock still, so one from a trainer that died
		// gives up sooner than the default.
		topts = append(topts, localrun.WithLibp2pOptions(libp2p.WithFetchTimeout(5*time.Second)))
	}
	c.run = localrun.NewTrainers("e2e", c.backend, keys, topts...)
	c.addTrainers(0, trainers, opts...)
	return c
}

// addTrainers starts trainers first..first+n-1 (first is the number started
// so far; their keys derive from the index), each dialling every trainer
// started before it.
func (c *cluster) addTrainers(first, n int, opts ...func(i int) []node.Option) {
	if first != len(c.trainers) {
		c.t.Fatalf("adding trainer %d after %d trainers", first, len(c.trainers))
	}
	started, err := c.run.Start(c.ctx, n, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, tr := range started {
		c.t.Cleanup(tr.Close)
		tr.Go(c.ctx)
		c.trainers = append(c.trainers, tr)
		c.nodes = append(c.nodes, tr.Node)
		c.nets = append(c.nets, tr.Net)
	}
}

// result waits for trainer i's node to return and returns its result.
func (c *cluster) result(i int) error {
	<-c.trainers[i].Done()
	return c.trainers[i].Err()
}

// oneEpoch makes trainers leave after one epoch, for tests that wait for
// the end of a given epoch: that state then stays the run's, where otherwise
// the next epoch could start before the waiter looks. The server hands a
// slow subscriber only its newest snapshot, and on a loaded machine the wait
// between two epochs can pass unseen; the waiter then waited for a state
// that had come and gone (CI: 480 s).
func oneEpoch(int) []node.Option { return []node.Option{node.WithEpochs(1)} }

// epochs makes trainers leave after n epochs, for tests that wait for the
// end of the n-th, as oneEpoch does for the first. A torch trainer takes
// seconds to stop (its worker's end), in which trainers stopped after it
// would otherwise start the next epoch without it: a checkpointer still
// saving rejoins late, the others train on, and their weights differ from
// the one stopped first.
func epochs(n int) func(int) []node.Option {
	return func(int) []node.Option { return []node.Option{node.WithEpochs(n)} }
}

// joinsSecond makes trainer joiner a joiner of the run's second epoch (it
// starts with the others, follows the first epoch without a part in it and
// leaves after the second), and the others leave after the second: a
// joiner started only once the test sees the first epoch would join
// wherever the run has got to by then, on a loaded machine the third.
func joinsSecond(joiner int) func(int) []node.Option {
	return func(i int) []node.Option {
		if i == joiner {
			return []node.Option{node.WithFirstEpoch(1), node.WithEpochs(1)}
		}
		return epochs(2)(i)
	}
}

// settle is how long (real time) the cluster must be idle before its clock
// moves: long enough for a message in flight between two trainers.
const settle = 100 * time.Millisecond

// waiterLag (PSYCHE_TEST_WAITER_LAG, a duration) makes every waitFor pause
// that long before it reads each snapshot: a waiter that a loaded machine
// schedules late. It misses states that came and went between two reads
// (the server hands a slow stream only its newest snapshot), and what it
// reads the run may have left (the snapshots queued in the stream): a test
// passes with it only if every state it waits for lasts (the end of an
// epoch its trainers leave after, a recorded checkpoint) rather than
// flashes by (a warmup, a cooldown), and nothing it does depends on how
// far the run has got when the wait returns.
var waiterLag = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv("PSYCHE_TEST_WAITER_LAG"))
	if err != nil {
		return 0
	}
	return d
}()

// waitFor returns the first snapshot that satisfies cond.
func (c *cluster) waitFor(what string, cond func(*coordinator.Coordinator) bool) *coordinator.Coordinator {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	snaps, err := c.backend.Subscribe(ctx, "e2e")
	if err != nil {
		c.t.Fatal(err)
	}
	for {
		time.Sleep(waiterLag)
		s, ok := <-snaps
		if !ok {
			break
		}
		if cond(s.State) {
			return s.State
		}
		for i, tr := range c.trainers {
			if c.stopped[i] {
				continue
			}
			select {
			case <-tr.Done():
				if err := tr.Err(); err != nil {
					c.t.Fatalf("trainer %d stopped: %v", i, err)
				} // else it left cleanly (WithEpochs)
			default:
			}
		}
	}
	c.t.Fatalf("gave up waiting for %s", what)
	return nil
}

// inEpoch reports whether s is in epoch e, from its warmup to its last
// round: a wait for an epoch's start that a late waiter cannot miss (a
// warmup alone can pass between two of its reads).
func inEpoch(s *coordinator.Coordinator, e uint32) bool {
	switch s.RunState {
	case coordinator.Warmup, coordinator.RoundTrain, coordinator.RoundWitness:
		return s.Progress.Epoch == e
	}
	return false
}

// stopAll stops trainers.
func (c *cluster) stopAll(which ...int) {
	for _, i := range which {
		c.trainers[i].Stop()
		if c.stopped == nil {
			c.stopped = map[int]bool{}
		}
		c.stopped[i] = true
		if err := c.result(i); err != nil {
			c.t.Fatalf("trainer %d: %v", i, err)
		}
	}
}

// lossWentDown fails the test unless trainer i's model has a held-out
// loss at least 0.2 below the initial model's (a run of the tiny model
// that trained at all gets there within an epoch).
func (c *cluster) lossWentDown(i int) {
	c.t.Helper()
	before, after := c.heldOutLoss(c.initial), c.heldOutLoss(c.nodes[i].Model())
	c.t.Logf("trainer %d: held-out loss %.3f -> %.3f", i, before, after)
	if after >= before-0.2 {
		c.t.Fatalf("trainer %d: loss did not go down: %.3f -> %.3f", i, before, after)
	}
}

func (c *cluster) heldOutLoss(m runmodel.Model) float32 {
	in, tg := make([]uint32, 8*32), make([]uint32, 8*32)
	for i := 0; i < 8; i++ {
		copy(in[i*32:], c.tokens[160_000+i*32:])
		copy(tg[i*32:], c.tokens[160_000+i*32+1:])
	}
	l, err := m.Forward(in, tg, 8, 32)
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

func (c *cluster) sameWeights(idx ...int) {
	c.t.Helper()
	for _, i := range idx[1:] {
		if !slices.Equal(paramsOf(c.nodes[i].Model()), paramsOf(c.nodes[idx[0]].Model())) {
			c.t.Fatalf("trainer %d's weights differ from trainer %d's", i, idx[0])
		}
	}
}

// TestThreeTrainersTrainTogether: two epochs, identical weights, lower loss,
// every trainer in every witness's participant bloom.
func TestThreeTrainersTrainTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	c := newCluster(t, 3, nil, epochs(2))
	seenAll := true
	c.waitFor("two epochs", func(s *coordinator.Coordinator) bool {
		if s.RunState == coordinator.RoundWitness {
			r := s.CurrentRound()
			for w := 0; w < int(r.WitnessesLen); w++ {
				for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
					if !r.Witnesses[w].Participants.Has(r.Witnesses[w].Key, coordinator.ParticipantMember(s.Epoch.Clients[i].ID.Signer)) {
						seenAll = false
					}
				}
			}
		}
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	if !seenAll {
		t.Error("a witness's participant bloom missed a trainer")
	}
	c.sameWeights(0, 1, 2)
	if slices.Equal(paramsOf(c.nodes[0].Model()), c.initial.Params) {
		t.Fatal("the weights never changed")
	}
	c.lossWentDown(0)
}

// TestWithoutFinalModel: a trainer told not to keep its model (psyche
// join) has none after Run, where one that keeps it has the run's.
func TestWithoutFinalModel(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	c := newCluster(t, 2, nil, func(i int) []node.Option {
		if i == 1 {
			return []node.Option{node.WithEpochs(1), node.WithoutFinalModel()}
		}
		return oneEpoch(i)
	})
	c.waitFor("the epoch's end", func(s *coordinator.Coordinator) bool { return s.Progress.Epoch >= 1 })
	c.stopAll(0, 1)
	if c.nodes[0].Model() == nil || c.nodes[1].Model() != nil {
		t.Fatalf("after Run: the keeping trainer's model %v, the other's %v (want one, and none)", c.nodes[0].Model() != nil, c.nodes[1].Model() != nil)
	}
}

// TestDeadTrainerIsDropped kills a trainer mid-epoch: health checks drop it,
// the others go on, and they still agree on the weights.
func TestDeadTrainerIsDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	// The trainers leave after the epoch (oneEpoch): the exited list is
	// rewritten when the next epoch starts. Trainer 2 dies at its second
	// step, never publishing that result: the epoch (7 rounds here) has
	// rounds enough left for the health checks, however late the test
	// gets to stop it.
	const killed = 2
	died := make(chan struct{})
	c := newCluster(t, 3, func(k *coordinator.Config) { k.EpochTime = 12 }, func(i int) []node.Option {
		if i != 2 {
			return oneEpoch(i)
		}
		return []node.Option{node.WithDeathAt(killed, died)}
	})
	select {
	case <-died:
	case <-c.ctx.Done():
		t.Fatal("trainer 2 never reached its last step")
	}
	c.stopAll(2)
	dead := c.nodes[2].ID()
	// One wait for all three: a subscriber may miss snapshots in between,
	// so the first snapshot that shows the drop can be the epoch's last.
	c.waitFor("the dead trainer dropped, two more steps and the end of the epoch", func(s *coordinator.Coordinator) bool {
		dropped := false
		for _, e := range s.Epoch.Exited[:s.Epoch.ExitedLen] {
			dropped = dropped || e.ID == dead && e.State == coordinator.Dropped
		}
		return dropped && s.Progress.Step >= killed+2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1)
	c.sameWeights(0, 1)
}

// testLogger logs to stderr when PSYCHE_TEST_LOG is set (at debug level
// when it is "debug").
func testLogger(t *testing.T, i int) *slog.Logger {
	level := slog.LevelInfo
	switch os.Getenv("PSYCHE_TEST_LOG") {
	case "":
		return slog.New(slog.DiscardHandler)
	case "debug":
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("trainer", i)
}

// TestGarbagePublisherIsIgnored: one of four trainers publishes garbage
// (bytes that are no frame, and frames of the wrong shape). The others ignore
// it, health checks drop it, and the rest train on with equal weights.
func TestGarbagePublisherIsIgnored(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	const rogue = 3
	calls := 0
	// The rogue's rounds run to the training limit (its result never
	// verifies), so the limit is short and the epoch long.
	c := newCluster(t, 4, func(k *coordinator.Config) { k.EpochTime, k.MaxRoundTrainTime = 20, 3 }, func(i int) []node.Option {
		if i != rogue {
			return nil
		}
		return []node.Option{node.WithCorruptResults(func(p []byte) []byte {
			calls++
			if calls%2 == 0 {
				return []byte("this is not a frame at all")
			}
			bad := slices.Clone(p)
			// The first tensor's first dimension (after ndim, flags, tile
			// height, tile width and k, one byte each for this model): no
			// longer the model's shape.
			bad[8+5]++
			return bad
		})}
	}, oneEpoch)
	bad := c.nodes[rogue].ID()
	c.waitFor("the rogue trainer to be dropped", func(s *coordinator.Coordinator) bool {
		for _, e := range s.Epoch.Exited[:s.Epoch.ExitedLen] {
			if e.ID == bad && e.State == coordinator.Dropped {
				return true
			}
		}
		return false
	})
	c.waitFor("the end of the epoch", func(s *coordinator.Coordinator) bool { return s.RunState == coordinator.WaitingForMembers })
	c.stopAll(0, 1, 2, 3)
	c.sameWeights(0, 1, 2)
	c.lossWentDown(0)
}

// TestPauseAndResume pauses mid-epoch: the epoch winds down, the run waits,
// and after resuming the same trainers go on from the same weights.
func TestPauseAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	c := newCluster(t, 3, func(k *coordinator.Config) { k.EpochTime = 30 })
	c.waitFor("training", func(s *coordinator.Coordinator) bool {
		return s.RunState == coordinator.RoundTrain && s.CurrentRound().Height >= 2
	})
	if _, err := c.backend.Send(c.ctx, "e2e", c.admin, nil, &coordinator.SetPaused{Paused: true}); err != nil {
		t.Fatal(err)
	}
	paused := c.waitFor("the pause", func(s *coordinator.Coordinator) bool { return s.RunState == coordinator.Paused })
	if _, err := c.backend.Send(c.ctx, "e2e", c.admin, nil, &coordinator.SetPaused{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("training after the pause", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch == paused.Progress.Epoch && s.RunState == coordinator.RoundTrain &&
			s.CurrentRound().Height >= 3 && s.Epoch.ClientsLen == 3
	})
	if _, err := c.backend.Send(c.ctx, "e2e", c.admin, nil, &coordinator.SetPaused{Paused: true}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the second pause", func(s *coordinator.Coordinator) bool { return s.RunState == coordinator.Paused })
	c.stopAll(0, 1, 2)
	c.sameWeights(0, 1, 2)
}

// TestAllTrainersLeave: after an epoch whose checkpoint was recorded, every
// trainer leaves; new trainers start the next epoch from that checkpoint.
func TestAllTrainersLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	// The first trainers train one epoch and leave.
	c := newCluster(t, 3, nil, oneEpoch)
	// Recorded in the cooldown, which it ends; the flag stays until the
	// next warmup, which waits for new trainers.
	ended := c.waitFor("a recorded checkpoint", func(s *coordinator.Coordinator) bool { return s.Epoch.Checkpointed })
	c.stopped = map[int]bool{}
	for i := 0; i < 3; i++ {
		if err := c.result(i); err != nil { // they leave by themselves
			t.Fatalf("trainer %d: %v", i, err)
		}
		c.stopped[i] = true
		c.trainers[i].Stop()
	}
	final := slices.Clone(paramsOf(c.nodes[0].Model()))
	url := coordinator.FixedString(ended.Model.Checkpoint.Source.URL[:])
	c.addTrainers(3, 3, oneEpoch)
	warm := c.waitFor("the next epoch", func(s *coordinator.Coordinator) bool { return inEpoch(s, 1) })
	if warm.Model.Checkpoint.Kind != coordinator.CheckpointHub || coordinator.FixedString(warm.Model.Checkpoint.Source.URL[:]) != url {
		t.Fatalf("the checkpoint did not fall back to the recorded one: %s %q", warm.Model.Checkpoint.Kind, coordinator.FixedString(warm.Model.Checkpoint.Source.URL[:]))
	}
	saved, err := gpt.Load(url[len("file://"):], nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(saved.Params, final) {
		t.Fatal("the recorded checkpoint is not the weights the epoch ended with")
	}
	// Its revision is its hash, so the new trainers (which got this far)
	// checked the file they loaded.
	if rev := coordinator.FixedString(warm.Model.Checkpoint.Source.Revision[:]); rev != runmodel.Revision(saved) {
		t.Fatalf("the checkpoint was recorded with revision %q, its hash is %s", rev, runmodel.Revision(saved))
	}
	c.waitFor("the end of the new trainers' epoch", func(s *coordinator.Coordinator) bool {
		return s.RunState == coordinator.WaitingForMembers && s.Progress.Epoch == 2
	})
	c.stopAll(3, 4, 5)
	c.sameWeights(3, 4, 5)
}

// TestJoinerLoadsFromPeers: a trainer that joins for the second epoch gets
// the model from the first epoch's trainers (a P2P checkpoint: the manifest
// id they offer, then the tensors), and ends that epoch with their weights.
func TestJoinerLoadsFromPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	// Three start the run; the fourth joins the second epoch.
	c := newCluster(t, 4, func(k *coordinator.Config) { k.InitMinClients = 3 }, joinsSecond(3))
	warm := c.waitFor("the second epoch", func(s *coordinator.Coordinator) bool { return inEpoch(s, 1) })
	if warm.Model.Checkpoint.Kind != coordinator.CheckpointP2P || warm.Epoch.ClientsLen != 4 || len(warm.CheckpointHolders()) != 3 {
		t.Fatalf("epoch 1 starts with checkpoint %s, %d clients, %d holders; want P2P, 4, 3",
			warm.Model.Checkpoint.Kind, warm.Epoch.ClientsLen, len(warm.CheckpointHolders()))
	}
	c.waitFor("the end of the second epoch", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2, 3)
	c.sameWeights(0, 1, 2, 3)
}

// TestTrainersOverMemnet: the driver and machine against the in-memory
// network: three trainers train two epochs (the second from the model they
// hold) and end with identical weights and a lower loss.
func TestTrainersOverMemnet(t *testing.T) {
	c := newClusterOn(t, memnet.NewHub(), 3, nil, epochs(2))
	c.waitFor("two epochs", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	c.sameWeights(0, 1, 2)
	c.lossWentDown(0)
}

// TestEquivocatorIsDropped: one of four trainers sends different results for
// its batch to different peers (its real result to trainer 0, one with the
// signs of its first tensor flipped to trainers 1 and 2), every round, over
// the in-memory network, whose gossip relays each version to everyone. The
// honest trainers catch it (two signed commitments for one batch), apply
// neither version, leave it out of their witness reports and drop it by
// health checks; they end the epoch with identical weights.
func TestEquivocatorIsDropped(t *testing.T) {
	const rogue = 3
	type target struct {
		net    *memnet.Node
		groups [][]coordinator.Pubkey
	}
	var to atomic.Pointer[target] // set once the cluster exists, read when the rogue publishes
	equivocate := func(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
		tg := to.Load()
		if tg == nil {
			return p2p.Announcement{}, fmt.Errorf("the cluster is not set up yet")
		}
		f, err := distro.DecodeFrame(payload, distro.DefaultLimits)
		if err != nil {
			return p2p.Announcement{}, err
		}
		for i := range f.Tensors[0].Values {
			f.Tensors[0].Values[i] = -f.Tensors[0].Values[i]
		}
		other, err := f.MarshalBinary()
		if err != nil {
			return p2p.Announcement{}, err
		}
		anns, err := tg.net.Equivocate(ctx, step, batch, [][]byte{payload, other}, tg.groups)
		if err != nil {
			return p2p.Announcement{}, err
		}
		return anns[0], nil
	}
	metrics := make([]*node.Metrics, 4)
	c := newClusterOn(t, memnet.NewHub(), 4, func(k *coordinator.Config) { k.EpochTime = 12 }, func(i int) []node.Option {
		if i != rogue {
			metrics[i] = node.NewMetrics(nil)
			return []node.Option{node.WithMetrics(metrics[i])}
		}
		return []node.Option{node.WithEquivocation(equivocate)}
	}, oneEpoch)
	key := func(i int) coordinator.Pubkey { return c.nodes[i].ID().P2P }
	to.Store(&target{net: c.nets[rogue].(*memnet.Node), groups: [][]coordinator.Pubkey{{key(0)}, {key(1), key(2)}}})
	bad := c.nodes[rogue].ID()
	dropped := false
	c.waitFor("the end of the first epoch", func(s *coordinator.Coordinator) bool {
		for _, e := range s.Epoch.Exited[:s.Epoch.ExitedLen] {
			dropped = dropped || (e.ID == bad && e.State == coordinator.Dropped)
		}
		return s.RunState == coordinator.WaitingForMembers && s.Progress.Epoch == 1
	})
	if !dropped {
		t.Error("the equivocating trainer was not dropped in the epoch")
	}
	c.stopAll(0, 1, 2, 3)
	// No silent fork: an honest trainer may have applied a round without a
	// result another applied (the second version reached it after a quorum
	// vouched for the first); it then knows it diverged (it applied with
	// missing results) and reloads next epoch. So the honest trainers that
	// applied every result must all hold the same weights. (Which side is
	// larger is no rule: on a loaded machine the rogue and trainer 0 can be
	// the round's only witnesses in time, so its version is the round's, and
	// trainers 1 and 2, which saw the other, are the ones that know they
	// diverged.)
	same := func(i, j int) bool { return slices.Equal(paramsOf(c.nodes[i].Model()), paramsOf(c.nodes[j].Model())) }
	var whole []int
	for i := 0; i < rogue; i++ {
		if promread.Value(metrics[i].ResultsMissing) == 0 {
			whole = append(whole, i)
		}
	}
	for _, i := range whole {
		if !same(i, whole[0]) {
			t.Errorf("trainers %d and %d applied every result and hold different weights: a silent fork", whole[0], i)
		}
	}
	if slices.Equal(paramsOf(c.nodes[0].Model()), c.initial.Params) {
		t.Fatal("the weights never changed")
	}
}

// paramsOf is a model's parameters, tensor after tensor.
func paramsOf(m runmodel.Model) []float32 {
	var out []float32
	for _, t := range m.Tensors() {
		out = append(out, t...)
	}
	return out
}
