// Package store moves checkpoints to and from the S3-compatible bucket a run
// names (coordinator.CheckpointStore): elected checkpointers upload the
// checkpoint directory with multipart uploads and read it back before the
// run records it; trainers download a recorded s3:// checkpoint with
// parallel range requests into a local directory they then load and offer.
//
// It talks S3 through minio-go (v7): one small module that speaks the S3 API
// of AWS, Google Cloud Storage's XML API, Cloudflare R2, MinIO and other
// compatible services, with AWS's standard credential sources, where the AWS
// SDK would bring a module per service and a second HTTP stack.
package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/psyche-go/psyche/coordinator"
)

// Config is where a run's checkpoints go: the account's CheckpointStore as
// text.
type Config struct {
	URL      string // s3://bucket or s3://bucket/prefix
	Endpoint string // http(s)://host[:port]; empty: AWS S3
	Region   string // empty: the service's default
}

// FromRun reads a run's store settings.
func FromRun(s coordinator.CheckpointStore) Config {
	return Config{URL: coordinator.FixedString(s.URL[:]), Endpoint: coordinator.FixedString(s.Endpoint[:]),
		Region: coordinator.FixedString(s.Region[:])}
}

// IsZero says whether the run names no store.
func (c Config) IsZero() bool { return c.URL == "" }

// Errors a caller can tell apart.
var (
	// ErrSetting wraps a store setting that cannot be used as written.
	ErrSetting = errors.New("store: bad setting")
	// ErrNoBucket: the bucket does not exist at the endpoint.
	ErrNoBucket = errors.New("store: no such bucket")
	// ErrCredentials: the service refused this trainer's credentials.
	ErrCredentials = errors.New("store: credentials refused")
	// ErrVerify: what was read back is not what was uploaded.
	ErrVerify = errors.New("store: read-back does not match")
	// ErrTooLarge: a checkpoint holds more bytes than the caller accepts.
	ErrTooLarge = errors.New("store: checkpoint larger than the run's model")
)

type options struct {
	log         *slog.Logger
	creds       *credentials.Credentials
	access      *Access
	transport   http.RoundTripper
	partSize    uint64
	parallel    int
	rangeSize   int64
	maxObjects  int
	listTimeout time.Duration
	// Tests: let a run's endpoint be on this machine (the lying servers
	// of the tests listen on 127.0.0.1), and replace the environment's
	// proxy.
	allowLocal bool
	proxy      func(*http.Request) (*url.URL, error)
}

// Option configures a Store.
type Option func(*options) error

// WithLogger logs uploads and downloads (progress, sizes, rates).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error { o.log = l; return nil }
}

// WithStaticCredentials uses these keys instead of the environment's (for
// the trainer's named endpoint only, as those: see Access).
func WithStaticCredentials(accessKey, secretKey string) Option {
	return func(o *options) error {
		o.creds = credentials.NewStaticV4(accessKey, secretKey, "")
		return nil
	}
}

// WithPartSize sets the multipart upload's part size (at least 5 MiB, S3's
// smallest part; default 16 MiB). Files smaller than a part go in one PUT.
func WithPartSize(n uint64) Option {
	return func(o *options) error {
		if n < 5<<20 {
			return fmt.Errorf("%w: part size %d is below S3's 5 MiB", ErrSetting, n)
		}
		o.partSize = n
		return nil
	}
}

// WithParallel sets how many parts or ranges move at once (default 4).
func WithParallel(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: parallel %d", ErrSetting, n)
		}
		o.parallel = n
		return nil
	}
}

// WithRangeSize sets the bytes of one range request in a download (default
// 16 MiB).
func WithRangeSize(n int64) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: range size %d", ErrSetting, n)
		}
		o.rangeSize = n
		return nil
	}
}

// WithTransport sets the HTTP transport (tests). It replaces the one that
// checks every connection's address (Access): with it only the endpoint as
// written is checked.
func WithTransport(t http.RoundTripper) Option {
	return func(o *options) error { o.transport = t; return nil }
}

