package data

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HTTPSource is a Source reading an HTTP(S) URL with one ranged GET per read.
// The server must support range requests (see ErrRangeIgnored). Transient
// failures are retried as configured by WithRetries, WithBackoff and
// WithRequestTimeout.
type HTTPSource struct {
	url string
	// display is the URL without user info or query, for errors and logs:
	// signed URLs carry their credentials in the query.
	display string
	cfg     *config

	mu   sync.Mutex
	size int64 // -1 until Size succeeds
}

var _ Source = (*HTTPSource)(nil)

// NewHTTPSource returns a source for an http:// or https:// URL. It makes no
// request: Size and ReadAt do.
func NewHTTPSource(rawURL string, opts ...Option) (*HTTPSource, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newHTTPSource(rawURL, cfg)
}

func newHTTPSource(rawURL string, cfg *config) (*HTTPSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, credentials and all
		}
		return nil, fmt.Errorf("data: bad URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("data: bad URL: scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("data: bad URL: no host")
	}
	display := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	if u.RawQuery != "" {
		display += "?…"
	}
	return &HTTPSource{url: rawURL, display: display, cfg: cfg, size: -1}, nil
}

// String returns the URL without user info or query string.
func (s *HTTPSource) String() string { return s.display }

// Close releases nothing: connections belong to the HTTP client, which may
// be shared (WithHTTPClient).
func (s *HTTPSource) Close() error { return nil }

// Size learns the file's length from a "Range: bytes=0-0" GET, which also
// proves that the server honours ranges before any sequence is read. The
// answer is cached.
func (s *HTTPSource) Size(ctx context.Context) (int64, error) {
	if size := s.knownSize(); size >= 0 {
		return size, nil
	}
	var size int64
	err := s.retry(ctx, "get the size of", func(ctx context.Context) error {
		resp, err := s.get(ctx, 0, 0)
		if err != nil {
			return err
		}
		defer drainClose(resp)
		switch resp.StatusCode {
		case http.StatusPartialContent:
			_, _, total, err := servedRange(resp)
			if err != nil {
				return err
			}
			if total < 0 {
				return errors.New("the server did not report the file's size (Content-Range total is *)")
			}
			size = total
			return nil
		case http.StatusRequestedRangeNotSatisfiable:
			// Byte 0 does not exist: the file is empty.
			total, ok := parseUnsatisfiedRange(resp.Header.Get("Content-Range"))
			if !ok {
				return fmt.Errorf("the server answered %s without the file's size", resp.Status)
			}
			size = total
			return nil
		case http.StatusOK:
			if resp.ContentLength == 0 {
				size = 0 // an empty file has no range to serve
				return nil
			}
		}
		return statusError(resp)
	})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.size = size
	s.mu.Unlock()
	s.cfg.logger.Debug("data: remote token file", "url", s.display, "bytes", size)
	return size, nil
}

