package libp2p

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/p2p"
)

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p2p.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("reload gave another key: %v", err)
	}
	// A node started from the file has the key's identity.
	n, err := New(WithRunID(testRun), WithKeyFile(path), loopback())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		n.Close()
		if _, err := n.Publish(context.Background(), 1, p2p.BatchRange{}, nil); !errors.Is(err, p2p.ErrClosed) {
			t.Errorf("publish after close: %v", err)
		}
	}()
	if id := n.ID(); !bytes.Equal(id[:], k1.Public().(ed25519.PublicKey)) {
		t.Error("the node's identity is not the key file's")
	}
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); !errors.Is(err, p2p.ErrKeyFile) {
		t.Errorf("corrupt key file: %v", err)
	}
}

func TestOptions(t *testing.T) {
	if _, err := New(WithKey(testKey("x"))); !errors.Is(err, p2p.ErrConfig) {
		t.Errorf("missing run id: %v", err)
	}
	if _, err := New(WithRunID("r"), WithKey(testKey("x")), WithKey(testKey("y"))); !errors.Is(err, p2p.ErrOptionSet) {
		t.Errorf("key set twice: %v", err)
	}
	if _, err := New(WithRunID("r")); !errors.Is(err, p2p.ErrConfig) {
		t.Errorf("missing key: %v", err)
	}
	// A bootstrap address that does not parse is named in an error log and
	// skipped; the node starts with the others.
	var logs bytes.Buffer
	n, err := New(WithRunID("r"), WithKey(testKey("x")), loopback(), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		WithBootstrapPeers("/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2/p2p/"+startNode(t, "boot").host.ID().String()))
	if err != nil {
		t.Fatalf("bootstrap address without /p2p/: %v", err)
	}
	n.Close()
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "/ip4/127.0.0.1/tcp/1") {
		t.Errorf("the bad bootstrap address is not named in an error: %s", logs.String())
	}
}

func TestAddrKey(t *testing.T) {
	n, err := New(WithRunID(testRun), WithKey(testKey("addr")), loopback())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{n.Addrs()[0], true},
		{"/ip4/127.0.0.1/tcp/1", false},        // no identity
		{"not a multiaddr", false},             // unparseable
		{"/ip4/127.0.0.1/tcp/1/p2p/Qm", false}, // truncated identity
	} {
		k, err := AddrKey(tc.addr)
		switch {
		case tc.ok && (err != nil || k != n.ID()):
			t.Errorf("%s: key %x, %v; want %x", tc.addr, k[:4], err, n.ID())
		case !tc.ok && !errors.Is(err, p2p.ErrBadAddress):
			t.Errorf("%s: %v, want p2p.ErrBadAddress", tc.addr, err)
		}
	}
}
