package fedserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/federated/secagg"
)

// post sends one signed request to mux in process and returns the status.
func post(t testing.TB, mux http.Handler, kind federated.Kind, seq uint64, payload []byte, s *chain.Keypair) (int, string, int) {
	t.Helper()
	body, err := federated.EncodeRequest(kind, "fed", seq, payload, s)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/federated", bytes.NewReader(body)))
	return rec.Code, rec.Body.String(), len(body)
}

// diskWatch counts what is written to a run's state file and join journal
// from the outside, so that it measures the code before the journal too: a
// state file whose checksum changed was written whole; a journal that grew
// with the same header was appended to, and one that is new (or shorter, or
// of another header) was written whole.
type diskWatch struct {
	state, joins     string
	stateSum         []byte
	joinsHead        []byte
	joinsLen         int64
	written, rewrote int64
}

func (d *diskWatch) observe(t testing.TB) {
	t.Helper()
	// ends reads a file's size and its first or last n bytes.
	ends := func(path string, n int64, last bool) (int64, []byte, error) {
		f, err := os.Open(path)
		if err != nil {
			return 0, nil, err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return 0, nil, err
		}
		n = min(n, fi.Size())
		at := int64(0)
		if last {
			at = fi.Size() - n
		}
		b := make([]byte, n)
		_, err = f.ReadAt(b, at)
		return fi.Size(), b, err
	}
	size, sum, err := ends(d.state, 32, true)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sum, d.stateSum) {
		d.written += size
		d.rewrote++
		d.stateSum = sum
	}
	n, head, err := ends(d.joins, joinsHeaderLen, false)
	if errors.Is(err, os.ErrNotExist) {
		d.joinsHead, d.joinsLen = nil, 0
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if d.joinsHead == nil || !bytes.Equal(head, d.joinsHead) || n < d.joinsLen {
		d.written += n
	} else {
		d.written += n - d.joinsLen
	}
	d.joinsHead, d.joinsLen = head, n
}

// TestFederatedJoinsCostWhatTheySend: anonymous joins to an open run write
// a constant times the bytes they send, not the whole state each (6,000
// joins wrote 1.7 GiB for 888 KB received, ×2,546, growing with the square
// of the members); the joins survive a restart (the journal is replayed),
// and the next full write takes the journal in (here, past ~3,000 joins,
// the journal reaching 4 times the state's size is one).
func TestFederatedJoinsCostWhatTheySend(t *testing.T) {
	const joins = 3200
	ctx := context.Background()
	dir := t.TempDir()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	svc, err := New(dir, acc.get)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	svc.Routes(mux)
	if code, body, _ := post(t, mux, federated.KindConfig, 1, federated.EncodeConfig(&federated.Config{Capacity: 2, RoundDuration: 1}), admin); code != http.StatusOK {
		t.Fatalf("config: %d %s", code, body)
	}
	d := &diskWatch{state: filepath.Join(dir, "fed"+fileExt), joins: filepath.Join(dir, "fed"+joinsExt)}
	d.observe(t)
	d.written, d.rewrote = 0, 0
	var received int64
	began := time.Now()
	for i := range joins {
		code, body, n := post(t, mux, federated.KindJoin, 1, nil, newSigner(fmt.Sprint("joiner", i)))
		if code != http.StatusOK {
			t.Fatalf("join %d: %d %s", i, code, body)
		}
		received += int64(n)
		d.observe(t)
	}
	ratio := float64(d.written) / float64(received)
	t.Logf("%d joins: %d bytes received, %d written (×%.3f; the state file written whole %d times), %v",
		joins, received, d.written, ratio, d.rewrote, time.Since(began).Round(time.Millisecond))
	if ratio > 1 {
		t.Fatalf("%d joins wrote %d bytes for %d received (×%.1f): want at most what they sent", joins, d.written, received, ratio)
	}

	// A restart replays the journal: the first and the last joiner are
	// members (they push), and a replayed join is not taken twice.
	svc2, err := New(dir, acc.get)
	if err != nil {
		t.Fatal(err)
	}
	if q := svc2.Quarantined(); len(q) != 0 {
		t.Fatalf("quarantined after the restart: %v", q)
	}
	mux2 := http.NewServeMux()
	svc2.Routes(mux2)
	if code, _, _ := post(t, mux2, federated.KindJoin, 1, nil, newSigner("joiner7")); code != http.StatusConflict {
		t.Fatalf("a join replayed after the restart: %d, want 409 (Replay)", code)
	}
	hs := httptest.NewServer(mux2)
	defer hs.Close()
	in, err := fedclient.New(hs.URL, "fed", admin).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := in.Params
	for _, name := range []string{"joiner0", fmt.Sprint("joiner", joins-1)} {
		if _, _, err := fedclient.New(hs.URL, "fed", newSigner(name)).Push(ctx, 0, 1, ones(n, 0.1)); err != nil {
			t.Fatalf("%s after the restart: %v", name, err)
		}
	}
	// That aggregation wrote the state whole, journal included.
	if _, err := os.Stat(d.joins); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal is still there after a full write: %v", err)
	}
	b, _ := os.ReadFile(d.state)
	st, err := federated.DecodeState(b)
	if err != nil || len(st.Members) != joins || st.Round != 1 {
		t.Fatalf("the state file after the aggregation: %v", err)
	}
}

