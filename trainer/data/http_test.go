package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fastRetries keeps test backoffs short.
func fastRetries(retries int) []Option {
	return []Option{WithRetries(retries), WithBackoff(time.Millisecond, 2*time.Millisecond)}
}

// noKeepAlives is a client whose transport never reuses a connection: the
// transport then cannot retry a request on its own, so a handler counts
// exactly the source's attempts.
func noKeepAlives(t *testing.T) Option {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return WithHTTPClient(&http.Client{Transport: tr})
}

// counted wraps a handler and counts its requests.
type counted struct {
	n atomic.Int64
	h func(w http.ResponseWriter, r *http.Request, attempt int64)
}

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.h(w, r, c.n.Add(1)) }

func newSource(t *testing.T, h http.Handler, opts ...Option) (*HTTPSource, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := NewHTTPSource(srv.URL+"/tokens.bin", append([]Option{noKeepAlives(t)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

func TestHTTPSourceRetriesTransientFailures(t *testing.T) {
	content := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name string
		fail func(w http.ResponseWriter)
	}{
		{"503", func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }},
		{"500", func(w http.ResponseWriter) { http.Error(w, "boom", http.StatusInternalServerError) }},
		{"429 with Retry-After", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		}},
		{"dropped connection", func(w http.ResponseWriter) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		for _, op := range []string{"Size", "ReadAt"} {
			t.Run(tc.name+"/"+op, func(t *testing.T) {
				h := &counted{h: func(w http.ResponseWriter, r *http.Request, attempt int64) {
					if attempt <= 2 {
						tc.fail(w)
						return
					}
					serveBytes(content).ServeHTTP(w, r)
				}}
				var logs bytes.Buffer
				logger := slog.New(slog.NewTextHandler(&logs, nil))
				s, _ := newSource(t, h, append(fastRetries(3), WithLogger(logger))...)
				switch op {
				case "Size":
					size, err := s.Size(context.Background())
					if err != nil || size != int64(len(content)) {
						t.Fatalf("Size = %d, %v", size, err)
					}
				case "ReadAt":
					p := make([]byte, 5)
					if err := s.ReadAt(context.Background(), p, 3); err != nil || string(p) != "34567" {
						t.Fatalf("ReadAt = %q, %v", p, err)
					}
				}
				if got := h.n.Load(); got != 3 {
					t.Errorf("%d attempts, want 3", got)
				}
				if got := strings.Count(logs.String(), "retrying HTTP request"); got != 2 {
					t.Errorf("%d retries logged, want 2:\n%s", got, logs.String())
				}
			})
		}
	}
}

func TestHTTPSourceGivesUp(t *testing.T) {
	h := &counted{h: func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.WriteHeader(http.StatusBadGateway)
	}}
	s, _ := newSource(t, h, fastRetries(2)...)
	err := s.ReadAt(context.Background(), make([]byte, 4), 0)
	if err == nil {
		t.Fatal("no error")
	}
	if got := h.n.Load(); got != 3 {
		t.Errorf("%d attempts, want 3", got)
	}
	for _, want := range []string{"giving up after 3 attempts", "502 Bad Gateway", "read bytes [0, 4)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestHTTPSourceDoesNotRetryClientErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   error // nil: not ErrNotFound
		msg    string
	}{
		{http.StatusNotFound, ErrNotFound, "404 Not Found"},
		{http.StatusGone, ErrNotFound, "410 Gone"},
		{http.StatusForbidden, nil, "403 Forbidden"},
		{http.StatusUnauthorized, nil, "401 Unauthorized"},
		{http.StatusBadRequest, nil, "400 Bad Request"},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			h := &counted{h: func(w http.ResponseWriter, r *http.Request, _ int64) {
				http.Error(w, "no", tc.status)
			}}
			srv := httptest.NewServer(h)
			defer srv.Close()
			// Open goes through Size; ReadAt is checked on its own below.
			_, err := Open(context.Background(), srv.URL+"/missing.bin?sig=secret", 2, 8, append(fastRetries(5), noKeepAlives(t))...)
			if err == nil {
				t.Fatal("no error")
			}
			if got := h.n.Load(); got != 1 {
				t.Errorf("%d attempts, want exactly 1", got)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if tc.want == nil && errors.Is(err, ErrNotFound) {
				t.Errorf("%d reported as not found", tc.status)
			}
			for _, want := range []string{tc.msg, "/missing.bin"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q leaks the query string", err)
			}

			s, err := NewHTTPSource(srv.URL+"/missing.bin", append(fastRetries(5), noKeepAlives(t))...)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.ReadAt(context.Background(), make([]byte, 4), 0); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("ReadAt: err = %v", err)
			}
			if got := h.n.Load(); got != 2 {
				t.Errorf("%d attempts after ReadAt, want 2", got)
			}
		})
	}
}

