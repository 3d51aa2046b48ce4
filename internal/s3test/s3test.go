// Package s3test runs a real S3 server for the tests: Versity's S3 gateway
// (versitygw) over a directory, built from the Go module proxy at a pinned
// version and cached, then started as its own process on 127.0.0.1. Buckets
// are the root's subdirectories. Only tests and scripts/s3-server use it.
package s3test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/psyche-go/psyche/internal/filelock"
)

// The gateway's module and version: a maintained S3 server written in Go
// (Apache 2.0), so `go install` builds it wherever the tests build.
const (
	Package = "github.com/versity/versitygw/cmd/versitygw"
	Version = "v1.8.0"
)

// Keys of the server's root user.
const (
	AccessKey = "psyche-test"
	SecretKey = "psyche-test-secret"
)

// Dir is where the built gateway is kept: $PSYCHE_TOOLS, or the user's cache
// directory's psyche/tools.
func Dir() (string, error) {
	if d := os.Getenv("PSYCHE_TOOLS"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(c, "psyche", "tools"), nil
}

// Built says whether this version of the gateway is built already (Binary
// then returns at once; otherwise it compiles for minutes, which a command
// should say before it starts).
func Built() bool {
	dir, err := Dir()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, "versitygw-"+Version, "versitygw"))
	return err == nil
}

// Binary returns the gateway's path, building it first if this version is
// not there yet (about a minute on two cores; one process builds while
// others wait on a lock).
func Binary(ctx context.Context) (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "versitygw-"+Version, "versitygw")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	var lock *filelock.Lock
	for {
		lock, err = filelock.TryLock(filepath.Join(filepath.Dir(bin), ".build.lock"))
		if err == nil {
			break
		}
		if !errors.Is(err, filelock.ErrLocked) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for another process to build versitygw: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
	defer lock.Unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // built while this one waited
	}
	cmd := exec.CommandContext(ctx, "go", "install", Package+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin), "GOFLAGS=", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the test S3 server (go install %s@%s): %v\n%s", Package, Version, err, out)
	}
	return bin, nil
}

// Server is a running gateway.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Root     string // its buckets are the subdirectories
	cmd      *exec.Cmd
	done     chan struct{}
}

// Start runs a gateway over a fresh directory until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	s, err := Run(ctx, bin, root, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Run starts the gateway over root at addr (port 0: a free one) and waits
// until it answers.
func Run(ctx context.Context, bin, root, addr string) (*Server, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if port == "0" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		addr = l.Addr().String()
		l.Close()
	}
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", root)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+AccessKey, "ROOT_SECRET_ACCESS_KEY="+SecretKey)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + addr, Root: root, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()
	// Up once it answers anything (an anonymous request is refused: 403).
	for {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("the S3 gateway exited at start: %v", cmd.ProcessState)
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Bucket creates a bucket (a directory of the root).
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(s.Root, name), 0o755); err != nil {
		t.Fatal(err)
	}
}

// Env is a trainer's environment with the server's keys, and the server
// named as the endpoint they are for (trainer/store sends a trainer's keys
// only there).
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "PSYCHE_STORE_ENDPOINT=" + s.Endpoint}
}

// Stop ends the gateway.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.done
	}
}