// WithMaxObjects sets how many entries a listing may have (default 1,000, one
// S3 page; a checkpoint directory has a few files, a sharded one tens).
func WithMaxObjects(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: max objects %d", ErrSetting, n)
		}
		o.maxObjects = n
		return nil
	}
}

// WithListTimeout sets how long a listing may take in all (default 1
// minute; a checkpoint's is one page).
func WithListTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: list timeout %v", ErrSetting, d)
		}
		o.listTimeout = d
		return nil
	}
}

// Store is one run's bucket.
type Store struct {
	cfg    Config
	client *minio.Client
	bucket string
	prefix string // no leading or trailing slash; may be empty
	o      options
	where  string // the endpoint, for messages
	// named: the endpoint is the one the trainer named (Access.Endpoint),
	// and its credentials, if any, are sent.
	named bool
}

// Open prepares a client for the store (no request is sent). Credentials
// are sent only when the store's endpoint is the one the trainer named
// (Access, below; WithAccess, or PSYCHE_STORE_ENDPOINT); to any other
// endpoint requests are anonymous (a public bucket can still be read), over
// https unless the trainer allows http, and never to this machine or its
// local networks (ErrEndpoint). To the named endpoint, credentials come from
// WithStaticCredentials or the trainer's environment, in AWS's order:
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE), MinIO's
// MINIO_ACCESS_KEY and MINIO_SECRET_KEY, then the machine's or container's
// role; with none, the requests are anonymous.
func Open(cfg Config, opts ...Option) (*Store, error) {
	o := options{log: slog.New(slog.DiscardHandler), partSize: 16 << 20, parallel: 4, rangeSize: 16 << 20,
		maxObjects: 1000, listTimeout: time.Minute}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	access := AccessFromEnv()
	if o.access != nil {
		access = *o.access
	}
	bucket, prefix, err := splitURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	ep, err := parseEndpoint(cfg.Endpoint, "model.checkpoint.endpoint")
	if err != nil {
		return nil, err
	}
	named := false
	if access.Endpoint != "" {
		mine, err := parseEndpoint(access.Endpoint, EnvEndpoint+" (--store-endpoint)")
		if err != nil {
			return nil, err
		}
		named = mine == ep
	}
	rule, err := endpointRule(ep, named, access, o.allowLocal)
	if err != nil {
		return nil, err
	}
	creds := credentials.New(&credentials.Static{Value: credentials.Value{SignerType: credentials.SignatureAnonymous}})
	if named {
		creds = o.creds
		if creds == nil {
			creds = environmentCredentials()
		}
	}
	transport := o.transport
	if transport == nil {
		if transport, err = guardedTransport(ep, rule, o.proxy); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSetting, err)
		}
	}
	client, err := minio.New(ep.host, &minio.Options{Creds: creds, Secure: ep.secure, Region: cfg.Region,
		Transport: bounded{next: transport, max: maxPage(o.maxObjects)}, BucketLookup: minio.BucketLookupAuto})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetting, err)
	}
	return &Store{cfg: cfg, client: client, bucket: bucket, prefix: prefix, o: o, where: ep.String(), named: named}, nil
}

// endpointRule applies the rules of Access to the run's endpoint as
// written, and says what its connections' addresses must be.
func endpointRule(ep endpoint, named bool, a Access, allowLocal bool) (dialRule, error) {
	ip, isIP := ep.hostIP()
	if !named {
		if !ep.secure && !a.AllowHTTP {
			return 0, fmt.Errorf("%w: the run's endpoint %s is plain http, which this trainer sends nothing over unless it names the endpoint (%s, --store-endpoint) on its own loopback or allows http (%s=1, --store-allow-http)",
				ErrEndpoint, ep, EnvEndpoint, EnvAllowHTTP)
		}
		if allowLocal {
			return anyAddr, nil
		}
		if isIP && localAddr(ip) {
			return 0, fmt.Errorf("%w: the run's endpoint %s is on this machine or its local networks, and this trainer did not name it (%s, --store-endpoint)",
				ErrEndpoint, ep, EnvEndpoint)
		}
		return publicOnly, nil
	}
	if ep.secure || a.AllowHTTP {
		return anyAddr, nil
	}
	if isIP && !ip.IsLoopback() {
		return 0, fmt.Errorf("%w: %s is plain http and not this machine's loopback: this trainer's credentials would cross the network in the clear; use https, or allow http (%s=1, --store-allow-http)",
			ErrEndpoint, ep, EnvAllowHTTP)
	}
	return loopbackOnly, nil
}