func TestHTTPSourceRejectsServerIgnoringRange(t *testing.T) {
	content := bytes.Repeat([]byte("ab"), 100)
	h := &counted{h: func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Write(content) // 200 and the whole file, whatever the Range header says
	}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	_, err := Open(context.Background(), srv.URL+"/t.bin", 2, 8, append(fastRetries(5), noKeepAlives(t))...)
	if !errors.Is(err, ErrRangeIgnored) {
		t.Fatalf("err = %v, want ErrRangeIgnored", err)
	}
	if got := h.n.Load(); got != 1 {
		t.Errorf("%d attempts, want 1", got)
	}
	s, err := NewHTTPSource(srv.URL+"/t.bin", noKeepAlives(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReadAt(context.Background(), make([]byte, 16), 32); !errors.Is(err, ErrRangeIgnored) {
		t.Fatalf("ReadAt: err = %v, want ErrRangeIgnored", err)
	}
}

// shrinkable serves content that a test can replace.
type shrinkable struct {
	mu      sync.Mutex
	content []byte
}

func (s *shrinkable) set(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.content = b
}

func (s *shrinkable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	content := s.content
	s.mu.Unlock()
	serveBytes(content).ServeHTTP(w, r)
}

func TestHTTPSourceTruncatedFile(t *testing.T) {
	tokens := countingTokens(100)
	full, _ := EncodeTokens(nil, tokens, 2)
	srv := &shrinkable{content: full}
	s, _ := newSource(t, srv, fastRetries(2)...)
	p, err := NewProvider(context.Background(), s, 2, 9)
	if err != nil {
		t.Fatal(err)
	}
	last := p.NumSequences() - 1 // tokens [90, 100): bytes [180, 200)
	srv.set(full[:150])
	for _, tc := range []struct {
		name string
		d    uint64
		want error
	}{
		{"range past the new end", last, ErrShortRead}, // 416
		{"range across the new end", 8, ErrShortRead},  // bytes [144, 164): a 206 for [144, 149]
		{"range before the new end", 0, ErrChanged},    // right bytes, wrong total
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Sequence(context.Background(), tc.d, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	// The provider's known size stops a read past it without a request.
	if err := s.ReadAt(context.Background(), make([]byte, 4), 198); !errors.Is(err, ErrShortRead) {
		t.Errorf("read past the known size: %v", err)
	}
}

// partial is a table case's server answering 206 with the Content-Range and
// body given: the short-body cases differ only in those two.
func partial(contentRange string, body []byte) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Range", contentRange)
		w.WriteHeader(http.StatusPartialContent)
		w.Write(body)
	}
}

func TestHTTPSourceShortBodies(t *testing.T) {
	content := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name     string
		handler  func(w http.ResponseWriter, r *http.Request)
		attempts int64
		want     error // nil: any error
		msg      string
	}{
		{"body cut off", func(w http.ResponseWriter, r *http.Request) {
			// Promise 8 bytes, send 3: the server then drops the connection.
			w.Header().Set("Content-Range", "bytes 4-11/16")
			w.Header().Set("Content-Length", "8")
			w.WriteHeader(http.StatusPartialContent)
			w.Write(content[4:7])
		}, 3, ErrShortRead, "giving up after 3 attempts"},
		{"shorter range than asked", partial("bytes 4-7/*", content[4:8]), 1, ErrShortRead, "only bytes 4-7"},
		{"file shorter than the range", partial("bytes 4-9/10", content[4:10]), 1, ErrShortRead, "the file has 10 bytes"},
		{"not satisfiable", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes */3")
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
		}, 1, ErrShortRead, "the file has 3 bytes"},
		{"other range", partial("bytes 0-7/16", content[:8]), 1, nil, "sent bytes 0-7 instead"},
		{"malformed Content-Range", partial("4-11", content[4:12]), 1, nil, "malformed Content-Range"},
		{"gzip", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Range", "bytes 4-11/16")
			w.WriteHeader(http.StatusPartialContent)
			w.Write(content[4:12])
		}, 1, nil, `"gzip"-encoded`},
		{"not modified", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotModified)
		}, 1, nil, "304 Not Modified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &counted{h: func(w http.ResponseWriter, r *http.Request, _ int64) {
				if got := r.Header.Get("Range"); got != "bytes=4-11" {
					t.Errorf("Range %q", got)
				}
				tc.handler(w, r)
			}}
			s, _ := newSource(t, h, fastRetries(2)...)
			err := s.ReadAt(context.Background(), make([]byte, 8), 4)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q lacks %q", err, tc.msg)
			}
			if strings.Count(err.Error(), "data: ") != 1 || !strings.HasPrefix(err.Error(), "data: ") {
				t.Errorf("error %q should carry the package prefix once", err)
			}
			if got := h.n.Load(); got != tc.attempts {
				t.Errorf("%d attempts, want %d", got, tc.attempts)
			}
		})
	}
}

