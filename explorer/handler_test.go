package explorer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
)

// fakeSource lists the runs it is told and hands out a channel per
// subscription, which the test feeds and closes.
type fakeSource struct {
	mu      sync.Mutex
	ids     []string
	listErr error
	subs    chan chan chain.Snapshot
}

func newFakeSource(ids ...string) *fakeSource {
	return &fakeSource{ids: ids, subs: make(chan chan chain.Snapshot, 8)}
}

func (f *fakeSource) Runs(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids, f.listErr
}

func (f *fakeSource) Subscribe(context.Context, string) (<-chan chain.Snapshot, error) {
	ch := make(chan chain.Snapshot)
	f.subs <- ch
	return ch, nil
}

func (f *fakeSource) setErr(err error) {
	f.mu.Lock()
	f.listErr = err
	f.mu.Unlock()
}

// events reads one server-sent event's data (skipping clock events).
type events struct {
	t  *testing.T
	sc *bufio.Scanner
}

func (e *events) next() string {
	e.t.Helper()
	event := ""
	for e.sc.Scan() {
		line := e.sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "":
			return strings.TrimPrefix(line, "data: ")
		case line == "":
			event = ""
		}
	}
	e.t.Fatalf("the stream ended: %v", e.sc.Err())
	return ""
}

func open(t *testing.T, url string) (*events, func()) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s: %s %s", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	return &events{t: t, sc: bufio.NewScanner(resp.Body)}, func() { resp.Body.Close() }
}

func TestHandlerStreamsARun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := newFakeSource("demo")
	ex, err := New(WithRefresh(10*time.Millisecond), WithClock(func() time.Time { return time.Unix(1234, 0) }))
	if err != nil {
		t.Fatal(err)
	}
	ex.cfg.retry = 10 * time.Millisecond
	go func() { _ = ex.Run(ctx, src) }()
	srv := httptest.NewServer(ex.Handler())
	defer srv.Close()

	feed := <-src.subs
	feed <- chain.Snapshot{State: trainingRun()}

	// The run list streams the run once its snapshot is in.
	list, closeList := open(t, srv.URL+"/api/runs/events")
	defer closeList()
	for {
		var l List
		if err := json.Unmarshal([]byte(list.next()), &l); err != nil {
			t.Fatal(err)
		}
		if len(l.Runs) == 1 && l.Runs[0].State == "RoundWitness" {
			if l.Runs[0].Clients != 2 || l.Now != 1234 {
				t.Errorf("run list %+v", l)
			}
			break
		}
	}

	run, closeRun := open(t, srv.URL+"/api/runs/demo/events")
	defer closeRun()
	var u Update
	if err := json.Unmarshal([]byte(run.next()), &u); err != nil {
		t.Fatal(err)
	}
	if !u.Reset || len(u.Points) != 1 || u.View.Step != 7 || !u.Listed || len(u.View.Clients) != 5 {
		t.Fatalf("first update %+v", u)
	}
	// A newer snapshot: only the changed point comes again.
	s := trainingRun()
	s.Nonce, s.Progress.Step, s.RunState = 11, 8, 3
	feed <- chain.Snapshot{State: s}
	u = Update{}
	if err := json.Unmarshal([]byte(run.next()), &u); err != nil {
		t.Fatal(err)
	}
	if u.Reset || u.View.Step != 8 || len(u.Points) != 0 {
		t.Errorf("second update %+v", u)
	}
	// The stream breaks: the page is told, and the explorer subscribes again.
	close(feed)
	u = Update{}
	if err := json.Unmarshal([]byte(run.next()), &u); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(u.View.Error, "reconnecting") {
		t.Errorf("after the break: %+v", u.View)
	}
	feed = <-src.subs
	s.Nonce = 12
	feed <- chain.Snapshot{State: s}
	u = Update{}
	if err := json.Unmarshal([]byte(run.next()), &u); err != nil {
		t.Fatal(err)
	}
	if u.View.Error != "" {
		t.Errorf("error kept after reconnecting: %q", u.View.Error)
	}
	// The backend goes down: the list says so, the run keeps its history.
	src.setErr(errors.New("connection refused"))
	for {
		u = Update{}
		if err := json.Unmarshal([]byte(run.next()), &u); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(u.Error, "cannot be reached: connection refused") {
			break
		}
	}
	resp, err := http.Get(srv.URL + "/api/runs/demo")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var full Update
	if err := json.NewDecoder(resp.Body).Decode(&full); err != nil || len(full.Points) != 1 || full.View.Nonce != 12 {
		t.Errorf("the run after the backend went down: %+v %v", full, err)
	}
}

func TestHandlerRefusesWhatItDoesNotServe(t *testing.T) {
	ex, err := New()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ex.Handler())
	defer srv.Close()
	for _, c := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/api/runs/nope", http.StatusNotFound, `no run \"nope\"`},
		{"GET", "/api/runs/nope/events", http.StatusNotFound, `no run \"nope\"`},
		{"GET", "/api/runs/" + strings.Repeat("x", 40), http.StatusBadRequest, "is not a run id"},
		{"GET", "/api/runs/bad%20id/events", http.StatusBadRequest, "is not a run id"},
		{"POST", "/api/runs", http.StatusMethodNotAllowed, ""},
		{"DELETE", "/api/runs/nope", http.StatusMethodNotAllowed, ""},
		{"POST", "/", http.StatusMethodNotAllowed, ""},
		{"GET", "/", http.StatusOK, `<script src="app.js">`},
		{"GET", "/app.js", http.StatusOK, `"uplot"`},
		{"GET", "/api/runs", http.StatusOK, `"runs":[]`},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader("x"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(body), c.body) {
			t.Errorf("%s %s: %d %.200q, want %d with %q", c.method, c.path, resp.StatusCode, body, c.status, c.body)
		}
	}
}

// A localnet's explorer says how many epochs its run trains (its
// total_steps is a bound nobody reaches); any other says nothing of it.
func TestUpdateSaysTheEpochLimit(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		want uint32
	}{{nil, 0}, {[]Option{WithEpochLimit(3)}, 3}} {
		ex, err := New(tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		ex.mu.Lock()
		r := ex.newRun("demo")
		r.h.observe(trainingRun())
		ex.mu.Unlock()
		u, _, ok := ex.update("demo", 0)
		if !ok {
			t.Fatal("no update for a run observed")
		}
		if u.View.TotalEpochs != tc.want || u.View.TotalSteps != 100 {
			t.Errorf("WithEpochLimit %d: total_epochs %d, total_steps %d", tc.want, u.View.TotalEpochs, u.View.TotalSteps)
		}
		b, _ := json.Marshal(u.View)
		if got := strings.Contains(string(b), `"total_epochs"`); got != (tc.want != 0) {
			t.Errorf("WithEpochLimit %d: JSON %s", tc.want, b)
		}
	}
}