func (s *HTTPSource) knownSize() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// ReadAt fills p with the bytes at off using one ranged GET (retried on
// transient failures). Once Size has succeeded, a read past the end fails
// without a request and a response reporting another size fails with
// ErrChanged.
func (s *HTTPSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	if off < 0 {
		return fmt.Errorf("data: read %s: negative offset %d", s.display, off)
	}
	if len(p) == 0 {
		return nil
	}
	end := off + int64(len(p))
	known := s.knownSize()
	if known >= 0 && end > known {
		return fmt.Errorf("%w: %s: wanted bytes [%d, %d) but the file has %d", ErrShortRead, s.display, off, end, known)
	}
	what := fmt.Sprintf("read bytes [%d, %d) of", off, end)
	return s.retry(ctx, what, func(ctx context.Context) error {
		resp, err := s.get(ctx, off, end-1)
		if err != nil {
			return err
		}
		defer drainClose(resp)
		switch resp.StatusCode {
		case http.StatusPartialContent:
			first, last, total, err := servedRange(resp)
			if err != nil {
				return err
			}
			if total >= 0 && total < end {
				return fmt.Errorf("%w: the file has %d bytes", ErrShortRead, total)
			}
			if first != off || last != end-1 {
				if first == off && last < end-1 {
					return fmt.Errorf("%w: the server sent only bytes %d-%d", ErrShortRead, first, last)
				}
				return fmt.Errorf("the server sent bytes %d-%d instead", first, last)
			}
			if known >= 0 && total >= 0 && total != known {
				return fmt.Errorf("%w: it had %d bytes and now has %d", ErrChanged, known, total)
			}
			if n, err := io.ReadFull(resp.Body, p); err != nil {
				// Most often a dropped connection: worth another try.
				return &transientError{err: fmt.Errorf("%w: the response ended after %d of %d bytes: %w", ErrShortRead, n, len(p), err)}
			}
			return nil
		case http.StatusRequestedRangeNotSatisfiable:
			if total, ok := parseUnsatisfiedRange(resp.Header.Get("Content-Range")); ok {
				return fmt.Errorf("%w: the file has %d bytes", ErrShortRead, total)
			}
			return fmt.Errorf("%w: the server answered %s", ErrShortRead, resp.Status)
		}
		return statusError(resp)
	})
}

// get sends one GET for the inclusive byte range [first, last]. A transport
// failure comes back as a transientError.
func (s *HTTPSource) get(ctx context.Context, first, last int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", first, last))
	// Ranges of a compressed response would be ranges of the compressed
	// stream, so ask for the bytes as stored.
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", "psyche-data")
	resp, err := s.cfg.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, query and all
		}
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			return nil, err // a bad certificate stays bad
		}
		return nil, &transientError{err: err}
	}
	return resp, nil
}

// transientError marks a failure worth retrying.
type transientError struct {
	err        error
	retryAfter time.Duration // the server's Retry-After; 0 when absent
}

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// retry runs attempt until it succeeds, fails with an error that is not a
// transientError, runs out of retries, or ctx ends. Errors name what was
// being done and the URL.
func (s *HTTPSource) retry(ctx context.Context, what string, attempt func(context.Context) error) error {
	for try := 0; ; try++ {
		err := s.runAttempt(ctx, attempt)
		if err == nil {
			return nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			if !errors.Is(err, ctxErr) {
				err = fmt.Errorf("%w (last error: %v)", ctxErr, err)
			}
			return wrapf(err, "%s %s", what, s.display)
		}
		var te *transientError
		if !errors.As(err, &te) {
			return wrapf(err, "%s %s", what, s.display)
		}
		wait := s.backoff(try, te.retryAfter)
		if try >= s.cfg.retries {
			until, ok := ctx.Value(retryUntilKey{}).(time.Time)
			if !ok {
				return wrapf(err, "%s %s: giving up after %d attempts", what, s.display, try+1)
			}
			if time.Now().Add(wait).After(until) {
				return wrapf(err, "%s %s: giving up after %d attempts: no time to try again before %s", what, s.display, try+1,
					until.Format(time.TimeOnly))
			}
		}
		s.cfg.logger.Warn("data: retrying HTTP request", "url", s.display, "op", what,
			"attempt", try+1, "wait", wait, "err", err)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return wrapf(fmt.Errorf("%w (while waiting to retry after: %v)", ctx.Err(), err), "%s %s", what, s.display)
		case <-timer.C:
		}
	}
}

type retryUntilKey struct{}

// RetryUntil is ctx under which an HTTP source (and so a Provider or
// ReadAhead reading one) retries a transient failure past its retry count
// (WithRetries), with the same backoff, for as long as the next attempt
// starts before t: a trainer reads its round's batch until the round's
// training time ends, through a server that answers 429 under load, and
// only then sits the round out. The attempt in flight is not cut at t
// (ctx's own deadline, if any, does that).
func RetryUntil(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, retryUntilKey{}, t)
}

// Transient says whether err is a failure that another try may not meet
// (a 429 or 5xx answer, a dropped or refused connection, an attempt that
// timed out), as opposed to one that every try meets (ErrNotFound, a
// file of the wrong format or size).
func Transient(err error) bool {
	var te *transientError
	return errors.As(err, &te)
}

