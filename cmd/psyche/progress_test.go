package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/quietclock"
	"github.com/psyche-go/psyche/trainer/node"
)

// lineWriter hands each written log line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w <- l
	}
	return len(p), nil
}

// TestProgressLoggedEveryInterval: a trainer whose output is no terminal
// logs its progress every progressEvery of its clock, whatever the run is
// doing (here waiting between epochs, where it logs nothing else), with
// what it last reported; the clock is the test's, so no line waits for
// the wall's.
func TestProgressLoggedEveryInterval(t *testing.T) {
	clock := quietclock.New(time.Unix(1_800_000_000, 0))
	started := make(chan time.Duration, 1)
	newTicker := func(period time.Duration) (<-chan time.Time, func()) {
		c, stop := clock.Ticker(period)
		started <- period
		return c, stop
	}
	var mu sync.Mutex
	p := node.Progress{State: coordinator.WaitingForMembers, Epoch: 2, Step: 40, TotalSteps: 1000, Loss: 2.5, Tokens: 4096}
	lines := make(lineWriter, 8)
	log := slog.New(slog.NewTextHandler(lines, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		logProgress(ctx, log, newTicker, func() (node.Progress, int) { mu.Lock(); defer mu.Unlock(); return p, 2 })
	}()
	if period := <-started; period != 30*time.Second {
		t.Fatalf("the progress line comes every %v, want 30s", period)
	}
	for _, tc := range []struct {
		state coordinator.RunState
		epoch uint32
		want  string
	}{
		{coordinator.WaitingForMembers, 2, `level=INFO msg=progress state=WaitingForMembers epoch=2 step=40/1000 loss=2.500 tokens=4096 peers=2`},
		{coordinator.Warmup, 3, `level=INFO msg=progress state=Warmup epoch=3 step=40/1000 loss=2.500 tokens=4096 peers=2`},
	} {
		mu.Lock()
		p.State, p.Epoch = tc.state, tc.epoch
		mu.Unlock()
		clock.Advance(progressEvery)
		if got := <-lines; !strings.HasPrefix(got, tc.want) {
			t.Errorf("after %v: %q, want %q…", progressEvery, got, tc.want)
		}
	}
	cancel()
	<-done
	if len(lines) != 0 {
		var extra bytes.Buffer
		for len(lines) > 0 {
			extra.WriteString(<-lines + "\n")
		}
		t.Errorf("more lines than intervals:\n%s", extra.String())
	}
}
