package fedclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
)

// ErrPaused means the run is paused: updates are refused until it resumes.
var ErrPaused = errors.New("fedclient: the run is paused")

// ErrRefused means the server refused to let this key join the run (a run
// with a join authority and no token for the key, or a full run): trying
// again does not help.
var ErrRefused = errors.New("fedclient: joining the run was refused")

// ErrNoRound means no new round arrived while the server waited (ask again).
var ErrNoRound = errors.New("fedclient: no new round yet")

// Client talks to one run's federated service.
type Client struct {
	base   string
	run    string
	signer federated.Signer
	http   *http.Client

	mu  sync.Mutex
	seq uint64
}

// New returns a client of run at the server base URL, signing with signer.
func New(base, run string, signer federated.Signer) *Client {
	return &Client{base: strings.TrimSuffix(base, "/"), run: run, signer: signer, http: &http.Client{Timeout: 5 * time.Minute}}
}

// nextSeq is the current time in nanoseconds, or one more than the last
// (the server's convention: a restarted client needs no state).
func (c *Client) nextSeq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq = max(c.seq+1, uint64(time.Now().UnixNano()))
	return c.seq
}

func decodeFailure(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var f federated.Failure
	if json.Unmarshal(body, &f) != nil || f.Name == "" {
		return fmt.Errorf("fedclient: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	switch f.Name {
	case "Stale":
		return &StaleError{Round: f.Round, Msg: f.Error}
	case "Paused":
		return fmt.Errorf("%w: %s", ErrPaused, f.Error)
	case "Aborted", "Busy":
		return fmt.Errorf("%w: %s", ErrAborted, f.Error)
	case "Duplicate":
		return fmt.Errorf("%w (%s)", federated.ErrDuplicate, f.Error)
	case "NotMember":
		return fmt.Errorf("%w (%s)", federated.ErrNotMember, f.Error)
	case "Forbidden", "Full":
		return fmt.Errorf("%w: %s", ErrRefused, f.Error)
	case "Finished":
		return fmt.Errorf("%w (%s)", federated.ErrFinished, f.Error)
	}
	return fmt.Errorf("fedclient: %s: %s", f.Name, f.Error)
}

// StaleError is a refusal of an update trained on a round the server has
// left behind; Round is the server's.
type StaleError struct {
	Round uint64
	Msg   string
}

func (e *StaleError) Error() string { return e.Msg }

func (e *StaleError) Is(target error) bool { return target == federated.ErrStale }

// Info returns the run's federated state.
func (c *Client) Info(ctx context.Context) (*federated.Info, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs/"+url.PathEscape(c.run)+"/federated", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, decodeFailure(resp)
	}
	var in federated.Info
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		return nil, fmt.Errorf("fedclient: info: %w", err)
	}
	return &in, nil
}

// RunModel returns the run's model settings (shape, learning rate,
// optimizer) from the coordinator account the server holds.
func (c *Client) RunModel(ctx context.Context) (*coordinator.Model, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/runs/"+url.PathEscape(c.run), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fedclient: reading run %q: %w", c.run, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("fedclient: the server has no run %q", c.run)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fedclient: reading run %q: %s", c.run, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(coordinator.AccountSize)+1))
	if err != nil {
		return nil, fmt.Errorf("fedclient: reading run %q: %w", c.run, err)
	}
	acct, err := coordinator.DecodeAccount(b)
	if err != nil {
		return nil, err
	}
	return &acct.Model, nil
}

// Model returns the run's model; with after ≥ 0 the server waits for a
// round past it (ErrNoRound if none came while it waited).
func (c *Client) Model(ctx context.Context, after int64) (uint64, []float32, error) {
	u := c.base + "/v1/runs/" + url.PathEscape(c.run) + "/federated/model"
	if after >= 0 {
		u += "?after=" + strconv.FormatInt(after, 10)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNoContent:
		return 0, nil, ErrNoRound
	default:
		return 0, nil, decodeFailure(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, federated.MaxModel+1))
	if err != nil {
		return 0, nil, err
	}
	return federated.DecodeModel(b)
}

func (c *Client) post(ctx context.Context, kind federated.Kind, payload []byte, out any) (int, error) {
	body, err := federated.EncodeRequest(kind, c.run, c.nextSeq(), payload, c.signer)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/federated", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return len(body), decodeFailure(resp)
	}
	return len(body), json.NewDecoder(resp.Body).Decode(out)
}

// Push sends an update trained on round base; it returns the bytes sent.
func (c *Client) Push(ctx context.Context, base uint64, steps uint32, delta []float32) (*federated.PushResult, int, error) {
	var res federated.PushResult
	n, err := c.post(ctx, federated.KindUpdate, federated.EncodeUpdate(&federated.UpdatePayload{Base: base, Steps: steps, Delta: delta}), &res)
	if err != nil {
		return nil, n, err
	}
	return &res, n, nil
}

// PushFrame sends a DisTrO-compressed update trained on round base (a
// distro frame's bytes).
func (c *Client) PushFrame(ctx context.Context, base uint64, steps uint32, frame []byte) (*federated.PushResult, int, error) {
	var res federated.PushResult
	n, err := c.post(ctx, federated.KindUpdate, federated.EncodeUpdate(&federated.UpdatePayload{Base: base, Steps: steps, Frame: frame}), &res)
	if err != nil {
		return nil, n, err
	}
	return &res, n, nil
}

// Join makes the signer a member of the run, which it must be to push:
// token is the join authority's (federated.JoinToken), nil for a run
// without one.
func (c *Client) Join(ctx context.Context, token []byte) (*federated.Info, error) {
	var in federated.Info
	if _, err := c.post(ctx, federated.KindJoin, token, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

// Configure sets the run's federated config (the signer must be the run's
// authority); the first config starts the run.
func (c *Client) Configure(ctx context.Context, cfg *federated.Config) (*federated.Info, error) {
	var in federated.Info
	if _, err := c.post(ctx, federated.KindConfig, federated.EncodeConfig(cfg), &in); err != nil {
		return nil, err
	}
	return &in, nil
}
