package node_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/node"
)

// TestRefusedDataIsSatOut: the run's data server answers one trainer 429
// for a while (it reads from an address of its own): that trainer sits
// its rounds out, retrying until each round's training time ends, and
// stays in the run; the others train on; once it is served again, it
// trains with them to the same weights. Before, the data error ended its
// Run and the trainer exited.
func TestRefusedDataIsSatOut(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	const slow = "127.0.0.3" // trainer 2's reads come from here
	var refusing atomic.Bool
	var refused atomic.Int64
	serve := func(tokens string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if host, _, _ := net.SplitHostPort(r.RemoteAddr); host == slow && refusing.Load() {
				refused.Add(1)
				w.Header().Set("Retry-After", "1")
				http.Error(w, "too many data reads", http.StatusTooManyRequests)
				return
			}
			http.ServeFile(w, r, tokens)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/train.tokens"
	}
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(slow)}}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	c := newClusterServing(t, nil, 3, nil, serve, func(i int) []node.Option {
		if i != 2 {
			return nil
		}
		return []node.Option{node.WithDataOptions(data.WithHTTPClient(&http.Client{Transport: tr}))}
	})
	s := c.waitFor("training", func(s *coordinator.Coordinator) bool {
		return s.RunState == coordinator.RoundTrain && s.CurrentRound().Height >= 1
	})
	refusing.Store(true)
	from := s.Progress.Step
	// waitFor fails the test if a trainer's Run returns an error.
	s = c.waitFor("rounds without trainer 2's data", func(s *coordinator.Coordinator) bool {
		return refused.Load() > 0 && s.Progress.Step >= from+3 && s.RunState == coordinator.RoundTrain
	})
	refusing.Store(false)
	// Dropped by the health checks (its results did not come), it joins a
	// later epoch: the first one it trains in from the start is trained
	// to its end with the others.
	back, id := s.Progress.Epoch, c.nodes[2].ID().Signer
	with := uint32(0)
	c.waitFor("an epoch trained by all three after the data came back", func(s *coordinator.Coordinator) bool {
		if i, ok := s.ClientIndex(id); with == 0 && ok && s.Progress.Epoch > back && s.RunState == coordinator.RoundTrain &&
			s.Epoch.Clients[i].State == coordinator.Healthy {
			with = s.Progress.Epoch
		}
		return with > 0 && s.Progress.Epoch > with && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	c.sameWeights(0, 1, 2)
}
