package serverclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// TestPostSurvivesAClosedKeepAlive: the server closes a keep-alive
// connection just as the client sends a request on it (here: it reads the
// second request and hangs up without an answer). The request is sent
// again on a new connection, since a sequence is applied once whatever
// happens; before, the instruction was lost ("EOF": a witness report, in a
// localnet on a loaded machine).
func TestPostSurvivesAClosedKeepAlive(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 2 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"changed":true}`))
	}))
	defer srv.Close()
	c := New(srv.URL, nil)
	for i := range 2 {
		r, err := c.post(context.Background(), []byte("signed request"), uint64(i+1), &coordinator.Tick{})
		if err != nil {
			t.Fatalf("post %d: %v", i+1, err)
		}
		if !r.Changed {
			t.Fatalf("post %d: %+v", i+1, r)
		}
	}
	if got := requests.Load(); got != 3 {
		t.Fatalf("the server saw %d requests, want 3 (the second twice)", got)
	}
}