// runAttempt runs one attempt under the per-request timeout. Running out of
// that time (but not out of ctx) is a transient failure.
func (s *HTTPSource) runAttempt(ctx context.Context, attempt func(context.Context) error) error {
	if s.cfg.requestTimeout <= 0 {
		return attempt(ctx)
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout)
	defer cancel()
	err := attempt(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return &transientError{err: fmt.Errorf("attempt timed out after %v: %w", s.cfg.requestTimeout, err)}
	}
	return err
}

// backoff is the wait before retry number try (from 0): base·2^try capped at
// max, jittered to [d/2, d] so that many trainers hitting one failing server
// spread out, and at least the server's Retry-After (itself capped at max).
func (s *HTTPSource) backoff(try int, retryAfter time.Duration) time.Duration {
	d := s.cfg.backoffBase
	for i := 0; i < try && d < s.cfg.backoffMax; i++ {
		d = min(d, s.cfg.backoffMax/2) * 2 // min first: no overflow
	}
	d = min(d, s.cfg.backoffMax)
	d = d/2 + rand.N(d/2+1)
	if retryAfter > d {
		d = min(retryAfter, s.cfg.backoffMax)
	}
	return d
}

// statusError turns a response that a range request cannot use into an
// error: 404/410 are ErrNotFound, 429 and 5xx are transient, a 200 means the
// server ignored the Range header, anything else fails for good.
func statusError(resp *http.Response) error {
	switch code := resp.StatusCode; {
	case code == http.StatusNotFound || code == http.StatusGone:
		return fmt.Errorf("%w: the server answered %s", ErrNotFound, resp.Status)
	case code == http.StatusTooManyRequests || code >= 500:
		return &transientError{
			err:        fmt.Errorf("the server answered %s", resp.Status),
			retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
		}
	case code == http.StatusOK:
		return fmt.Errorf("%w: a ranged GET got %s with the whole file", ErrRangeIgnored, resp.Status)
	default:
		return fmt.Errorf("unexpected HTTP status %s", resp.Status)
	}
}

// servedRange is the range a 206 answer holds: its Content-Range, once the
// body is known to be the file's own bytes (checkIdentity).
func servedRange(resp *http.Response) (first, last, total int64, err error) {
	if err := checkIdentity(resp); err != nil {
		return 0, 0, 0, err
	}
	return parseContentRange(resp.Header.Get("Content-Range"))
}

// checkIdentity rejects a response whose body is encoded (say gzip): its
// byte ranges would not be the file's.
func checkIdentity(resp *http.Response) error {
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return fmt.Errorf("the server sent a %q-encoded range; token files must be served as stored", enc)
	}
	return nil
}

// drainClose reads a little of what is left of the body, so a small
// response's connection can be reused, and closes it.
func drainClose(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// parseContentRange parses "bytes first-last/total"; total is -1 for "*".
func parseContentRange(h string) (first, last, total int64, err error) {
	bad := fmt.Errorf("the server sent a malformed Content-Range %q", h)
	spec, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, 0, 0, bad
	}
	rng, tot, ok := strings.Cut(spec, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil || first < 0 {
		return 0, 0, 0, bad
	}
	if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
		return 0, 0, 0, bad
	}
	if tot == "*" {
		return first, last, -1, nil
	}
	if total, err = strconv.ParseInt(tot, 10, 64); err != nil || total <= last {
		return 0, 0, 0, bad
	}
	return first, last, total, nil
}

// parseUnsatisfiedRange parses the "bytes */total" of a 416 response.
func parseUnsatisfiedRange(h string) (int64, bool) {
	tot, ok := strings.CutPrefix(h, "bytes */")
	if !ok {
		return 0, false
	}
	total, err := strconv.ParseInt(tot, 10, 64)
	return total, err == nil && total >= 0
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
func parseRetryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(h, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, 1<<30)) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
