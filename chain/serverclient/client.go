package serverclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
)

// Client is the chain.Backend of a server.
type Client struct {
	base string
	http *http.Client
	log  *slog.Logger

	mu       sync.Mutex
	lastSeq  uint64
	bindings map[string]clientBinding // by run id

	// A refused event stream (Subscribe): how often the run is polled
	// instead, and how long before the stream is tried again (0: what the
	// server's Retry-After says). Tests shorten them (WithPolling).
	pollEvery, streamRetry time.Duration
}

// Polling while the server refuses a stream (Subscribe): the run's account
// every DefaultPollInterval (answered in a few bytes while it has not
// changed), the stream again after the server's Retry-After, within
// [minStreamRetry, maxStreamRetry].
const (
	DefaultPollInterval = 500 * time.Millisecond
	minStreamRetry      = time.Second
	maxStreamRetry      = time.Minute
	defaultStreamRetry  = 10 * time.Second
)

// clientBinding is a run's binding as last fetched, with the offset of the
// server's clock from ours (nanoseconds) at the time.
type clientBinding struct {
	b      serverwire.Binding
	offset int64
}

var _ chain.Backend = (*Client)(nil)

// New talks to the server at base (for example http://127.0.0.1:7600).
func New(base string, log *slog.Logger, opts ...Option) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{base: strings.TrimRight(base, "/"), http: &http.Client{}, log: log, bindings: map[string]clientBinding{},
		pollEvery: DefaultPollInterval}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Option changes a Client New makes.
type Option func(*Client)

// WithPolling sets how often a client whose event stream the server refuses
// polls the run (every) and how long before it tries the stream again
// (streamRetry; 0: what the server's Retry-After says). Tests shorten both;
// the defaults suit everything else.
func WithPolling(every, streamRetry time.Duration) Option {
	return func(c *Client) { c.pollEvery, c.streamRetry = every, streamRetry }
}

// binding returns what requests for runID are signed for, fetching it when
// it is not known or refresh is set (a request was refused as stale).
func (c *Client) binding(ctx context.Context, runID string, refresh bool) (clientBinding, error) {
	c.mu.Lock()
	cb, ok := c.bindings[runID]
	c.mu.Unlock()
	if ok && !refresh {
		return cb, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs/"+runID+"/binding", nil)
	if err != nil {
		return cb, fmt.Errorf("server: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return cb, fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		var f serverwire.Failure
		if err := dec.Decode(&f); err != nil {
			return cb, fmt.Errorf("server: binding of run %q: HTTP %d", runID, resp.StatusCode)
		}
		return cb, f.Err()
	}
	var info serverwire.BindingInfo
	if err := dec.Decode(&info); err != nil {
		return cb, fmt.Errorf("server: binding of run %q: %w", runID, err)
	}
	id, err := hex.DecodeString(info.Server)
	if err != nil || len(id) != 32 {
		return cb, fmt.Errorf("server: binding of run %q: bad server identity %q", runID, info.Server)
	}
	cb = clientBinding{b: serverwire.Binding{Incarnation: info.Incarnation, Floor: info.Floor, Now: info.Now},
		offset: int64(info.Now) - time.Now().UnixNano()}
	copy(cb.b.Server[:], id)
	c.setBinding(runID, cb)
	return cb, nil
}

func (c *Client) setBinding(runID string, cb clientBinding) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bindings[runID] = cb
}

// sequence returns a fresh, strictly increasing sequence number: the
// server's time in nanoseconds (our clock corrected by the offset seen when
// fetching the binding), above the run's floor, or one more than the last
// when that has not moved.
func (c *Client) sequence(cb clientBinding) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := max(uint64(time.Now().UnixNano()+cb.offset), c.lastSeq+1, cb.b.Floor+1)
	c.lastSeq = seq
	return seq
}

