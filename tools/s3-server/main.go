// Command s3-server builds (once, cached) and runs the tests' S3 server:
//
//	go run ./tools/s3-server --install          # build; print its path
//	go run ./tools/s3-server --root DIR --addr 127.0.0.1:9000 [--bucket NAME]...
//
// It serves DIR's subdirectories as buckets with the keys that
// internal/s3test names, until interrupted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/psyche-go/psyche/internal/s3test"
)

func main() {
	install := flag.Bool("install", false, "build the server if needed and print its path")
	root := flag.String("root", "", "directory whose subdirectories are the buckets")
	addr := flag.String("addr", "127.0.0.1:9000", "address to listen on")
	var buckets []string
	flag.Func("bucket", "create this bucket (repeatable)", func(s string) error { buckets = append(buckets, s); return nil })
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !s3test.Built() {
		// The first build compiles versitygw and its dependencies: minutes
		// of silence otherwise (195 s on two cores).
		fmt.Fprintf(os.Stderr, "s3-server: building the test S3 server (go install %s@%s) once: about 1-4 minutes on two cores; later runs start at once\n",
			s3test.Package, s3test.Version)
	}
	bin, err := s3test.Binary(ctx)
	if err != nil {
		fail(err)
	}
	if *install {
		fmt.Println(bin)
		return
	}
	if *root == "" {
		fail(fmt.Errorf("--root is required"))
	}
	for _, b := range buckets {
		if strings.ContainsAny(b, "/\\") {
			fail(fmt.Errorf("bucket %q", b))
		}
		if err := os.MkdirAll(filepath.Join(*root, b), 0o755); err != nil {
			fail(err)
		}
	}
	s, err := s3test.Run(ctx, bin, *root, *addr)
	if err != nil {
		fail(err)
	}
	fmt.Printf("S3 server at %s (access key %s, secret key %s), buckets under %s\n", s.Endpoint, s3test.AccessKey, s3test.SecretKey, *root)
	fmt.Printf("a trainer's environment for it: %s\n", strings.Join(s.Env(), " "))
	<-ctx.Done()
	s.Stop()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "s3-server:", err)
	os.Exit(1)
}