// TestFederatedJoinJournalRecovery: a journal whose last record was cut short (a
// crash while a join was written, never acknowledged) loses that join
// only; a journal that names another state file is ignored; one whose
// record before the last is damaged quarantines the run.
func TestFederatedJoinJournalRecovery(t *testing.T) {
	dir := t.TempDir()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	start := func() (*Service, http.Handler) {
		t.Helper()
		svc, err := New(dir, acc.get)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		svc.Routes(mux)
		return svc, mux
	}
	_, mux := start()
	if code, body, _ := post(t, mux, federated.KindConfig, 1, federated.EncodeConfig(&federated.Config{Capacity: 2, RoundDuration: 1}), admin); code != http.StatusOK {
		t.Fatalf("config: %d %s", code, body)
	}
	for _, name := range []string{"a", "b", "c"} {
		if code, body, _ := post(t, mux, federated.KindJoin, 1, nil, newSigner(name)); code != http.StatusOK {
			t.Fatalf("join %s: %d %s", name, code, body)
		}
	}
	journal := filepath.Join(dir, "fed"+joinsExt)
	good, err := os.ReadFile(journal)
	if err != nil || len(good) != joinsHeaderLen+3*joinRecordLen {
		t.Fatalf("the journal after three joins: %d bytes, %v", len(good), err)
	}
	members := func(svc *Service) map[string]bool {
		fr := svc.run("fed")
		if fr == nil {
			t.Fatal("the run is not served")
		}
		fr.mu.Lock()
		defer fr.mu.Unlock()
		out := map[string]bool{}
		for _, name := range []string{"a", "b", "c", "d"} {
			out[name] = fr.m.State().IsMember(newSigner(name).Public())
		}
		return out
	}
	// A torn fourth record ("d"'s, half written).
	torn := append(bytes.Clone(good), joinRecord(newSigner("d").Public(), 1)[:20]...)
	if err := os.WriteFile(journal, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	svc, mux := start()
	if got := members(svc); !got["a"] || !got["b"] || !got["c"] || got["d"] {
		t.Fatalf("members after a torn record: %v", got)
	}
	// The next join folds the journal into the state, then journals again.
	if code, body, _ := post(t, mux, federated.KindJoin, 1, nil, newSigner("d")); code != http.StatusOK {
		t.Fatalf("join d: %d %s", code, body)
	}
	if _, err := os.Stat(journal); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal of the restarted run was not folded into the state: %v", err)
	}
	svc, _ = start()
	if got := members(svc); !got["a"] || !got["d"] {
		t.Fatalf("members after the fold: %v", got)
	}
	// A journal naming another state is ignored.
	other := bytes.Clone(good)
	other[20] ^= 1
	copy(other[joinsHeaderLen:], joinRecord(newSigner("stranger").Public(), 1))
	if err := os.WriteFile(journal, other, 0o644); err != nil {
		t.Fatal(err)
	}
	svc, _ = start()
	fr := svc.run("fed")
	if fr.m.State().IsMember(newSigner("stranger").Public()) {
		t.Fatal("a journal of another state file was replayed")
	}
	// A damaged record before the last: quarantined.
	b, _ := os.ReadFile(filepath.Join(dir, "fed"+fileExt))
	bad := joinsHeader(stateSum(b))
	for _, name := range []string{"e", "f"} {
		bad = append(bad, joinRecord(newSigner(name).Public(), 1)...)
	}
	bad[joinsHeaderLen+5] ^= 1
	if err := os.WriteFile(journal, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	svc, _ = start()
	if q := svc.Quarantined(); q["fed"] == "" {
		t.Fatalf("a journal damaged before its last record: not quarantined (%v)", q)
	}
}

// advertise sends a secure aggregation advertisement for round base as s
// (keys from a fixed seed) and returns the HTTP status.
func advertise(t *testing.T, url string, s *chain.Keypair, base uint64) (int, string) {
	t.Helper()
	pre, err := secagg.NewClient(1, 2, 0, [32]byte{byte(base), 9})
	if err != nil {
		t.Fatal(err)
	}
	k := pre.Advertise()
	body, err := federated.EncodeRequest(federated.KindSecAggAdvertise, "fed", uint64(time.Now().UnixNano()),
		secagg.EncodeAdvertisement(&secagg.Advertisement{Base: base, C: k.C, S: k.S}), s)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/v1/federated", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}

// TestFederatedOpenRunKeepsSlotsForEarlierClients: in an open run, three fresh keys
// (a join and an advertisement each) took every slot of a secure
// aggregation round, and the clients that had trained the run were told
// Busy, round after round, each round stalling to its deadline. The slots
// of the clients of recent rounds are now theirs: the fresh keys are told
// Busy and the round goes on at once without them. When those clients are
// gone, the reservation lapses after RecentRounds failed tries and fresh
// keys take part.
func TestFederatedOpenRunKeepsSlotsForEarlierClients(t *testing.T) {
	ctx := context.Background()
	cfg := &federated.Config{Capacity: 3, RoundDuration: 1, Clip: 1, SecAgg: true, SecAggThreshold: 2, SecAggTimeout: 5}
	_, url, info := configuredRun(t, t.TempDir(), cfg)
	honest := []string{"a", "b", "c"}
	round := func(base uint64, names []string) []error {
		errs := make([]error, len(names))
		var wg sync.WaitGroup
		for i, name := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = fedclient.New(url, "fed", newSigner(name)).SecAggRound(ctx, base, ones(info.Params, 0.001), 1, 2, 0, fedclient.SecAggHooks{})
			}()
		}
		wg.Wait()
		return errs
	}
	for _, name := range honest {
		join(t, url, name)
	}
	for i, err := range round(0, honest) {
		if err != nil {
			t.Fatalf("round 0, client %s: %v", honest[i], err)
		}
	}
	// Round 1: three fresh keys join and advertise first.
	for i := range 3 {
		name := fmt.Sprint("fresh", i)
		join(t, url, name)
		if code, msg := advertise(t, url, newSigner(name), 1); code != http.StatusConflict {
			t.Fatalf("%s's advertisement in round 1: %d %s, want 409 (Busy: the slots are the earlier clients')", name, code, msg)
		}
	}
	began := time.Now()
	for i, err := range round(1, honest) {
		if err != nil {
			t.Fatalf("round 1, client %s: %v", honest[i], err)
		}
	}
	// All three came, so no phase waited for its deadline (5 s).
	if took := time.Since(began); took > 4*time.Second {
		t.Errorf("round 1 took %v: it waited for a deadline", took)
	}
	// The earlier clients leave. The fresh keys are refused while the
	// reservation holds, and take part after RecentRounds failed tries
	// (whose rounds end at their deadline, now 1 s, with nobody).
	cfg.SecAggTimeout = 1
	if _, err := fedclient.New(url, "fed", newSigner("admin")).Configure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	tries := 0
	for ; tries < 2*federated.RecentRounds; tries++ {
		code, _ := advertise(t, url, newSigner("fresh0"), 2)
		if code == http.StatusOK {
			break
		}
		// The wait for the round's keys answers once its deadline has
		// aborted it (409).
		resp, err := http.Get(url + "/v1/runs/fed/federated/secagg?base=2&phase=keys&id=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict {
			t.Fatalf("try %d: the round's keys: %s, want 409 (aborted at its deadline)", tries, resp.Status)
		}
	}
	if tries != federated.RecentRounds {
		t.Fatalf("a fresh key took part after %d tries, want %d", tries, federated.RecentRounds)
	}
}