func TestHTTPSourceSizeOfEmptyFile(t *testing.T) {
	s, _ := newSource(t, serveBytes(nil))
	size, err := s.Size(context.Background())
	if err != nil || size != 0 {
		t.Fatalf("Size = %d, %v", size, err)
	}
}

func TestHTTPSourceContextStopsRetries(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(w http.ResponseWriter, r *http.Request)
	}{
		{"while waiting to retry", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
		{"during a request", func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // hang until the client gives up
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{}, 16)
			h := &counted{h: func(w http.ResponseWriter, r *http.Request, _ int64) {
				arrived <- struct{}{}
				tc.fail(w, r)
			}}
			// An hour of backoff: returning at all proves ctx cut it short.
			s, _ := newSource(t, h, WithRetries(100), WithBackoff(time.Hour, time.Hour), WithRequestTimeout(0))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.ReadAt(ctx, make([]byte, 4), 0) }()
			<-arrived
			cancel()
			err := <-done
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if got := h.n.Load(); got != 1 {
				t.Errorf("%d attempts, want 1", got)
			}
		})
	}
}

func TestHTTPSourceRetriesAttemptsThatTimeOut(t *testing.T) {
	content := []byte("0123456789abcdef")
	h := &counted{h: func(w http.ResponseWriter, r *http.Request, attempt int64) {
		if attempt == 1 {
			<-r.Context().Done() // stall until the attempt times out
			return
		}
		serveBytes(content).ServeHTTP(w, r)
	}}
	s, _ := newSource(t, h, append(fastRetries(2), WithRequestTimeout(300*time.Millisecond))...)
	p := make([]byte, 4)
	if err := s.ReadAt(context.Background(), p, 8); err != nil || string(p) != "89ab" {
		t.Fatalf("ReadAt = %q, %v", p, err)
	}
	if got := h.n.Load(); got != 2 {
		t.Errorf("%d attempts, want 2", got)
	}
}

