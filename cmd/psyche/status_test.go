package main

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/node"
)

// TestStatusLineKeepsLogsApart: a terminal that receives both the status and
// the log (stdout and stderr of one tty) shows each log line on a line of
// its own, with the status redrawn after it.
func TestStatusLineKeepsLogsApart(t *testing.T) {
	var tty bytes.Buffer // stdout and stderr interleave on one terminal
	s := &statusLine{term: &tty}
	log := slog.New(slog.NewTextHandler(s.LogWriter(&tty), &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	log.Warn("before any status") // nothing to clear yet
	s.Set("epoch 0 step 1")
	log.Warn("instruction refused")
	s.Set("epoch 0 step 2")
	s.Done()
	want := "level=WARN msg=\"before any status\"\n" +
		clearLine + "epoch 0 step 1" +
		clearLine + "level=WARN msg=\"instruction refused\"\n" + "epoch 0 step 1" +
		clearLine + "epoch 0 step 2" + "\n"
	if got := tty.String(); got != want {
		t.Fatalf("terminal bytes\n got %q\nwant %q", got, want)
	}
	// What a person sees: every log line whole, the status last.
	screen := render(tty.String())
	if screen[len(screen)-1] != "epoch 0 step 2" || !strings.HasPrefix(screen[1], "level=WARN msg=\"instruction refused\"") {
		t.Fatalf("screen %q", screen)
	}
}

// render plays carriage returns and line erasures the way a terminal does.
func render(b string) []string {
	lines := []string{""}
	for len(b) > 0 {
		switch {
		case strings.HasPrefix(b, clearLine):
			lines[len(lines)-1] = ""
			b = b[len(clearLine):]
		case b[0] == '\n':
			lines = append(lines, "")
			b = b[1:]
		default:
			lines[len(lines)-1] += b[:1]
			b = b[1:]
		}
	}
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func TestJoinStatusShowsNoLossBeforeTraining(t *testing.T) {
	before := joinStatus(node.Progress{State: coordinator.Warmup, Epoch: 0, Step: 1}, 2, 0)
	if !strings.Contains(before, "loss -") || strings.Contains(before, "0.000") {
		t.Errorf("before any batch: %q", before)
	}
	after := joinStatus(node.Progress{State: coordinator.RoundTrain, Step: 3, Loss: 4.25, Tokens: 512}, 2, 0)
	if !strings.Contains(after, "loss 4.250") || !strings.Contains(after, "tokens 512") {
		t.Errorf("after training: %q", after)
	}
}

// TestJoinStatusShowsTotalAndETA: the progress line says how far the run
// is and, in rounds, when it will end at the rounds' pace; a warmup or a
// cooldown (no step advances) neither shows an estimate nor stretches the
// next one (a cooldown showed "eta 2h29m31s", the next warmup 4h39m33s).
func TestJoinStatusShowsTotalAndETA(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type obs struct {
		at    time.Duration
		state coordinator.RunState
		step  uint32
		want  time.Duration
	}
	for _, tc := range []struct {
		name string
		seen []obs
	}{
		{"rounds at 2 s a step", []obs{
			{0, coordinator.RoundTrain, 10, 0},                                  // one observation: no rate yet
			{10 * time.Second, coordinator.RoundWitness, 15, 190 * time.Second}, // 95 to go
			{20 * time.Second, coordinator.RoundTrain, 20, 180 * time.Second},   // 90 to go
		}},
		{"a cooldown and a warmup leave the rate alone", []obs{
			{0, coordinator.RoundTrain, 10, 0},
			{20 * time.Second, coordinator.RoundTrain, 20, 180 * time.Second},
			{20 * time.Second, coordinator.Cooldown, 20, 0},
			{10 * time.Minute, coordinator.Warmup, 20, 0},
			{20 * time.Minute, coordinator.RoundTrain, 20, 180 * time.Second},
			{20*time.Minute + 10*time.Second, coordinator.RoundTrain, 25, 170 * time.Second},
		}},
		{"a warmup first", []obs{
			{0, coordinator.Warmup, 0, 0},
			{5 * time.Minute, coordinator.RoundTrain, 0, 0},
			{5*time.Minute + 10*time.Second, coordinator.RoundTrain, 10, 100 * time.Second}, // 1 s a step, not 31
		}},
		{"a restart (the step went back) and the end", []obs{
			{0, coordinator.RoundTrain, 10, 0},
			{20 * time.Second, coordinator.RoundTrain, 20, 180 * time.Second},
			{30 * time.Second, coordinator.RoundTrain, 5, 0},
			{40 * time.Second, coordinator.RoundTrain, 110, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r stepRate
			for i, o := range tc.seen {
				if got := r.eta(t0.Add(o.at), o.state, o.step, 110); got != o.want {
					t.Errorf("observation %d (%s step %d at %v): eta %v, want %v", i, o.state, o.step, o.at, got, o.want)
				}
			}
		})
	}
	line := joinStatus(node.Progress{State: coordinator.RoundTrain, Step: 20, TotalSteps: 110, Tokens: 1}, 1, 180*time.Second)
	if !strings.Contains(line, "step 20/110 eta 3m0s") {
		t.Errorf("progress line %q", line)
	}
}

// TestLeftLine: a trainer that leaves on its own ends with a line that
// says why (the run finished was only an INFO log, under the progress line
// or hidden at the terminal's WARN level).
func TestLeftLine(t *testing.T) {
	for _, tc := range []struct {
		p      node.Progress
		epochs int
		want   string
	}{
		{node.Progress{State: coordinator.Finished, Epoch: 3, Step: 1000, TotalSteps: 1000, Loss: 2.5, Tokens: 4096}, 0,
			"the run tiny is finished: step 1000/1000, last loss 2.500 (this trainer trained 4096 tokens); psyche status --run-id tiny shows it"},
		{node.Progress{State: coordinator.Cooldown, Epoch: 2, Step: 300, TotalSteps: 1000}, 2,
			"left the run tiny after the 2 epochs --epochs asked for (it goes on: epoch 2, step 300)"},
	} {
		if got := leftLine("tiny", tc.p, tc.epochs); got != tc.want {
			t.Errorf("leftLine(%s) = %q, want %q", tc.p.State, got, tc.want)
		}
	}
}

func TestClientLabel(t *testing.T) {
	alice, bob := coordinator.Pubkey{1}, coordinator.Pubkey{2}
	member := func(signer coordinator.Pubkey, st coordinator.ClientState) coordinator.Client {
		return coordinator.Client{ID: coordinator.ClientID{Signer: signer, P2P: coordinator.Pubkey{0xa0, signer[0]}}, State: st}
	}
	// run builds a run in state st with the given epoch members and
	// pending joiners.
	run := func(st coordinator.RunState, members []coordinator.Client, pending ...coordinator.Pubkey) *coordinator.Coordinator {
		s := &coordinator.Coordinator{RunState: st}
		s.Epoch.ClientsLen = uint16(copy(s.Epoch.Clients[:], members))
		for _, p := range pending {
			s.Pending[s.PendingLen] = coordinator.ClientID{Signer: p, P2P: coordinator.Pubkey{0xa0, p[0]}}
			s.PendingLen++
		}
		return s
	}
	healthyAlice := []coordinator.Client{member(alice, coordinator.Healthy)}
	for _, tc := range []struct {
		name  string
		s     *coordinator.Coordinator
		entry coordinator.Client
		want  string
	}{
		{"member in training", run(coordinator.RoundTrain, healthyAlice), member(alice, coordinator.Healthy), "Healthy"},
		{"member in warmup", run(coordinator.Warmup, healthyAlice), member(alice, coordinator.Healthy), "Healthy"},
		{"member in cooldown", run(coordinator.Cooldown, healthyAlice), member(alice, coordinator.Healthy), "Healthy"},
		{"dropped member", run(coordinator.RoundWitness, []coordinator.Client{member(alice, coordinator.Dropped)}), member(alice, coordinator.Dropped), "Dropped"},
		{"withdrawn member after an abandoned epoch", run(coordinator.WaitingForMembers, []coordinator.Client{member(alice, coordinator.Withdrawn)}), member(alice, coordinator.Withdrawn), "Withdrawn"},
		{"ejected", run(coordinator.RoundTrain, nil), member(alice, coordinator.Ejected), "Ejected"},
		{"member of the ended epoch that rejoined", run(coordinator.WaitingForMembers, healthyAlice, alice), member(alice, coordinator.Healthy), "Pending"},
		{"member of the ended epoch that did not rejoin", run(coordinator.WaitingForMembers, healthyAlice, bob), member(alice, coordinator.Healthy), "Left"},
		{"member when the run paused", run(coordinator.Paused, healthyAlice), member(alice, coordinator.Healthy), "Left"},
		{"member when the run finished", run(coordinator.Finished, healthyAlice), member(alice, coordinator.Healthy), "Left"},
		{"last epoch's member, in this one too", run(coordinator.RoundTrain, healthyAlice), member(alice, coordinator.Healthy), "Healthy"},
		{"last epoch's member, dropped from this one", run(coordinator.RoundTrain, []coordinator.Client{member(alice, coordinator.Dropped)}), member(alice, coordinator.Healthy), "Dropped"},
		{"last epoch's member, not in this one", run(coordinator.RoundTrain, healthyAlice), member(bob, coordinator.Healthy), "Left"},
		{"last epoch's member, pending for the next", run(coordinator.RoundTrain, healthyAlice, bob), member(bob, coordinator.Healthy), "Pending"},
		{"dropped from the last epoch, back in this one", run(coordinator.RoundTrain, healthyAlice), member(alice, coordinator.Dropped), "Dropped"},
	} {
		if got := clientLabel(tc.s, tc.entry); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestStatusBetweenEpochs: after an epoch, the members that did not join the
// next show as Left and those that did as Pending, in the text and the JSON.
func TestStatusBetweenEpochs(t *testing.T) {
	alice, bob := coordinator.Pubkey{1}, coordinator.Pubkey{2}
	s := &coordinator.Coordinator{RunState: coordinator.WaitingForMembers}
	s.Epoch.Clients[0] = coordinator.Client{ID: coordinator.ClientID{Signer: alice, P2P: coordinator.Pubkey{3}}}
	s.Epoch.Clients[1] = coordinator.Client{ID: coordinator.ClientID{Signer: bob, P2P: coordinator.Pubkey{4}}}
	s.Epoch.ClientsLen = 2
	s.Epoch.Exited[0] = coordinator.Client{ID: coordinator.ClientID{Signer: coordinator.Pubkey{5}, P2P: coordinator.Pubkey{6}}, State: coordinator.Dropped, ExitedHeight: 7}
	s.Epoch.ExitedLen = 1
	s.Pending[0] = s.Epoch.Clients[1].ID
	s.PendingLen = 1
	v := viewOf(s, time.Unix(0, 0))
	if v.Clients[0].State != "Left" || v.Clients[1].State != "Pending" || v.Exited[0].State != "Dropped" {
		t.Fatalf("view: %+v", v)
	}
	var out bytes.Buffer
	printStatus(&out, v)
	for _, want := range []string{"members (3):\n", alice.String() + " Left\n", bob.String() + " Pending\n", "Dropped at round 7\n"} {
		if !strings.Contains(regexp.MustCompile(` +`).ReplaceAllString(out.String(), " "), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "Healthy") {
		t.Errorf("a client shows as Healthy between epochs:\n%s", out.String())
	}
}

// status names the run's checkpoint store and its service, in text and JSON.
func TestStatusShowsTheStore(t *testing.T) {
	for _, tc := range []struct{ url, endpoint, want string }{
		{"s3://ckpt/runs", "http://10.0.0.1:9000", "checkpoint store: s3://ckpt/runs at http://10.0.0.1:9000\n"},
		{"s3://ckpt", "", "checkpoint store: s3://ckpt at AWS S3\n"},
		{"", "", ""},
	} {
		s := &coordinator.Coordinator{RunState: coordinator.Paused}
		_ = coordinator.SetFixedString(s.Model.Store.URL[:], tc.url)
		_ = coordinator.SetFixedString(s.Model.Store.Endpoint[:], tc.endpoint)
		v := viewOf(s, time.Unix(0, 0))
		if v.Checkpoint.Store != tc.url || v.Checkpoint.Endpoint != tc.endpoint {
			t.Errorf("%q: the view holds %q at %q", tc.url, v.Checkpoint.Store, v.Checkpoint.Endpoint)
		}
		var b bytes.Buffer
		printStatus(&b, v)
		if got := b.String(); tc.want == "" && strings.Contains(got, "checkpoint store") || !strings.Contains(got, tc.want) {
			t.Errorf("%q: status printed\n%s", tc.url, got)
		}
	}
}

// TestStatusSaysWhenTrainersWereLastSeen: in a round, each member's line
// says in which of the kept rounds it was last seen (a witness report of
// its own, or in a witness's participants), and a round nobody has
// reported in for a while says that nobody may be left to drop them; all
// three listed as plain Healthy after every trainer was killed. Addresses
// of 43 and 44 characters stay in one column.
func TestStatusSaysWhenTrainersWereLastSeen(t *testing.T) {
	var alice, bob, carol coordinator.Pubkey
	for i := range alice {
		alice[i], bob[i], carol[i] = 0xff, 0xff, 0x80
	}
	bob[0] = 0x01 // 43 base58 characters; alice's 44
	if len(alice.String()) != 44 || len(bob.String()) != 43 {
		t.Fatalf("addresses of %d and %d characters, want 44 and 43", len(alice.String()), len(bob.String()))
	}
	s := &coordinator.Coordinator{RunState: coordinator.RoundTrain, RunStateStart: 1000}
	s.Config.MaxRoundTrainTime, s.Config.RoundWitnessTime = 30, 5
	for i, k := range []coordinator.Pubkey{alice, bob, carol} {
		s.Epoch.Clients[i] = coordinator.Client{ID: coordinator.ClientID{Signer: k, P2P: coordinator.Pubkey{9, byte(i)}}, State: coordinator.Healthy}
	}
	s.Epoch.ClientsLen = 3
	// Rounds 4-7 in the ring, round 7 current; alice witnessed round 6,
	// bob's result was in round 5's participants, carol is in none.
	for h := uint32(4); h <= 7; h++ {
		s.Epoch.Rounds[h%coordinator.NumRounds] = coordinator.Round{Height: h, ClientsLen: 3}
	}
	s.Epoch.CurrentRound = 7 % coordinator.NumRounds
	r6 := &s.Epoch.Rounds[6%coordinator.NumRounds]
	r6.Witnesses[0].Proof = coordinator.WitnessProof{Index: 0, IsWitness: true}
	r6.WitnessesLen = 1
	r5 := &s.Epoch.Rounds[5%coordinator.NumRounds]
	r5.Witnesses[0].Proof = coordinator.WitnessProof{Index: 0, IsWitness: true}
	r5.Witnesses[0].Key = 77
	r5.Witnesses[0].Participants.Add(77, coordinator.ParticipantMember(bob))
	r5.WitnessesLen = 1
	for _, tc := range []struct {
		name    string
		now     int64
		want    []string
		notWant string
	}{
		{"a round that just began", 1002, []string{"Healthy, last seen in round 6\n", "Healthy, last seen in round 5\n", "Healthy, not seen in the last 4 rounds\n"}, "nobody"},
		{"a round nobody reported in for a minute", 1060, []string{"nobody has reported in round 7 for 1m0s", "nobody is left to drop them", "max_round_train_time 30 s"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printStatus(&out, viewOf(s, time.Unix(tc.now, 0)))
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("status lacks %q:\n%s", want, out.String())
				}
			}
			if tc.notWant != "" && strings.Contains(out.String(), tc.notWant) {
				t.Errorf("status says %q:\n%s", tc.notWant, out.String())
			}
			col := -1
			for _, line := range strings.Split(out.String(), "\n") {
				if i := strings.Index(line, "Healthy"); i >= 0 {
					if col >= 0 && i != col {
						t.Errorf("the clients' states are not in one column:\n%s", out.String())
					}
					col = i
				}
			}
		})
	}
}

// TestStatusListsEachMemberOnce: after one of three trainers stopped, a
// run waiting for members says what it needs (members present of those
// needed, and how long it has waited) and lists each member once with its
// latest state: the stopped trainer was listed as Left (a member of the
// epoch before) and as Dropped at round 1 (this epoch's removal). Once it
// joins again, it is listed as Pending and says that it sits the next
// epoch out, why, and until when.
func TestStatusListsEachMemberOnce(t *testing.T) {
	alice, bob, carol := coordinator.Pubkey{1}, coordinator.Pubkey{2}, coordinator.Pubkey{3}
	id := func(k coordinator.Pubkey) coordinator.ClientID {
		return coordinator.ClientID{Signer: k, P2P: coordinator.Pubkey{0xa0, k[0]}}
	}
	s := &coordinator.Coordinator{RunState: coordinator.WaitingForMembers, RunStateStart: 1000}
	s.Progress.Epoch = 2
	s.Config.InitMinClients, s.Config.MinClients, s.Config.WaitingForMembersExtraTime = 3, 2, 2
	// The epoch that ended: alice and bob to its end, carol dropped at
	// round 1 (after the three were the epoch before's members).
	s.Epoch.ClientsLen = uint16(copy(s.Epoch.Clients[:], []coordinator.Client{{ID: id(alice)}, {ID: id(bob)}}))
	s.Epoch.ExitedLen = uint16(copy(s.Epoch.Exited[:], []coordinator.Client{{ID: id(alice)}, {ID: id(bob)}, {ID: id(carol)},
		{ID: id(carol), State: coordinator.Dropped, ExitedHeight: 1}}))
	s.PendingLen = uint16(copy(s.Pending[:], []coordinator.ClientID{id(alice), id(bob)}))
	text := func() string {
		var out bytes.Buffer
		printStatus(&out, viewOf(s, time.Unix(1250, 0)))
		return regexp.MustCompile(` +`).ReplaceAllString(out.String(), " ")
	}
	for _, tc := range []struct {
		name    string
		pending []coordinator.ClientID
		want    []string
	}{
		{"two of three back", []coordinator.ClientID{id(alice), id(bob)}, []string{
			"waiting for members for 4m10s: 2 of the 3 needed to start epoch 2 have joined (init_min_clients)",
			"members (3):\n", alice.String() + " Pending\n", bob.String() + " Pending\n", carol.String() + " Dropped at round 1\n",
		}},
		{"the dropped one back", []coordinator.ClientID{id(alice), id(bob), id(carol)}, []string{
			"waiting for members for 4m10s: 3 joined, 3 needed (1 of them sits the epoch out, below, and counts towards it): epoch 2 starts once the run has waited 2 s",
			"members (3):\n", carol.String() + " Pending, sits out epoch 2: a health check dropped it at round 1 of the epoch before, and the run has min_clients without it; it may join epoch 3\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.PendingLen = uint16(copy(s.Pending[:], tc.pending))
			got := text()
			for _, want := range tc.want {
				if !strings.Contains(got, want) {
					t.Errorf("status lacks %q:\n%s", want, got)
				}
			}
			for _, k := range []coordinator.Pubkey{alice, bob, carol} {
				if n := strings.Count(got, k.String()); n != 1 {
					t.Errorf("%s is listed %d times:\n%s", k, n, got)
				}
			}
		})
	}
	v := viewOf(s, time.Unix(1250, 0))
	if v.Waiting == nil || v.Waiting.Joined != 3 || v.Waiting.Needed != 3 || v.Waiting.SitOut != 1 || v.Waiting.Waited != 250 ||
		len(v.Members) != 3 || v.Members[2].SitsOut == nil || *v.Members[2].SitsOut != 2 {
		t.Errorf("the JSON view: %+v, members %+v", v.Waiting, v.Members)
	}
}
