package libp2p

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	golibp2p "github.com/libp2p/go-libp2p"
	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// A node's TLS batches its records and its yamux sends larger frames; both
// must stay the protocols a stock go-libp2p host speaks. A stock host (TLS,
// yamux, defaults throughout) and a node exchange payloads that span many
// frames, batches and records, each way, on streams both sides open.
func TestTransportInteropsWithStockLibp2p(t *testing.T) {
	nd := startNode(t, "n0", WithAllowAll())
	stock, err := golibp2p.New(golibp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), golibp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer stock.Close()
	const echo = protocol.ID("/psyche-test/echo/1")
	echoing := func(s network.Stream) {
		defer s.Close()
		b, err := io.ReadAll(s)
		if err != nil {
			s.Reset()
			return
		}
		_, _ = s.Write(b)
	}
	stock.SetStreamHandler(echo, echoing)
	nd.host.SetStreamHandler(echo, echoing)

	ctx := context.Background()
	if err := nd.host.Connect(ctx, peer.AddrInfo{ID: stock.ID(), Addrs: stock.Addrs()}); err != nil {
		t.Fatal(err)
	}
	for _, c := range nd.host.Network().ConnsToPeer(stock.ID()) {
		if st := c.ConnState(); st.Security != libp2ptls.ID || st.StreamMultiplexer != "/yamux/1.0.0" {
			t.Fatalf("connection security %q, muxer %q", st.Security, st.StreamMultiplexer)
		}
	}
	for _, c := range []struct {
		name     string
		from, to interface {
			NewStream(context.Context, peer.ID, ...protocol.ID) (network.Stream, error)
			ID() peer.ID
		}
		size int
	}{
		{"node to stock, 3 MiB + 1", nd.host, stock, 3<<20 + 1},
		{"stock to node, 3 MiB + 1", stock, nd.host, 3<<20 + 1},
		{"node to stock, one byte", nd.host, stock, 1},
		{"node to stock, one TLS record", nd.host, stock, 16 << 10},
		{"stock to node, a frame and a record", stock, nd.host, yamuxFrame + 16<<10},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := c.from.NewStream(ctx, c.to.ID(), echo)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			want := randomBytes(uint64(c.size), c.size)
			go func() {
				_, _ = s.Write(want)
				_ = s.CloseWrite()
			}()
			got, err := io.ReadAll(s)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("echo of %d bytes came back as %d different bytes", len(want), len(got))
			}
		})
	}
}

// recordingConn is a socket that records each write it is given.
type recordingConn struct {
	net.Conn
	writes [][]byte
	closed bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordingConn) Close() error { c.closed = true; return nil }

// What the socket under TLS is given, write by write: nothing is held back
// past a flush, a batch never exceeds tlsWriteBatch, a write at least that
// large goes straight through (after what was batched), and before start
// and after stop every write passes as it comes.
func TestBatchingConn(t *testing.T) {
	rec := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	type op struct {
		write []byte
		flush bool
	}
	for _, c := range []struct {
		name  string
		start bool
		ops   []op
		want  []int // lengths of the socket's writes, in order
	}{
		{"before start: straight through", false, []op{{write: rec(5, 1)}, {write: rec(7, 2)}}, []int{5, 7}},
		{"records gather until the flush", true, []op{{write: rec(100, 1)}, {write: rec(200, 2)}, {flush: true}}, []int{300}},
		{"nothing to flush, nothing written", true, []op{{flush: true}}, nil},
		{"a full batch goes out before the next record", true,
			[]op{{write: rec(40<<10, 1)}, {write: rec(20<<10, 2)}, {write: rec(10<<10, 3)}, {flush: true}}, []int{60 << 10, 10 << 10}},
		{"a large write follows what was batched", true,
			[]op{{write: rec(10, 1)}, {write: rec(tlsWriteBatch, 2)}, {write: rec(3, 3)}, {flush: true}}, []int{10, tlsWriteBatch, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := &recordingConn{}
			bc := &batchingConn{Conn: sock}
			if c.start {
				bc.start()
			}
			var sent []byte
			for _, o := range c.ops {
				if o.flush {
					if err := bc.flush(); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if n, err := bc.Write(o.write); err != nil || n != len(o.write) {
					t.Fatalf("write: %d, %v", n, err)
				}
				sent = append(sent, o.write...)
			}
			var lens []int
			var got []byte
			for _, w := range sock.writes {
				lens = append(lens, len(w))
				got = append(got, w...)
			}
			if !equalInts(lens, c.want) {
				t.Errorf("socket writes %v, want %v", lens, c.want)
			}
			if !bytes.Equal(got, sent) {
				t.Error("the socket got other bytes than were written, or in another order")
			}
		})
	}

	// stop sends what is pending and passes later writes (TLS's closing
	// alert) straight through.
	sock := &recordingConn{}
	bc := &batchingConn{Conn: sock}
	bc.start()
	_, _ = bc.Write(rec(9, 1))
	bc.stop()
	_, _ = bc.Write(rec(2, 2))
	if len(sock.writes) != 2 || len(sock.writes[0]) != 9 || len(sock.writes[1]) != 2 {
		t.Errorf("after stop: socket writes %d", len(sock.writes))
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// armedConn reports its first write after it is armed.
type armedConn struct {
	net.Conn
	armed   atomic.Bool
	writing chan struct{}
	once    sync.Once
}

func (c *armedConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		c.once.Do(func() { close(c.writing) })
	}
	return c.Conn.Write(p)
}

// A peer that stops reading must not make Close wait: Close during a Write
// stuck on the socket closes at once and ends the Write with an error.
// net.Pipe has no buffer, so the Write blocks until the peer reads, which
// it never does after the handshake.
func TestBatchedTLSCloseDuringAStuckWrite(t *testing.T) {
	keyOf := func() (ic.PrivKey, peer.ID) {
		k, _, err := ic.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return k, id
	}
	ck, _ := keyOf()
	sk, sid := keyOf()
	client, err := newBatchedTLS(libp2ptls.ID, ck, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, err := libp2ptls.New(libp2ptls.ID, sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp, sp := net.Pipe()
	defer sp.Close()
	ctx := context.Background()
	served := make(chan error, 1)
	go func() {
		_, err := server.SecureInbound(ctx, sp, "")
		served <- err
	}()
	raw := &armedConn{Conn: cp, writing: make(chan struct{})}
	sc, err := client.SecureOutbound(ctx, raw, sid)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	raw.armed.Store(true)
	wrote := make(chan error, 1)
	go func() {
		_, err := sc.Write(make([]byte, 1<<20))
		wrote <- err
	}()
	<-raw.writing // the Write is on the socket, which nobody reads
	if err := sc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("close: %v", err)
	}
	if err := <-wrote; err == nil {
		t.Fatal("the stuck Write succeeded after Close")
	}
}
