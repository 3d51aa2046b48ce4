package libp2p

import (
	"context"
	"fmt"
	"net"
	"sync"

	golibp2p "github.com/libp2p/go-libp2p"
	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	lpyamux "github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-yamux/v5"
)

// yamuxFrame is the largest data frame this node sends on a yamux stream.
// Every frame costs its own trip through the muxer's send loop and its own
// write to the encrypted connection, so a result of many MiB in yamux's
// default 64 KiB frames spends a measurable share of a round's CPU on the
// frames alone. Receivers accept any frame their window allows, so peers
// with the default interoperate. The price: a message of another stream on
// the same connection (gossip) may wait behind one frame, 0.2 s on a
// 10 Mbit/s uplink against 50 ms, well inside a round's whole-second
// windows.
const yamuxFrame = 256 << 10

// muxer is go-libp2p's yamux with larger frames (yamuxFrame); everything
// else as go-libp2p sets it.
func muxer() golibp2p.Option {
	cfg := yamux.Config(*lpyamux.DefaultTransport)
	cfg.MaxMessageSize = yamuxFrame
	return golibp2p.Muxer(lpyamux.ID, (*lpyamux.Transport)(&cfg))
}

// security is TLS (batchedTLS), then Noise, as go-libp2p's default offers
// them.
func security() golibp2p.Option {
	return golibp2p.ChainOptions(
		golibp2p.Security(libp2ptls.ID, newBatchedTLS),
		golibp2p.Security(noise.ID, noise.New),
	)
}

// tlsWriteBatch is how many bytes of TLS records a connection gathers
// before one write to the socket.
const tlsWriteBatch = 64 << 10

// batchedTLS is go-libp2p's TLS security transport, byte for byte the same
// protocol, whose connections hand the socket their records in batches.
// crypto/tls writes each record (at most 16 KiB of payload) with its own
// system call, so a 256 KiB yamux frame took sixteen; here the records of
// one Write reach the socket in writes of up to tlsWriteBatch, and all of
// them before Write returns, so nothing waits in the batch for a later
// write to push it out.
type batchedTLS struct {
	*libp2ptls.Transport
}

func newBatchedTLS(id protocol.ID, key ic.PrivKey, muxers []tptu.StreamMuxer) (*batchedTLS, error) {
	t, err := libp2ptls.New(id, key, muxers)
	if err != nil {
		return nil, err
	}
	return &batchedTLS{t}, nil
}

func (t *batchedTLS) SecureInbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	raw := &batchingConn{Conn: insecure}
	c, err := t.Transport.SecureInbound(ctx, raw, p)
	return batched(c, raw, err)
}

func (t *batchedTLS) SecureOutbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	raw := &batchingConn{Conn: insecure}
	c, err := t.Transport.SecureOutbound(ctx, raw, p)
	return batched(c, raw, err)
}

// batched turns batching on once the handshake is over (the handshake's
// flights are written as crypto/tls writes them).
func batched(c sec.SecureConn, raw *batchingConn, err error) (sec.SecureConn, error) {
	if err != nil {
		return nil, err
	}
	raw.start()
	return &batchedConn{SecureConn: c, raw: raw}, nil
}

// batchedConn is a TLS connection whose Write flushes the records it made.
type batchedConn struct {
	sec.SecureConn
	raw *batchingConn
	mu  sync.Mutex // one Write and its flush at a time
}

func (c *batchedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.SecureConn.Write(p)
	if ferr := c.raw.flush(); err == nil {
		err = ferr
	}
	return n, err
}

// Close lets TLS send its closing alert straight through and close the
// socket. A Close during a Write must not wait for it (a peer that stopped
// reading would hold the Write until its deadline): crypto/tls then closes
// the socket at once, which ends the Write, and sends no alert.
func (c *batchedConn) Close() error {
	if c.mu.TryLock() {
		c.raw.stop()
		c.mu.Unlock()
	}
	return c.SecureConn.Close()
}

// batchingConn is the socket under TLS: while batching, writes gather in a
// buffer that is written out when full or flushed. crypto/tls may also write
// from a Read (a reply to the peer's key update); that record waits for the
// next flush, which is allowed: nothing in the protocol waits on it.
type batchingConn struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf []byte
}

func (c *batchingConn) start() {
	c.mu.Lock()
	c.on = true
	c.mu.Unlock()
}

// stop flushes and writes everything after it straight through.
func (c *batchingConn) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.flushLocked()
	c.on = false
	c.buf = nil
}

func (c *batchingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return c.Conn.Write(p)
	}
	if len(c.buf)+len(p) > tlsWriteBatch {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= tlsWriteBatch {
		return c.Conn.Write(p)
	}
	if c.buf == nil {
		c.buf = make([]byte, 0, tlsWriteBatch)
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *batchingConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked()
}

func (c *batchingConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}

// resourceManager is go-libp2p's default resource manager (the same limits)
// without its metrics. Left to the default, it reports every event (each
// stream opened and closed, each window of memory reserved) to a Prometheus
// reporter, formatting a timestamp for each: 2% of a round's CPU at 16
// nodes, for figures that go to the process-wide registry, which many nodes
// in one process must not share. Node's own metrics (WithMetrics) are
// unaffected.
func resourceManager() (golibp2p.Option, error) {
	limits := rcmgr.DefaultLimits
	golibp2p.SetDefaultServiceLimits(&limits)
	mgr, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), rcmgr.WithMetricsDisabled())
	if err != nil {
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	return golibp2p.ResourceManager(mgr), nil
}
