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
// is and, once steps advance, when it will end.
func TestJoinStatusShowsTotalAndETA(t *testing.T) {
	var r stepRate
	t0 := time.Unix(1000, 0)
	if eta := r.eta(t0, 10, 110); eta != 0 {
		t.Fatalf("eta from one observation: %v", eta)
	}
	eta := r.eta(t0.Add(20*time.Second), 20, 110) // 2 s a step, 90 to go
	if eta != 180*time.Second {
		t.Fatalf("eta %v, want 3m0s", eta)
	}
	line := joinStatus(node.Progress{State: coordinator.RoundTrain, Step: 20, TotalSteps: 110, Tokens: 1}, 1, eta)
	if !strings.Contains(line, "step 20/110 eta 3m0s") {
		t.Errorf("progress line %q", line)
	}
	if eta := r.eta(t0.Add(30*time.Second), 5, 110); eta != 0 { // a restart: the step went back
		t.Errorf("eta right after a restart: %v", eta)
	}
	if eta := r.eta(t0.Add(40*time.Second), 110, 110); eta != 0 {
		t.Errorf("eta at the end: %v", eta)
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
	v := viewOf(s)
	if v.Clients[0].State != "Left" || v.Clients[1].State != "Pending" || v.Exited[0].State != "Dropped" {
		t.Fatalf("view: %+v", v)
	}
	var out bytes.Buffer
	printStatus(&out, v)
	for _, want := range []string{"clients of the last epoch (2):\n", alice.String() + " Left\n", bob.String() + " Pending\n", "Dropped at round 7\n"} {
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
		v := viewOf(s)
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