// Send implements chain.Backend. A request refused as stale (the run was
// freed and created again, the server's identity changed, or our clock
// drifted out of its window) or as a replay (a concurrent Send of ours with a
// higher sequence arrived first, or the run's floor rose) was not applied:
// it is signed again once, with a fresh sequence for a freshly fetched
// binding.
func (c *Client) Send(ctx context.Context, runID string, signer, coSigner chain.Signer, ix coordinator.Instruction) (chain.Receipt, error) {
	id, err := coordinator.ParseRunID(runID)
	if err != nil {
		return chain.Receipt{}, err
	}
	data := coordinator.EncodeInstruction(ix)
	for attempt := 0; ; attempt++ {
		cb, err := c.binding(ctx, runID, attempt > 0)
		if err != nil {
			return chain.Receipt{}, err
		}
		var body []byte
		seq := c.sequence(cb)
		if coSigner != nil {
			body, err = serverwire.EncodeRequest(cb.b, id, seq, data, signer, coSigner)
		} else {
			body, err = serverwire.EncodeRequest(cb.b, id, seq, data, signer, nil)
		}
		if err != nil {
			return chain.Receipt{}, err
		}
		r, err := c.post(ctx, body, seq, ix)
		if (errors.Is(err, serverwire.ErrStale) || errors.Is(err, serverwire.ErrReplay)) && attempt == 0 {
			continue
		}
		if err != nil {
			return chain.Receipt{}, err
		}
		switch ix.(type) {
		case *coordinator.InitCoordinator:
			cb.b.Incarnation = r.Incarnation
			c.setBinding(runID, cb)
		case *coordinator.FreeCoordinator:
			c.mu.Lock()
			delete(c.bindings, runID)
			c.mu.Unlock()
		}
		return chain.Receipt{Changed: r.Changed, From: parseState(r.From), To: parseState(r.To), Nonce: r.Nonce}, nil
	}
}

// post sends one signed request (its sequence is seq). The request says
// it is idempotent, which it is: the server applies a sequence once and
// refuses it as a replay after that. So net/http sends it again, on a new
// connection, when the keep-alive connection it picked turns out closed by
// the server before any answer came (the server closes idle connections;
// a busy client can pick one in the instant between the close and its
// noticing it). Seen once in a localnet of 4 trainers on a loaded machine:
// a witness report lost to EOF, and its round waited for its training
// limit.
func (c *Client) post(ctx context.Context, body []byte, seq uint64, ix coordinator.Instruction) (*serverwire.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/instructions", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	req.Header.Set("Idempotency-Key", strconv.FormatUint(seq, 10))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("server: sending %s: %w", ix.Name(), err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var f serverwire.Failure
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("server: %s: HTTP %d", ix.Name(), resp.StatusCode)
		}
		return nil, f.Err()
	}
	var r serverwire.Result
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("server: decoding the reply to %s: %w", ix.Name(), err)
	}
	return &r, nil
}

func parseState(name string) coordinator.RunState {
	for s := coordinator.Uninitialized; s <= coordinator.Paused; s++ {
		if s.String() == name {
			return s
		}
	}
	return coordinator.Uninitialized
}

// Snapshot implements chain.Backend.
func (c *Client) Snapshot(ctx context.Context, runID string) (chain.Snapshot, error) {
	state, _, err := c.fetch(ctx, runID, "")
	if err != nil {
		return chain.Snapshot{}, err
	}
	return chain.Snapshot{State: state}, nil
}

// Subscribe implements chain.Backend. It reconnects (with backoff) when the
// stream breaks, and drops snapshots that are not newer than the last one.
// When the server refuses the stream (429: its stream caps are full, or
// this client's address group holds its share), it polls the run's account
// instead, every DefaultPollInterval, and tries the stream again after the
// server's Retry-After: a trainer keeps following its run, a little later
// than a stream would tell it, and goes back to a stream when it can.
func (c *Client) Subscribe(ctx context.Context, runID string) (<-chan chain.Snapshot, error) {
	// Fail fast on a run that does not exist.
	if _, err := c.Snapshot(ctx, runID); err != nil {
		return nil, err
	}
	refusals := 0 // in a row: the first is logged at Info, the others at Debug
	return chain.Resubscribe(ctx, c.log, runID, func(ctx context.Context, _ int, out chan<- chain.Snapshot) error {
		for {
			err := c.stream(ctx, runID, out)
			var refused *streamRefused
			if !errors.As(err, &refused) {
				refusals = 0
				return err
			}
			level := slog.LevelDebug
			if refusals++; refusals == 1 {
				level = slog.LevelInfo
			}
			c.log.Log(ctx, level, "event stream refused; polling the run", "run", runID, "err", refused.detail, "retry", refused.retry)
			if err := c.poll(ctx, runID, out, refused.retry); err != nil {
				return err
			}
		}
	}), nil
}

// streamRefused is a stream the server refused with 429, and when it says
// to try again.
type streamRefused struct {
	retry  time.Duration
	detail string
}

func (e *streamRefused) Error() string { return "event stream refused: " + e.detail }

// refusedStream reads a 429's Retry-After (seconds) and reason.
func (c *Client) refusedStream(resp *http.Response) *streamRefused {
	retry := defaultStreamRetry
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		retry = min(max(time.Duration(secs)*time.Second, minStreamRetry), maxStreamRetry)
	}
	if c.streamRetry > 0 {
		retry = c.streamRetry
	}
	detail := "HTTP 429"
	var f serverwire.Failure
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&f); err == nil && f.Error != "" {
		detail = f.Error
	}
	return &streamRefused{retry: retry, detail: detail}
}

