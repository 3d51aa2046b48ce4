package validator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/psyche-go/psyche/internal/solurl"
)

// EnvValidator names the environment variable that points the repository's
// Solana tests (the backend suite in chain/solana, the CLI flows in
// cmd/psyche) at a validator that is already running, instead of the local
// one they start by default: its JSON-RPC URL. The coordinator program must
// be loaded there at its local id, as solana-test-validator does with
//
//	solana-test-validator --reset --bpf-program 5umpemz6ch7jSiyRVyy7qjwANzQnwvYsbMtgQfeUmaQf programs/coordinator/coordinator.so
//	PSYCHE_TEST_VALIDATOR=http://127.0.0.1:8899 go test ./chain/solana/ ./cmd/psyche/
//
// Its clock follows wall time, so the tests wait for it where they would
// move the local validator's clock, and they name their runs uniquely, so
// that they can run again against the same ledger.
const EnvValidator = "PSYCHE_TEST_VALIDATOR"

// EnvValidatorWebSocket overrides the websocket URL of the validator that
// EnvValidator names (default: ws:// on the RPC port + 1, where
// solana-test-validator serves it).
const EnvValidatorWebSocket = "PSYCHE_TEST_VALIDATOR_WS"

// FromEnv attaches to the validator $PSYCHE_TEST_VALIDATOR names; ok is
// false when the variable is unset.
func FromEnv() (v *Validator, ok bool, err error) {
	rpc := os.Getenv(EnvValidator)
	if rpc == "" {
		return nil, false, nil
	}
	ws := os.Getenv(EnvValidatorWebSocket)
	if ws == "" {
		if ws, err = solurl.WebsocketBeside(rpc); err != nil {
			return nil, true, fmt.Errorf("validator: $%s: %w", EnvValidator, err)
		}
	}
	v, err = Attach(rpc, ws)
	return v, true, err
}

// Attach returns a Validator for one that is already running at the given
// URLs. Close and Run do not stop it; SetClock, where the validator cannot
// move its clock, waits until the clock has reached the time asked for.
func Attach(rpc, ws string) (*Validator, error) {
	for _, s := range []string{rpc, ws} {
		if _, err := url.Parse(s); err != nil || s == "" {
			return nil, fmt.Errorf("validator: attach: bad URL %q", s)
		}
	}
	return &Validator{RPC: rpc, WebSocket: ws, attached: true, done: make(chan struct{}), closing: make(chan struct{})}, nil
}

// Attached reports whether v is a validator this process did not start
// (Attach, FromEnv).
func (v *Validator) Attached() bool { return v.attached }

// errMethodNotFound is JSON-RPC's answer to psycheSetClock from a
// validator other than ours.
const errMethodNotFound = -32601

// waitClock polls the Clock sysvar until its unix_timestamp reaches t: the
// only way to move the clock of a validator whose clock follows wall time.
func (v *Validator) waitClock(ctx context.Context, t time.Time) error {
	for {
		now, err := v.ClockTime(ctx)
		if err != nil {
			return err
		}
		if !now.Before(t) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("validator: waiting for the chain clock to reach %d (at %d): %w", t.Unix(), now.Unix(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ClockTime reads the Clock sysvar's unix_timestamp.
func (v *Validator) ClockTime(ctx context.Context) (time.Time, error) {
	var info struct {
		Value *struct {
			Data []string `json:"data"`
		} `json:"value"`
	}
	if err := v.call(ctx, "getAccountInfo", []any{"SysvarC1ock11111111111111111111111111111111", map[string]string{"encoding": "base64"}}, &info); err != nil {
		return time.Time{}, err
	}
	if info.Value == nil || len(info.Value.Data) != 2 {
		return time.Time{}, errors.New("validator: the Clock sysvar is missing")
	}
	b, err := base64.StdEncoding.DecodeString(info.Value.Data[0])
	if err != nil || len(b) < 40 {
		return time.Time{}, fmt.Errorf("validator: the Clock sysvar is %d bytes (%v)", len(b), err)
	}
	return time.Unix(int64(binary.LittleEndian.Uint64(b[32:40])), 0), nil
}

// rpcError is a JSON-RPC error answer.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%s (%d)", e.Message, e.Code) }

// call makes one JSON-RPC request to the validator.
func (v *Validator) call(ctx context.Context, method string, params []any, result any) error {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.RPC, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("validator: %s: %w", method, err)
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return fmt.Errorf("validator: %s: %s: %w", method, resp.Status, err)
	}
	if out.Error != nil {
		return fmt.Errorf("validator: %s: %w", method, out.Error)
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(out.Result, result)
}