// environmentCredentials picks the first source that has keys; a role is
// asked once here, so that a machine without any does not wait for the
// metadata service on every request.
func environmentCredentials() *credentials.Credentials {
	for _, p := range []credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}, &credentials.EnvMinio{}} {
		if v, err := p.Retrieve(); err == nil && v.AccessKeyID != "" {
			return credentials.New(p)
		}
	}
	role := &credentials.IAM{Client: &http.Client{Timeout: 2 * time.Second}}
	if v, err := role.Retrieve(); err == nil && v.AccessKeyID != "" {
		return credentials.New(role)
	}
	return credentials.New(&credentials.Static{Value: credentials.Value{SignerType: credentials.SignatureAnonymous}})
}

// splitURL reads s3://bucket[/prefix].
func splitURL(u string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", fmt.Errorf("%w: %q is not an s3:// URL", ErrSetting, u)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%w: %q names no bucket", ErrSetting, u)
	}
	return bucket, strings.Trim(prefix, "/"), nil
}

// CheckpointURL is where the run's checkpoint of a step goes:
// s3://bucket/prefix/<run>/step-<N> (a directory).
func (s *Store) CheckpointURL(run string, step uint32) string {
	return "s3://" + s.bucket + "/" + path.Join(s.prefix, run, fmt.Sprintf("step-%d", step))
}

// String names the store in messages.
func (s *Store) String() string { return s.cfg.URL + " at " + s.where }

// Named says whether the store's endpoint is the one the trainer named, to
// which its credentials go; to any other, its requests are anonymous.
func (s *Store) Named() bool { return s.named }

// explain turns the service's refusals into errors that say which setting
// to look at.
func (s *Store) explain(err error, bucket, key string) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case minio.NoSuchBucket:
		return fmt.Errorf("%w: bucket %q does not exist at %s (model.checkpoint.store %q, model.checkpoint.endpoint)", ErrNoBucket, bucket, s.where, s.cfg.URL)
	case minio.NoSuchKey, "NotFound":
		return fmt.Errorf("store: s3://%s/%s: %w", bucket, key, fs.ErrNotExist)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken":
		if !s.named {
			return fmt.Errorf("%w: %s refused this trainer's anonymous requests for bucket %q (%s: %s); a trainer sends its credentials only to the endpoint it names itself: set %s=%s (or --store-endpoint) if its keys are for that endpoint",
				ErrCredentials, s.where, bucket, r.Code, r.Message, EnvEndpoint, s.where)
		}
		return fmt.Errorf("%w: %s refused this trainer's credentials for bucket %q (%s: %s); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this trainer",
			ErrCredentials, s.where, bucket, r.Code, r.Message)
	}
	if r.StatusCode == http.StatusNotFound && key != "" {
		return fmt.Errorf("store: s3://%s/%s: %w", bucket, key, fs.ErrNotExist)
	}
	return fmt.Errorf("store: s3://%s/%s at %s: %w", bucket, key, s.where, err)
}

// BucketExists checks the store's bucket (and the credentials): a trainer
// says at start what is wrong with the run's store, not at its first upload.
func (s *Store) BucketExists(ctx context.Context) error {
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	return finish(ctx, s.bucketExists(ctx))
}

func (s *Store) bucketExists(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return s.explain(err, s.bucket, "")
	}
	if !ok {
		return s.explain(minio.ErrorResponse{Code: minio.NoSuchBucket}, s.bucket, "")
	}
	return nil
}