// poll delivers the run's account to out every c.pollEvery, when it
// changed, for d; then it returns nil (time to try the stream again). It
// returns an error when the run is gone or a request fails.
func (c *Client) poll(ctx context.Context, runID string, out chan<- chain.Snapshot, d time.Duration) error {
	until := time.NewTimer(d)
	defer until.Stop()
	tick := time.NewTicker(c.pollEvery)
	defer tick.Stop()
	var etag string
	for {
		state, tag, err := c.fetch(ctx, runID, etag)
		if err != nil {
			return err
		}
		if state != nil {
			etag = tag
			select {
			case out <- chain.Snapshot{State: state}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-until.C:
			return nil
		case <-tick.C:
		}
	}
}

// fetch gets the run's account unless its ETag is still etag (then the
// state is nil).
func (c *Client) fetch(ctx context.Context, runID, etag string) (*coordinator.Coordinator, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs/"+runID, nil)
	if err != nil {
		return nil, "", fmt.Errorf("server: %w", err)
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		return nil, etag, nil
	case http.StatusNotFound:
		return nil, "", fmt.Errorf("%w: %q", chain.ErrRunNotFound, runID)
	case http.StatusOK:
	default:
		return nil, "", fmt.Errorf("server: fetching run %q: HTTP %d", runID, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(coordinator.AccountSize)+1))
	if err != nil {
		return nil, "", fmt.Errorf("server: %w", err)
	}
	state, err := coordinator.DecodeAccount(b)
	if err != nil {
		return nil, "", err
	}
	return state, resp.Header.Get("ETag"), nil
}

func (c *Client) stream(ctx context.Context, runID string, out chan<- chain.Snapshot) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs/"+runID+"/events?deltas=1", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return chain.ErrRunNotFound
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		return c.refusedStream(resp)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	// The account as the stream has it (serverwire/delta.go): whole events replace
	// it, deltas change it in place; one buffer each for the stream's life.
	var acct, delta []byte
	isDelta := false
	for sc.Scan() {
		line := sc.Bytes()
		if kind, ok := bytes.CutPrefix(line, []byte("event: ")); ok {
			isDelta = string(kind) == "delta"
			continue
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			if len(line) == 0 {
				isDelta = false // an event ends at a blank line
			}
			continue
		}
		if isDelta {
			if acct == nil {
				return fmt.Errorf("bad event: a delta before any account")
			}
			if delta, err = base64.StdEncoding.AppendDecode(delta[:0], data); err != nil {
				return fmt.Errorf("bad event: %w", err)
			}
			if err := serverwire.ApplyDelta(acct, delta); err != nil {
				return err
			}
		} else if acct, err = base64.StdEncoding.AppendDecode(acct[:0], data); err != nil {
			return fmt.Errorf("bad event: %w", err)
		}
		state, err := coordinator.DecodeAccount(acct) // copies what it reads
		if err != nil {
			return err
		}
		select {
		case out <- chain.Snapshot{State: state}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// P2PBootstrap implements chain.Bootstrapper: the server's libp2p host.
func (c *Client) P2PBootstrap(ctx context.Context) (chain.P2PBootstrap, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/p2p", nil)
	if err != nil {
		return chain.P2PBootstrap{}, fmt.Errorf("server: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return chain.P2PBootstrap{}, fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return chain.P2PBootstrap{}, chain.ErrNoP2P
	}
	if resp.StatusCode != http.StatusOK {
		return chain.P2PBootstrap{}, fmt.Errorf("server: p2p info: HTTP %d", resp.StatusCode)
	}
	var info serverwire.P2PInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&info); err != nil {
		return chain.P2PBootstrap{}, fmt.Errorf("server: p2p info: %w", err)
	}
	out := chain.P2PBootstrap{Addrs: info.Addrs}
	if info.Relay {
		out.Relays = info.Addrs
	}
	return out, nil
}

// Runs lists the server's run ids (GET /v1/runs).
func (c *Client) Runs(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs", nil)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("server: listing runs: HTTP %d", resp.StatusCode)
	}
	var ids []string
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ids); err != nil {
		return nil, fmt.Errorf("server: listing runs: %w", err)
	}
	return ids, nil
}

// URL is the server's base URL, as given to New: a run's
// "server:PATH" data is read from it.
func (c *Client) URL() string { return c.base }
