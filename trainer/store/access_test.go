package store_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/trainer/store"
)

// recorder poses as a run's endpoint (or a proxy) on 127.0.0.1 and keeps
// what arrived: every request, and the credentials among them.
type recorder struct {
	*httptest.Server
	mu       sync.Mutex
	requests int
	signed   []string // Authorization and X-Amz-Security-Token values seen
}

func record(t *testing.T) *recorder {
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		r.mu.Lock()
		r.requests++
		for _, h := range []string{"Authorization", "X-Amz-Security-Token"} {
			if v := q.Header.Get(h); v != "" {
				r.signed = append(r.signed, h+": "+v)
			}
		}
		r.mu.Unlock()
		if q.URL.Query().Has("location") {
			w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="http://s3.amazonaws.com/doc/2006-03-01/">us-east-1</LocationConstraint>`))
		}
		// HEAD /bucket: the bucket exists.
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) seen() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, append([]string(nil), r.signed...)
}

// trainerKeys puts keys and a session token in the environment, as a
// trainer on a cloud machine has them.
func trainerKeys(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIATRAINERSOWNKEY")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "trainers-own-secret")
	t.Setenv("AWS_SESSION_TOKEN", "trainers-session-token")
	t.Setenv(store.EnvEndpoint, "")
	t.Setenv(store.EnvAllowHTTP, "")
}

// checkBucket opens the run's store and checks its bucket, as every
// joiner's background store check does.
func checkBucket(cfg store.Config, opts ...store.Option) error {
	s, err := store.Open(cfg, opts...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.BucketExists(ctx)
}

// A run's endpoint that the trainer did not name gets none of its
// credentials: on this machine it is refused before any request, and
// elsewhere (here allowed on 127.0.0.1 by a test option) it is talked to
// anonymously. The endpoint the trainer names gets them.
func TestCredentialsOnlyToTheNamedEndpoint(t *testing.T) {
	trainerKeys(t)
	run := record(t)
	cfg := store.Config{URL: "s3://ckpt/runs", Endpoint: run.URL, Region: "us-east-1"}

	for name, opts := range map[string][]store.Option{
		"names nothing":            nil,
		"names nothing, http ok":   {store.WithAccess(store.Access{AllowHTTP: true})},
		"names another endpoint":   {store.WithAccess(store.Access{Endpoint: "https://s3.example.com", AllowHTTP: true})},
		"names another local port": {store.WithAccess(store.Access{Endpoint: "http://127.0.0.1:1", AllowHTTP: true})},
	} {
		err := checkBucket(cfg, opts...)
		if !errors.Is(err, store.ErrEndpoint) {
			t.Errorf("%s: the run's endpoint on this machine: %v, want ErrEndpoint", name, err)
		}
		if n, signed := run.seen(); n != 0 || len(signed) != 0 {
			t.Fatalf("%s: the run's endpoint on this machine got %d requests, credentials %q", name, n, signed)
		}
	}

	// Not on this machine (the test lets 127.0.0.1 pass as elsewhere):
	// anonymous.
	if err := checkBucket(cfg, store.WithAccess(store.Access{Endpoint: "https://s3.example.com", AllowHTTP: true}), store.WithLocalEndpoints()); err != nil {
		t.Fatalf("anonymous check: %v", err)
	}
	if n, signed := run.seen(); n == 0 || len(signed) != 0 {
		t.Fatalf("the run's endpoint got %d requests, credentials %q: want requests and no credentials", n, signed)
	}
	// Plain http to a run's endpoint needs the trainer's consent even then.
	if err := checkBucket(cfg, store.WithLocalEndpoints()); !errors.Is(err, store.ErrEndpoint) || !strings.Contains(err.Error(), store.EnvAllowHTTP) {
		t.Errorf("plain http without consent: %v", err)
	}

	// The trainer names it (its loopback: http is fine): the credentials
	// go, session token included.
	if err := checkBucket(cfg, store.WithAccess(store.Access{Endpoint: run.URL + "/"})); err != nil {
		t.Fatalf("named: %v", err)
	}
	_, signed := run.seen()
	if s := strings.Join(signed, "\n"); !strings.Contains(s, "AKIATRAINERSOWNKEY") || !strings.Contains(s, "X-Amz-Security-Token: trainers-session-token") {
		t.Fatalf("the named endpoint did not get the credentials: %q", signed)
	}
	// The same from the environment.
	t.Setenv(store.EnvEndpoint, strings.Replace(run.URL, "http://", "HTTP://", 1))
	s, err := store.Open(cfg)
	if err != nil || !s.Named() {
		t.Fatalf("named in the environment: %v, named %v", err, err == nil && s.Named())
	}
}

// A name that resolves to this machine is refused where the connection is
// made (a run's name can resolve elsewhere later), at once and without the
// client's retries; through a proxy, before the request is handed to it.
func TestRunEndpointResolvingHere(t *testing.T) {
	trainerKeys(t)
	run := record(t)
	port := run.URL[strings.LastIndex(run.URL, ":"):]
	cfg := store.Config{URL: "s3://ckpt/runs", Endpoint: "http://localhost" + port, Region: "us-east-1"}
	allowHTTP := store.WithAccess(store.Access{AllowHTTP: true})
	start := time.Now()
	err := checkBucket(cfg, allowHTTP)
	if !errors.Is(err, store.ErrEndpoint) || !strings.Contains(err.Error(), "resolves to") {
		t.Fatalf("localhost by name: %v, want ErrEndpoint at the connection", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the refusal took %v: retried", d)
	}
	if n, _ := run.seen(); n != 0 {
		t.Fatalf("the endpoint got %d requests", n)
	}

	proxy := record(t)
	via := store.WithProxy(func(*http.Request) (*url.URL, error) { return url.Parse(proxy.URL) })
	if err := checkBucket(cfg, allowHTTP, via); !errors.Is(err, store.ErrEndpoint) {
		t.Fatalf("through a proxy: %v, want ErrEndpoint", err)
	}
	if n, _ := proxy.seen(); n != 0 {
		t.Fatalf("the proxy got %d requests for a refused endpoint", n)
	}
	// The trainer's own endpoint goes through the proxy it chose.
	if err := checkBucket(cfg, store.WithAccess(store.Access{Endpoint: cfg.Endpoint}), via); err != nil {
		t.Fatalf("the named endpoint through the proxy: %v", err)
	}
	if n, signed := proxy.seen(); n == 0 || len(signed) == 0 {
		t.Fatalf("the proxy got %d requests, credentials %q: want the named endpoint's signed requests", n, signed)
	}
}

// The rules on the endpoint as written, before any request.
func TestEndpointRules(t *testing.T) {
	trainerKeys(t)
	open := func(endpoint string, a store.Access) (*store.Store, error) {
		return store.Open(store.Config{URL: "s3://ckpt", Endpoint: endpoint}, store.WithAccess(a))
	}
	h := store.Access{AllowHTTP: true}
	for _, tc := range []struct {
		endpoint string
		access   store.Access
	}{
		{"http://127.0.0.1:9000", h},
		{"http://[::1]:9000", h},
		{"https://10.1.2.3", h},
		{"https://192.168.1.1:9000", h},
		{"https://172.16.0.9", h},
		{"https://169.254.169.254", h}, // the cloud's metadata service
		{"https://100.100.100.100", h},
		{"https://[fd00::1]", h},
		{"https://[fe80::1]", h},
		{"https://[::ffff:127.0.0.1]", h},
		{"https://0.0.0.0:9000", h},
		{"https://[::]:9000", h},
		{"http://203.0.113.7:9000", store.Access{}}, // a run's plain http
		{"http://203.0.113.7:9000", store.Access{Endpoint: "http://203.0.113.7:9000"}}, // the trainer's, over the network in the clear
		{"http://localhost:9000", store.Access{Endpoint: "http://localhost:9000"}},     // fine, but for its name: below
	} {
		_, err := open(tc.endpoint, tc.access)
		if tc.endpoint == "http://localhost:9000" {
			if err != nil {
				t.Errorf("%s named, on loopback: %v", tc.endpoint, err)
			}
			continue
		}
		if !errors.Is(err, store.ErrEndpoint) {
			t.Errorf("%s with %+v: %v, want ErrEndpoint", tc.endpoint, tc.access, err)
		}
	}
	for _, tc := range []struct {
		endpoint string
		access   store.Access
		named    bool
	}{
		{"https://203.0.113.7", store.Access{}, false},
		{"", store.Access{}, false}, // AWS S3
		{"", store.Access{Endpoint: store.AWSEndpoint}, true},
		{"https://S3.Example.com:443/", store.Access{Endpoint: "https://s3.example.com"}, true},
		{"https://s3.example.com:8443", store.Access{Endpoint: "https://s3.example.com"}, false},
		{"http://s3.example.com", store.Access{Endpoint: "https://s3.example.com", AllowHTTP: true}, false},
		{"http://203.0.113.7:9000", store.Access{Endpoint: "http://203.0.113.7:9000", AllowHTTP: true}, true},
	} {
		s, err := open(tc.endpoint, tc.access)
		if err != nil || s.Named() != tc.named {
			t.Errorf("%q with %+v: %v, named %v, want named %v", tc.endpoint, tc.access, err, err == nil && s.Named(), tc.named)
		}
	}
	for _, bad := range []string{"s3.example.com", "ftp://host", "https://user:pw@host", "https://host/path"} {
		if err := (store.Access{Endpoint: bad}).Check(); !errors.Is(err, store.ErrSetting) {
			t.Errorf("naming %q: %v, want ErrSetting", bad, err)
		}
	}
}
