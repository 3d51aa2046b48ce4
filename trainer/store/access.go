package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
)

// Where a trainer's credentials may go. The run file's endpoint is chosen by
// whoever created the run, so it is not trusted with them: a trainer names
// the one endpoint its credentials are for (Access.Endpoint, from
// PSYCHE_STORE_ENDPOINT or `psyche join --store-endpoint`), and a run's store
// at any other endpoint is talked to anonymously. The rules, enforced by
// Open and again on every connection (a name can resolve to another address
// later):
//
//   - credentials (the environment's keys, a session token, a role's, or
//     WithStaticCredentials) are signed into requests only when the run's
//     endpoint is the trainer's named one;
//   - plain http only to the named endpoint on this machine's loopback, or
//     with Access.AllowHTTP (PSYCHE_STORE_ALLOW_HTTP=1, --store-allow-http);
//   - an endpoint the trainer did not name may not be this machine or its
//     networks: loopback, private (RFC 1918, fc00::/7), link-local (and so
//     the cloud metadata service at 169.254.169.254), shared (100.64.0.0/10),
//     unspecified, multicast or broadcast addresses are refused
//     (ErrEndpoint), so a run cannot point a trainer's uploads at services
//     beside it.

// Environment variables a trainer names its store with (cmd/psyche's join
// flags --store-endpoint and --store-allow-http read the same).
const (
	EnvEndpoint  = "PSYCHE_STORE_ENDPOINT"
	EnvAllowHTTP = "PSYCHE_STORE_ALLOW_HTTP"
)

// AWSEndpoint is the endpoint of a run file that names none (AWS S3): a
// trainer names it to send its AWS credentials there.
const AWSEndpoint = "https://s3.amazonaws.com"

// ErrEndpoint: the run's endpoint is refused by this trainer's rules (above).
var ErrEndpoint = errors.New("store: endpoint refused")

// Access is what the trainer itself says about stores; the run file cannot
// change it.
type Access struct {
	// Endpoint is the store endpoint (http(s)://host[:port]; AWSEndpoint for
	// AWS S3) this trainer's credentials are for. Empty: every store is
	// talked to anonymously.
	Endpoint string
	// AllowHTTP allows plain http to endpoints that are not this machine's
	// loopback (the named endpoint's requests then carry the credentials
	// in the clear: a signature, the access key id and any session token).
	AllowHTTP bool
}

// Check says whether the settings can be used (an endpoint must be
// http(s)://host[:port]).
func (a Access) Check() error {
	if a.Endpoint == "" {
		return nil
	}
	_, err := parseEndpoint(a.Endpoint, EnvEndpoint+" (--store-endpoint)")
	return err
}

// AccessFromEnv reads PSYCHE_STORE_ENDPOINT and PSYCHE_STORE_ALLOW_HTTP
// (1/true). Open uses it when no WithAccess is given.
func AccessFromEnv() Access {
	allow, _ := strconv.ParseBool(os.Getenv(EnvAllowHTTP))
	return Access{Endpoint: os.Getenv(EnvEndpoint), AllowHTTP: allow}
}

// WithAccess sets the trainer's own store settings instead of the
// environment's (AccessFromEnv).
func WithAccess(a Access) Option {
	return func(o *options) error { o.access = &a; return nil }
}

// endpoint is an endpoint setting read: scheme and host[:port], the port
// left out when it is the scheme's default, so that two spellings of one
// endpoint compare equal.
type endpoint struct {
	secure bool
	host   string // as minio dials it: host or host:port
}

func (e endpoint) String() string {
	if e.secure {
		return "https://" + e.host
	}
	return "http://" + e.host
}

func parseEndpoint(s, setting string) (endpoint, error) {
	if s == "" {
		return endpoint{secure: true, host: "s3.amazonaws.com"}, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return endpoint{}, fmt.Errorf("%w: %s %q: want http(s)://host[:port]", ErrSetting, setting, s)
	}
	e := endpoint{secure: u.Scheme == "https", host: strings.ToLower(u.Host)}
	if p := u.Port(); (e.secure && p == "443") || (!e.secure && p == "80") {
		e.host = strings.ToLower(u.Hostname())
		if strings.Contains(e.host, ":") {
			e.host = "[" + e.host + "]"
		}
	}
	return e, nil
}

// hostIP is the endpoint's host as an address, if it is written as one.
func (e endpoint) hostIP() (netip.Addr, bool) {
	h := e.host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	a, err := netip.ParseAddr(strings.Trim(h, "[]"))
	return a.Unmap(), err == nil
}

// localAddr says whether a is this machine or its networks: an address a
// run's endpoint may not have unless the trainer named it.
func localAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() ||
		shared.Contains(a) || thisNet.Contains(a) || a == broadcast
}

var (
	shared    = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT, and overlay networks (Tailscale)
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	broadcast = netip.MustParseAddr("255.255.255.255")
)

// dialRule is what a connection's address must be.
type dialRule int

const (
	anyAddr      dialRule = iota // the trainer's named endpoint, over https or allowed http
	loopbackOnly                 // the named endpoint over plain http, not allowed elsewhere
	publicOnly                   // a run's endpoint the trainer did not name
)

