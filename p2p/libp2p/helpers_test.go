package libp2p

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

const testRun = "test-run"

// testKey derives a fixed identity, so that failures name the same peers on
// every run.
func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("psyche p2p test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func clientIDOf(name string) coordinator.ClientID {
	var id coordinator.ClientID
	id.Signer = coordinator.Pubkey(sha256.Sum256([]byte("signer " + name)))
	copy(id.P2P[:], testKey(name).Public().(ed25519.PublicKey))
	return id
}

// testNode is a running Node with a way to kill it.
type testNode struct {
	*Node
	name string
	stop context.CancelFunc
	done chan struct{} // closed when Run has returned
	err  error
}

// kill stops the node and waits until its host is closed.
func (tn *testNode) kill(t testing.TB) {
	tn.stop()
	select {
	case <-tn.done:
	case <-time.After(30 * time.Second): // a hang guard: stopping takes milliseconds
		buf := make([]byte, 1<<22)
		os.WriteFile("/tmp/p2p-stacks.txt", buf[:runtime.Stack(buf, true)], 0o644)
		t.Errorf("node %s did not stop", tn.name)
	}
}

func loopback() Option {
	return WithListenAddrs("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1")
}

// startNode starts a node named name and stops it when the test ends.
func startNode(t testing.TB, name string, opts ...Option) *testNode {
	t.Helper()
	return startNodeWith(t, name, append([]Option{loopback()}, opts...)...)
}

// startNodeWith is startNode without the default loopback listen addresses.
func startNodeWith(t testing.TB, name string, opts ...Option) *testNode {
	t.Helper()
	all := append([]Option{WithRunID(testRun), WithKey(testKey(name)), WithSigner(clientIDOf(name).Signer)}, opts...)
	n, err := New(all...)
	if err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, name: name, stop: cancel, done: make(chan struct{})}
	go func() { tn.err = n.Run(ctx); close(tn.done) }()
	t.Cleanup(func() { tn.kill(t) })
	return tn
}

// startCluster starts n nodes that allow each other, connects every pair
// and waits until every node sees every other on the topic.
func startCluster(t testing.TB, n int, opts ...Option) []*testNode {
	t.Helper()
	return startClusterEach(t, n, func(int) []Option { return opts })
}

// startClusterEach is startCluster with node i's options from opts(i).
func startClusterEach(t testing.TB, n int, opts func(i int) []Option) []*testNode {
	t.Helper()
	var ids []coordinator.ClientID
	var nodes []*testNode
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		ids = append(ids, clientIDOf(name))
		nodes = append(nodes, startNode(t, name, opts(i)...))
	}
	for _, nd := range nodes {
		nd.SetClients(ids)
	}
	connectAll(t, nodes)
	waitTopicPeers(t, nodes, n-1)
	return nodes
}

func connectAll(t testing.TB, nodes []*testNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range nodes {
		for j := i + 1; j < len(nodes); j++ {
			if err := nodes[i].Connect(ctx, tcpAddr(nodes[j])); err != nil {
				t.Fatalf("connect %s to %s: %v", nodes[i].name, nodes[j].name, err)
			}
		}
	}
}

// tcpAddr is one of nd's addresses, a TCP one if it has any: the order of
// Addrs is not fixed, and a cluster connected over TCP measures the same
// thing every run.
func tcpAddr(nd *testNode) string {
	for _, a := range nd.Addrs() {
		if strings.Contains(a, "/tcp/") {
			return a
		}
	}
	return nd.Addrs()[0]
}

// eventually polls cond until it holds or the deadline passes. The deadline
// is a hang guard, generous for a loaded machine: the wait ends as soon as
// cond holds.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitTopicPeers(t testing.TB, nodes []*testNode, want int) {
	t.Helper()
	eventually(t, 60*time.Second, "topic peers", func() bool {
		for _, nd := range nodes {
			if len(nd.topic.ListPeers()) < want {
				return false
			}
		}
		return true
	})
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// collect reads announcements of step from nd until want distinct trainers
// have announced, falling back to Pull when gossip is slow.
func collect(ctx context.Context, nd *testNode, step uint32, want int) ([]p2p.Announcement, error) {
	var got []p2p.Announcement
	err := collectEach(ctx, nd, step, want, func(a p2p.Announcement) { got = append(got, a) })
	return got, err
}

// collectEach is collect that hands each trainer's first announcement to
// each as it arrives.
func collectEach(ctx context.Context, nd *testNode, step uint32, want int, each func(p2p.Announcement)) error {
	seen := map[coordinator.Pubkey]bool{}
	add := func(a p2p.Announcement) {
		if a.Step == step && !seen[a.Trainer.P2P] {
			seen[a.Trainer.P2P] = true
			each(a)
		}
	}
	pull := time.NewTicker(time.Second)
	defer pull.Stop()
	for len(seen) < want {
		select {
		case a := <-nd.Announcements():
			add(a)
		case <-pull.C:
			as, _ := nd.Pull(ctx, step)
			for _, a := range as {
				add(a)
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d announcements for step %d: %w", nd.name, len(seen), want, step, ctx.Err())
		}
	}
	return nil
}

// fetchAll fetches every announcement concurrently.
func fetchAll(ctx context.Context, nd *testNode, as []p2p.Announcement) ([][]byte, []error) {
	out := make([][]byte, len(as))
	errs := make([]error, len(as))
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = nd.Fetch(ctx, a)
		}()
	}
	wg.Wait()
	return out, errs
}

// gathered is the value a registry exports for metric name with label
// key=value (summed over any other labels).
func gathered(t testing.TB, reg *prometheus.Registry, name, key, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == key && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
