package explorer

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
)

// TestHistorySurvivesARestart: an explorer keeping history in a directory
// (the server's) is stopped and started again; before the run sends any
// snapshot, its page and its CSV have the steps seen before the restart.
func TestHistorySurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	start := func() (*Explorer, *fakeSource, *httptest.Server, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		src := newFakeSource("demo")
		ex, err := New(WithRefresh(10*time.Millisecond), WithHistoryDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = ex.Run(ctx, src) }()
		srv := httptest.NewServer(ex.Handler())
		return ex, src, srv, func() { cancel(); srv.Close() }
	}
	ex, src, _, stop := start()
	feed := <-src.subs
	s := trainingRun()
	feed <- chain.Snapshot{State: s}
	waitPoint(t, ex, func(p Point) bool { return p.Loss != nil }) // the snapshot is folded in
	ex.RecordHeldOut("demo", 7, 1, 3.25)
	stop()

	ex, _, srv, stop := start()
	defer stop()
	// Listed, no snapshot fed: the point comes from the directory.
	waitPoint(t, ex, func(p Point) bool { return p.Loss != nil && p.HeldOut != nil })
	resp, err := http.Get(srv.URL + "/api/runs/demo/history.csv")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "step,epoch,loss,held_out,tokens_per_sec,bytes_sent,witnesses,quorum,trainers\n7,1,4.5,3.25,1152,450,2,2,3\n"
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("history.csv: %d\n%s\nwant\n%s", resp.StatusCode, body, want)
	}
}

// waitPoint waits until run demo has exactly one point and it satisfies ok.
func waitPoint(t *testing.T, ex *Explorer, ok func(Point) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second) // a hang guard, not a time budget
	for {
		if u, _, found := ex.update("demo", 0); found && len(u.Points) == 1 && ok(u.Points[0]) {
			return
		}
		select {
		case <-deadline:
			u, _, _ := ex.update("demo", 0)
			t.Fatalf("the run's points never became what the test waits for: %+v", u.Points)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestPointStoreCompacts: changes are appended, a later line for a step
// wins, a torn last line is skipped, and the file is rewritten once the
// changes outnumber the points.
func TestPointStoreCompacts(t *testing.T) {
	st, err := newPointStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	all := []Point{{Step: 1, Witnesses: 1}, {Step: 2, Witnesses: 1}}
	if err := st.save("r", all, all); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 1200; i++ { // step 2 changes again and again
		all[1].Witnesses = i
		if err := st.save("r", all[1:], all); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(st.path("r"))
	if lines := strings.Count(string(b), "\n"); lines > 1010 {
		t.Fatalf("%d lines for 2 points: never compacted", lines)
	}
	f, _ := os.OpenFile(st.path("r"), os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(`{"step":3,"epo`) // a crash mid-line
	f.Close()
	got, err := newPointStore(st.dir)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := got.load("r")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Step != 1 || ps[1].Step != 2 || ps[1].Witnesses != 1200 {
		t.Fatalf("loaded %+v", ps)
	}
}
