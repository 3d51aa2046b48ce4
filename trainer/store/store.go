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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// Upload copies a checkpoint (a file, or a directory's regular files) to
// url, a directory of this store (CheckpointURL), then reads every object
// back and compares its SHA-256 with the local file's; only then is the
// upload done. Parts that an earlier, killed upload of the same objects left
// are discarded first, and objects under url that this checkpoint does not
// have (an earlier layout) are removed, so a retry after a crash leaves
// exactly this checkpoint.
func (s *Store) Upload(ctx context.Context, local, dst string) error {
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	return finish(ctx, s.upload(ctx, local, dst))
}

func (s *Store) upload(ctx context.Context, local, dst string) error {
	bucket, key, err := splitURL(dst)
	if err != nil {
		return err
	}
	files, err := localFiles(local)
	if err != nil {
		return err
	}
	start, total := time.Now(), int64(0)
	names := map[string]bool{}
	for _, f := range files {
		obj := key + "/" + filepath.Base(f)
		names[obj] = true
		if err := s.client.RemoveIncompleteUpload(ctx, bucket, obj); err != nil {
			if e := s.explain(err, bucket, obj); !errors.Is(e, fs.ErrNotExist) {
				return e
			}
		}
		fi, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		t0 := time.Now()
		s.o.log.Info("uploading", "file", f, "to", "s3://"+bucket+"/"+obj, "bytes", fi.Size())
		_, err = s.client.FPutObject(ctx, bucket, obj, f, minio.PutObjectOptions{
			ContentType: "application/octet-stream", PartSize: s.o.partSize, NumThreads: uint(s.o.parallel)})
		if err != nil {
			return s.explain(err, bucket, obj)
		}
		total += fi.Size()
		s.o.log.Info("uploaded", "object", "s3://"+bucket+"/"+obj, "bytes", fi.Size(), "MB/s", rate(fi.Size(), time.Since(t0)))
	}
	for obj, err := range s.list(ctx, bucket, key+"/") {
		if err != nil {
			return err
		}
		if !names[obj.Key] {
			if err := s.client.RemoveObject(ctx, bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
				return s.explain(err, bucket, obj.Key)
			}
		}
	}
	for _, f := range files {
		if err := s.verify(ctx, f, bucket, key+"/"+filepath.Base(f)); err != nil {
			return err
		}
	}
	s.o.log.Info("checkpoint uploaded and read back", "url", dst, "files", len(files), "bytes", total, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func rate(n int64, d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(n)/1e6/max(d.Seconds(), 1e-6))
}

// localFiles lists a checkpoint's files: the file itself, or a directory's
// regular files (a Hugging Face directory is flat), config.json last.
func localFiles(local string) ([]string, error) {
	fi, err := os.Stat(local)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if !fi.IsDir() {
		return []string{local}, nil
	}
	ents, err := os.ReadDir(local)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	var files []string
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, filepath.Join(local, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("store: %s holds no files", local)
	}
	slices.SortFunc(files, func(a, b string) int {
		ac, bc := filepath.Base(a) == "config.json", filepath.Base(b) == "config.json"
		if ac != bc {
			if ac {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return files, nil
}

// verify reads an object back and compares its SHA-256 with the file's.
func (s *Store) verify(ctx context.Context, file, bucket, obj string) error {
	want, err := fileHash(file)
	if err != nil {
		return err
	}
	o, err := s.client.GetObject(ctx, bucket, obj, minio.GetObjectOptions{})
	if err != nil {
		return s.explain(err, bucket, obj)
	}
	defer o.Close()
	h := sha256.New()
	if _, err := io.Copy(h, o); err != nil {
		return s.explain(err, bucket, obj)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: s3://%s/%s has SHA-256 %s, the uploaded file %s", ErrVerify, bucket, obj, got, want)
	}
	return nil
}

func fileHash(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// list yields the objects directly under prefix (not deeper). The listing
// is the store's word, so it is bounded as it is read, not after: more than
// maxObjects entries, a key that is not an object directly under prefix, a
// negative size, or a listing still going at the list timeout is refused
// (ErrListing), and so is a page longer than maxPage bytes (bounded).
func (s *Store) list(ctx context.Context, bucket, prefix string) func(yield func(minio.ObjectInfo, error) bool) {
	return func(yield func(minio.ObjectInfo, error) bool) {
		where := "s3://" + bucket + "/" + prefix + " at " + s.where
		lctx, cancel := context.WithTimeout(ctx, s.o.listTimeout)
		defer cancel()
		// The listing ends without an error when its context does.
		ended := func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if lctx.Err() != nil {
				return fmt.Errorf("%w: %s: the listing took longer than %v", ErrListing, where, s.o.listTimeout)
			}
			return nil
		}
		n := 0
		for obj := range s.client.ListObjectsIter(lctx, bucket, minio.ListObjectsOptions{Prefix: prefix, MaxKeys: min(s.o.maxObjects+1, 1000)}) {
			if obj.Err != nil {
				err := ended()
				if err == nil && errors.Is(obj.Err, ErrListing) {
					err = fmt.Errorf("%w: %s: %v", ErrListing, where, obj.Err)
				} else if err == nil {
					err = s.explain(obj.Err, bucket, prefix)
				}
				yield(minio.ObjectInfo{}, err)
				return
			}
			if n++; n > s.o.maxObjects {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists more than %d entries", ErrListing, where, s.o.maxObjects))
				return
			}
			rest, ok := strings.CutPrefix(obj.Key, prefix)
			if !ok || rest == "" || strings.Contains(strings.TrimSuffix(rest, "/"), "/") {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists %q, which is not directly under it", ErrListing, where, obj.Key))
				return
			}
			if strings.HasSuffix(rest, "/") {
				continue // a "directory" entry
			}
			if obj.Size < 0 {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists %q with %d bytes", ErrListing, where, obj.Key, obj.Size))
				return
			}
			if !yield(obj, nil) {
				return
			}
		}
		if err := ended(); err != nil {
			yield(minio.ObjectInfo{}, err)
		}
	}
}

// Download copies the checkpoint at src (s3://bucket/key: a .safetensors
// object, or a directory of objects) into dir and returns the local path
// to load: the file, or dir itself. Each object is fetched as parallel range
// requests written in place; a file appears under its name only once whole.
// At most maxBytes are accepted in all (0: no limit), so a checkpoint URL
// cannot fill the disk: the listing is refused as soon as its sizes add up
// to more (ErrTooLarge), or it is refused for what list refuses
// (ErrListing), before anything is written. A src with nothing under it
// wraps fs.ErrNotExist.
func (s *Store) Download(ctx context.Context, src, dir string, maxBytes int64) (string, error) {
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	p, err := s.download(ctx, src, dir, maxBytes)
	return p, finish(ctx, err)
}

func (s *Store) download(ctx context.Context, src, dir string, maxBytes int64) (string, error) {
	bucket, key, err := splitURL(src)
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", fmt.Errorf("%w: %q names a bucket, not a checkpoint", ErrSetting, src)
	}
	var objs []minio.ObjectInfo
	var total int64
	names := map[string]bool{}
	accept := func(o minio.ObjectInfo) error {
		base := path.Base(o.Key)
		switch {
		case base == "." || base == ".." || strings.ContainsAny(base, `/\`):
			return fmt.Errorf("%w: %s: object %q has no usable file name", ErrListing, src, o.Key)
		case names[base]:
			return fmt.Errorf("%w: %s: %q is listed twice", ErrListing, src, base)
		case o.Size < 0:
			return fmt.Errorf("%w: %s: object %q has %d bytes", ErrListing, src, o.Key, o.Size)
		case maxBytes > 0 && o.Size > maxBytes-total:
			return fmt.Errorf("%w: %s holds more than %d bytes (%d listed so far), the run's model at most %d", ErrTooLarge, src, maxBytes, total+o.Size, maxBytes)
		case o.Size > math.MaxInt64-total:
			return fmt.Errorf("%w: %s: the listed sizes overflow", ErrListing, src)
		}
		names[base] = true
		total += o.Size
		objs = append(objs, o)
		return nil
	}
	single := strings.HasSuffix(key, ".safetensors")
	if single {
		info, err := s.client.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return "", s.explain(err, bucket, key)
		}
		if err := accept(info); err != nil {
			return "", err
		}
	} else {
		for obj, err := range s.list(ctx, bucket, strings.TrimSuffix(key, "/")+"/") {
			if err == nil {
				err = accept(obj)
			}
			if err != nil {
				return "", err
			}
		}
		if len(objs) == 0 {
			return "", fmt.Errorf("store: %s: no objects under it: %w", src, fs.ErrNotExist)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	start := time.Now()
	s.o.log.Info("downloading the checkpoint", "url", src, "files", len(objs), "bytes", total)
	for _, o := range objs {
		if err := s.fetch(ctx, bucket, o, filepath.Join(dir, path.Base(o.Key))); err != nil {
			return "", err
		}
	}
	s.o.log.Info("checkpoint downloaded", "url", src, "bytes", total, "MB/s", rate(total, time.Since(start)))
	if single {
		return filepath.Join(dir, path.Base(key)), nil
	}
	return dir, nil
}

// fetch writes one object to dst with parallel range requests.
func (s *Store) fetch(ctx context.Context, bucket string, o minio.ObjectInfo, dst string) error {
	tmp := dst + ".partial"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer os.Remove(tmp) // after the rename: nothing
	defer f.Close()
	if err := f.Truncate(o.Size); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	offs := make(chan int64)
	var wg sync.WaitGroup
	for range min(s.o.parallel, int((o.Size+s.o.rangeSize-1)/s.o.rangeSize)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, s.o.rangeSize)
			for off := range offs {
				n := min(s.o.rangeSize, o.Size-off)
				if err := s.readRange(ctx, bucket, o, off, buf[:n]); err != nil {
					cancel(err)
					return
				}
				if _, err := f.WriteAt(buf[:n], off); err != nil {
					cancel(fmt.Errorf("store: %w", err))
					return
				}
			}
		}()
	}
send:
	for off := int64(0); off < o.Size; off += s.o.rangeSize {
		select {
		case offs <- off:
		case <-ctx.Done():
			break send
		}
	}
	close(offs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return os.Rename(tmp, dst)
}

// readRange reads p from offset off of the object, pinned to the version
// listed (its ETag): an object replaced meanwhile fails the read rather
// than mixing two uploads.
func (s *Store) readRange(ctx context.Context, bucket string, o minio.ObjectInfo, off int64, p []byte) error {
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+int64(len(p))-1); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if o.ETag != "" {
		if err := opts.SetMatchETag(o.ETag); err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	r, err := s.client.GetObject(ctx, bucket, o.Key, opts)
	if err != nil {
		return s.explain(err, bucket, o.Key)
	}
	defer r.Close()
	if _, err := io.ReadFull(r, p); err != nil {
		return s.explain(err, bucket, o.Key)
	}
	return nil
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