func (r dialRule) check(a netip.Addr, what string) error {
	a = a.Unmap()
	switch r {
	case loopbackOnly:
		if !a.IsLoopback() {
			return fmt.Errorf("%w: %s resolves to %s, not this machine's loopback, and plain http elsewhere needs %s=1 (--store-allow-http)",
				ErrEndpoint, what, a, EnvAllowHTTP)
		}
	case publicOnly:
		if localAddr(a) {
			return fmt.Errorf("%w: the run's endpoint %s resolves to %s, on this machine or its local networks, and this trainer did not name it (%s, --store-endpoint)",
				ErrEndpoint, what, a, EnvEndpoint)
		}
	}
	return nil
}

// refuseKey holds, in a request's context, the operation's cancel function:
// a refused connection ends the whole operation at once instead of being
// retried as a network error.
type refuseKey struct{}

// begin starts a public operation: its context can be ended by a refused
// connection.
func begin(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, refuseKey{}, cancel), cancel
}

// finish returns the refusal that ended an operation rather than the
// cancellation it shows up as.
func finish(ctx context.Context, err error) error {
	if err != nil {
		if c := context.Cause(ctx); errors.Is(c, ErrEndpoint) {
			return c
		}
	}
	return err
}

func refuse(ctx context.Context, err error) error {
	if cancel, ok := ctx.Value(refuseKey{}).(context.CancelCauseFunc); ok {
		cancel(err)
	}
	return err
}

// guardedTransport is minio's default transport whose connections are
// checked against rule at the address actually dialed; through a proxy
// (the trainer's HTTPS_PROXY and the like), the endpoint's name is resolved
// and checked before the request instead, and the proxy, which the trainer
// chose, is not.
func guardedTransport(e endpoint, rule dialRule, proxy func(*http.Request) (*url.URL, error)) (http.RoundTripper, error) {
	tr, err := minio.DefaultTransport(e.secure)
	if err != nil {
		return nil, err
	}
	what := e.String()
	if proxy == nil {
		proxy = tr.Proxy
	}
	tr.Proxy = proxy
	proxied := tr.Clone()
	tr.Proxy = nil
	if rule != anyAddr {
		tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
			ControlContext: func(ctx context.Context, _, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return refuse(ctx, fmt.Errorf("%w: %s: cannot read the address %q", ErrEndpoint, what, address))
				}
				if err := rule.check(ap.Addr(), what); err != nil {
					return refuse(ctx, err)
				}
				return nil
			}}).DialContext
	}
	return &guard{tr: tr, proxied: proxied, rule: rule, what: what, proxy: proxy}, nil
}

type guard struct {
	tr      *http.Transport // no proxy; dials checked
	proxied *http.Transport // through the environment's proxy
	proxy   func(*http.Request) (*url.URL, error)
	rule    dialRule
	what    string
}

func (g *guard) RoundTrip(r *http.Request) (*http.Response, error) {
	if g.proxy == nil {
		return g.tr.RoundTrip(r)
	}
	p, err := g.proxy(r)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return g.tr.RoundTrip(r)
	}
	if g.rule != anyAddr {
		addrs, err := net.DefaultResolver.LookupNetIP(r.Context(), "ip", r.URL.Hostname())
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if err := g.rule.check(a, g.what); err != nil {
				return nil, refuse(r.Context(), err)
			}
		}
	}
	return g.proxied.RoundTrip(r)
}

// pageBytes is what a listing page may take per entry asked for (MaxKeys:
// WithMaxObjects+1, at most 1,000): an entry of a checkpoint's listing, its
// short key and S3's fields, is 300-400 bytes of XML. A page is read only up
// to that many bytes (at least 64 KiB; 512 KiB by default) and refused past
// it before minio decodes it: a decoded entry of a lying page takes up to 30
// times its XML on the heap, which this keeps to about 15 MiB.
const pageBytes = 512

func maxPage(maxObjects int) int64 { return max(64<<10, int64(min(maxObjects+1, 1000))*pageBytes) }

// bounded limits the bodies of bucket-level answers (listings, the bucket's
// location), which minio decodes whole, to max bytes; objects' bodies are
// read by the caller into buffers of the listed size.
type bounded struct {
	next http.RoundTripper
	max  int64
}

func (b bounded) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	q := r.URL.Query()
	for _, k := range []string{"list-type", "location", "uploads", "versions", "delimiter", "prefix", "marker", "continuation-token"} {
		if q.Has(k) {
			resp.Body = &limitedBody{rc: resp.Body, left: b.max, max: b.max}
			break
		}
	}
	return resp, nil
}

type limitedBody struct {
	rc        io.ReadCloser
	left, max int64
}

// tooLong is a listing page (or the bucket's location) longer than max.
type tooLong struct{ max int64 }

func (e tooLong) Error() string {
	return fmt.Sprintf("an answer of the store (a listing page) is longer than %d bytes", e.max)
}
func (e tooLong) Is(target error) bool { return target == ErrListing }

// ErrListing: the store's listing was refused (see Download).
var ErrListing = errors.New("store: listing refused")

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more tells a page of exactly maxPage from a longer one.
		var one [1]byte
		n, err := l.rc.Read(one[:])
		if n > 0 {
			return 0, tooLong{l.max}
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.rc.Close() }