func TestHTTPSourceHidesCredentials(t *testing.T) {
	s, err := NewHTTPSource("https://user:hunter2@example.com/data/tokens.bin?X-Amz-Signature=secret")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); got != "https://example.com/data/tokens.bin?…" {
		t.Errorf("String() = %q", got)
	}
	for _, bad := range []string{"ftp://example.com/x", "http://[::1", "/just/a/path"} {
		if _, err := NewHTTPSource(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseContentRange(t *testing.T) {
	for _, tc := range []struct {
		h                  string
		first, last, total int64
		ok                 bool
	}{
		{"bytes 0-0/1", 0, 0, 1, true},
		{"bytes 10-19/100", 10, 19, 100, true},
		{"bytes 10-19/*", 10, 19, -1, true},
		{"bytes 10-19/19", 0, 0, 0, false}, // last must be below total
		{"bytes 19-10/100", 0, 0, 0, false},
		{"bytes -1-10/100", 0, 0, 0, false},
		{"bytes */100", 0, 0, 0, false},
		{"items 0-1/2", 0, 0, 0, false},
		{"bytes 0-1", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	} {
		first, last, total, err := parseContentRange(tc.h)
		if (err == nil) != tc.ok || first != tc.first || last != tc.last || total != tc.total {
			t.Errorf("%q: %d %d %d %v", tc.h, first, last, total, err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		h    string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-3", 0},
		{"7", 7 * time.Second},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{"soon", 0},
	} {
		if got := parseRetryAfter(tc.h, now); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.h, got, tc.want)
		}
	}
}

func TestBackoffIsBounded(t *testing.T) {
	s, err := NewHTTPSource("http://example.com/x", WithBackoff(10*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for try, wantMax := range []time.Duration{10, 20, 40, 80, 160, 320, 640, 1000, 1000} {
		wantMax *= time.Millisecond
		for range 20 {
			if d := s.backoff(try, 0); d < wantMax/2 || d > wantMax {
				t.Fatalf("try %d: %v not in [%v, %v]", try, d, wantMax/2, wantMax)
			}
		}
	}
	if d := s.backoff(1000, 0); d < 500*time.Millisecond || d > time.Second {
		t.Errorf("try 1000: %v", d)
	}
	if d := s.backoff(0, 500*time.Millisecond); d != 500*time.Millisecond {
		t.Errorf("Retry-After 500ms: %v", d)
	}
	if d := s.backoff(0, time.Hour); d != time.Second {
		t.Errorf("Retry-After is not capped: %v", d)
	}
}

// TestHTTPSourceRetriesUntilTheDeadline: under RetryUntil, a transient
// failure is retried past the retry count for as long as the next attempt
// starts before the deadline; a permanent one is not retried at all; and
// past the deadline, the count holds again.
func TestHTTPSourceRetriesUntilTheDeadline(t *testing.T) {
	content := []byte("0123456789abcdef")
	far := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name     string
		until    *time.Time // nil: no RetryUntil
		status   int        // what the first 5 attempts get
		attempts int64
		ok       bool
	}{
		{"429 until the deadline", &far, http.StatusTooManyRequests, 6, true},
		{"503 until the deadline", &far, http.StatusServiceUnavailable, 6, true},
		{"404 is not retried", &far, http.StatusNotFound, 1, false},
		{"no deadline: the count", nil, http.StatusTooManyRequests, 2, false},
		{"a deadline passed: the count", new(time.Now()), http.StatusTooManyRequests, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &counted{h: func(w http.ResponseWriter, r *http.Request, attempt int64) {
				if attempt <= 5 {
					w.WriteHeader(tc.status)
					return
				}
				serveBytes(content).ServeHTTP(w, r)
			}}
			s, _ := newSource(t, h, fastRetries(1)...)
			ctx := context.Background()
			if tc.until != nil {
				ctx = RetryUntil(ctx, *tc.until)
			}
			p := make([]byte, 5)
			err := s.ReadAt(ctx, p, 3)
			if got := h.n.Load(); got != tc.attempts {
				t.Errorf("%d attempts, want %d", got, tc.attempts)
			}
			if tc.ok != (err == nil) {
				t.Fatalf("ReadAt: %v", err)
			}
			if !tc.ok && Transient(err) == (tc.status == http.StatusNotFound) {
				t.Errorf("Transient(%v) = %v", err, Transient(err))
			}
		})
	}
}
