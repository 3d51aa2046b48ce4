package store_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/psyche-go/psyche/internal/s3test"
	"github.com/psyche-go/psyche/trainer/store"
)

// checkpointDir writes a Hugging Face-shaped directory: a model file of n
// bytes (a pattern that differs per offset) and a config.json.
func checkpointDir(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"gpt2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func open(t *testing.T, srv *s3test.Server, url string, opts ...store.Option) *store.Store {
	t.Helper()
	opts = append([]store.Option{store.WithStaticCredentials(s3test.AccessKey, s3test.SecretKey),
		store.WithAccess(store.Access{Endpoint: srv.Endpoint})}, opts...)
	s, err := store.Open(store.Config{URL: url, Endpoint: srv.Endpoint}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	for _, name := range []string{"model.safetensors", "config.json"} {
		x, err := os.ReadFile(filepath.Join(a, name))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs after the round trip", name)
		}
	}
}

// client is a plain minio client on the server, to look at the bucket as
// another S3 user would.
func client(t *testing.T, srv *s3test.Server) *minio.Client {
	t.Helper()
	c, err := minio.New(strings.TrimPrefix(srv.Endpoint, "http://"), &minio.Options{
		Creds: credentialsFor(), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func incomplete(t *testing.T, c *minio.Client, bucket, prefix string) int {
	t.Helper()
	n := 0
	for u := range c.ListIncompleteUploads(context.Background(), bucket, prefix, true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		n++
	}
	return n
}

// A checkpoint directory goes up in parts and comes back in ranges, byte
// for byte; what an earlier upload left under the same URL goes.
func TestUploadDownload(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "ckpt")
	ctx := context.Background()
	s := open(t, srv, "s3://ckpt/runs", store.WithPartSize(5<<20), store.WithRangeSize(1<<20), store.WithParallel(3))
	if err := s.BucketExists(ctx); err != nil {
		t.Fatal(err)
	}
	url := s.CheckpointURL("run-1", 42)
	if url != "s3://ckpt/runs/run-1/step-42" {
		t.Fatalf("checkpoint URL %s", url)
	}
	c := client(t, srv)
	// A shard of an earlier, sharded save of the same step.
	if _, err := c.PutObject(ctx, "ckpt", "runs/run-1/step-42/model-00001-of-00002.safetensors", strings.NewReader("old"), 3, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	local := checkpointDir(t, 23<<20+12345) // 5 parts, the last one short
	if err := s.Upload(ctx, local, url); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for o := range c.ListObjects(ctx, "ckpt", minio.ListObjectsOptions{Prefix: "runs/run-1/step-42/"}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		keys = append(keys, o.Key)
	}
	if strings.Join(keys, " ") != "runs/run-1/step-42/config.json runs/run-1/step-42/model.safetensors" {
		t.Fatalf("objects after the upload: %v", keys)
	}
	info, err := c.StatObject(ctx, "ckpt", "runs/run-1/step-42/model.safetensors", minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(info.ETag, "-5") { // a multipart object's ETag counts its parts
		t.Errorf("model.safetensors ETag %q: not a 5-part upload", info.ETag)
	}
	out := filepath.Join(t.TempDir(), "dl")
	got, err := s.Download(ctx, url, out, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != out {
		t.Fatalf("Download returned %s, want the directory %s", got, out)
	}
	sameFiles(t, local, out)
	// One object by its name.
	file, err := s.Download(ctx, url+"/model.safetensors", filepath.Join(t.TempDir(), "one"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(file) != "model.safetensors" {
		t.Fatalf("single object downloaded as %s", file)
	}
	// More bytes than the caller accepts: refused before anything is written.
	if _, err := s.Download(ctx, url, filepath.Join(t.TempDir(), "small"), 1<<20); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("limit: %v", err)
	}
}

// A trainer killed in the middle of a multipart upload leaves parts but no
// object; the next upload of the same checkpoint discards them and ends
// with the whole checkpoint and nothing pending.
func TestKilledUpload(t *testing.T) {
	if os.Getenv("STORE_TEST_CHILD") != "" {
		uploadAndHang(t)
		return
	}
	srv := s3test.Start(t)
	srv.Bucket(t, "ckpt")
	local := checkpointDir(t, 30<<20)
	marker := filepath.Join(t.TempDir(), "parts-sent")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledUpload$")
	cmd.Env = append(os.Environ(), "STORE_TEST_CHILD=1", "STORE_TEST_ENDPOINT="+srv.Endpoint, "STORE_TEST_DIR="+local, "STORE_TEST_MARKER="+marker)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// The child writes the marker once two parts are stored and it holds
	// the third; it never finishes on its own.
	if err := waitForFile(marker, waited); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-waited
	ctx := context.Background()
	c := client(t, srv)
	if n := incomplete(t, c, "ckpt", "runs/"); n != 1 {
		t.Fatalf("%d incomplete uploads after the kill, want 1", n)
	}
	s := open(t, srv, "s3://ckpt/runs", store.WithPartSize(5<<20))
	url := s.CheckpointURL("run", 7)
	if _, err := s.Download(ctx, url, t.TempDir(), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a killed upload's checkpoint can be read: %v", err)
	}
	if err := s.Upload(ctx, local, url); err != nil {
		t.Fatal(err)
	}
	if n := incomplete(t, c, "ckpt", "runs/"); n != 0 {
		t.Fatalf("%d incomplete uploads after the retry", n)
	}
	dl := t.TempDir()
	if _, err := s.Download(ctx, url, dl, 0); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, local, dl)
}

func uploadAndHang(t *testing.T) {
	hold := &holdAfter{parts: 2, marker: os.Getenv("STORE_TEST_MARKER")}
	s, err := store.Open(store.Config{URL: "s3://ckpt/runs", Endpoint: os.Getenv("STORE_TEST_ENDPOINT")},
		store.WithStaticCredentials(s3test.AccessKey, s3test.SecretKey), store.WithAccess(store.Access{Endpoint: os.Getenv("STORE_TEST_ENDPOINT")}),
		store.WithPartSize(5<<20), store.WithParallel(1),
		store.WithTransport(hold))
	if err != nil {
		t.Fatal(err)
	}
	err = s.Upload(context.Background(), os.Getenv("STORE_TEST_DIR"), s.CheckpointURL("run", 7))
	t.Fatalf("the upload returned (%v); it should have been killed", err)
}

func TestRefusals(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "ckpt")
	ctx := context.Background()
	local := checkpointDir(t, 1000)

	missing := open(t, srv, "s3://no-such-bucket/runs")
	err := missing.Upload(ctx, local, missing.CheckpointURL("run", 1))
	if !errors.Is(err, store.ErrNoBucket) || !strings.Contains(err.Error(), `"no-such-bucket"`) || !strings.Contains(err.Error(), "model.checkpoint.store") {
		t.Errorf("missing bucket: %v", err)
	}
	if err := missing.BucketExists(ctx); !errors.Is(err, store.ErrNoBucket) {
		t.Errorf("missing bucket, checked: %v", err)
	}

	wrong, err := store.Open(store.Config{URL: "s3://ckpt/runs", Endpoint: srv.Endpoint}, store.WithStaticCredentials(s3test.AccessKey, "not-the-secret"),
		store.WithAccess(store.Access{Endpoint: srv.Endpoint}))
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"upload":   wrong.Upload(ctx, local, wrong.CheckpointURL("run", 1)),
		"check":    wrong.BucketExists(ctx),
		"download": func() error { _, err := wrong.Download(ctx, "s3://ckpt/runs/run/step-1", t.TempDir(), 0); return err }(),
	} {
		if !errors.Is(err, store.ErrCredentials) || !strings.Contains(err.Error(), `"ckpt"`) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
			t.Errorf("wrong credentials, %s: %v", what, err)
		}
	}

	// Anonymous (no keys in the environment) against a private bucket;
	// the trainer names the endpoint in its environment.
	t.Setenv(store.EnvEndpoint, srv.Endpoint)
	t.Setenv(store.EnvAllowHTTP, "")
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("MINIO_ACCESS_KEY", "")
	t.Setenv("MINIO_SECRET_KEY", "")
	t.Setenv("MINIO_ROOT_USER", "")
	t.Setenv("MINIO_ROOT_PASSWORD", "")
	anon, err := store.Open(store.Config{URL: "s3://ckpt/runs", Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := anon.Upload(ctx, local, anon.CheckpointURL("run", 1)); !errors.Is(err, store.ErrCredentials) {
		t.Errorf("anonymous upload: %v", err)
	}
	// The environment's keys are found.
	t.Setenv("AWS_ACCESS_KEY_ID", s3test.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3test.SecretKey)
	env, err := store.Open(store.Config{URL: "s3://ckpt/runs", Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Upload(ctx, local, env.CheckpointURL("run", 1)); err != nil {
		t.Errorf("upload with the environment's keys: %v", err)
	}
	if _, err := env.Download(ctx, "s3://ckpt/runs/run/step-2", t.TempDir(), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("nothing there: %v", err)
	}
	if _, err := env.Download(ctx, "s3://ckpt/runs/run/step-2/model.safetensors", t.TempDir(), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no such object: %v", err)
	}

	for _, cfg := range []store.Config{
		{URL: "https://ckpt/runs"},
		{URL: "s3://"},
		{URL: "s3://ckpt", Endpoint: "ftp://host"},
		{URL: "s3://ckpt", Endpoint: "http://host/path"},
	} {
		if _, err := store.Open(cfg); !errors.Is(err, store.ErrSetting) {
			t.Errorf("%+v: %v, want a setting error", cfg, err)
		}
	}
}
