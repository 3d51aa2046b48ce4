package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/federated/browser/web"
)

// TestServerBrowserTrainer: psyche server with the browser trainer off
// (--browser-trainer=false, or PSYCHE_BROWSER_TRAINER=false) answers
// /train/<run> and its files with the one line that says so, and never
// builds the module; on (the default), a server with no federated run and
// no visitor builds nothing either: it used to run the go command at every
// start.
func TestServerBrowserTrainer(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  string
		off  bool
	}{
		{name: "on", off: false},
		{name: "--browser-trainer=false", args: []string{"--browser-trainer=false"}, off: true},
		{name: "PSYCHE_BROWSER_TRAINER=false", env: "false", off: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("PSYCHE_BROWSER_TRAINER", tc.env)
			}
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			out, logs := &cancelOn{cancel: func() {}}, &cancelOn{cancel: func() {}}
			done := make(chan int, 1)
			go func() {
				done <- runContext(ctx, append([]string{"psyche", "server", "--dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0",
					"--creators", "any", "--p2p=false"}, tc.args...), out, logs)
			}()
			var url string
			for url == "" {
				select {
				case code := <-done:
					t.Fatalf("the server exited (%d): %s %s", code, out.String(), logs.String())
				case <-time.After(10 * time.Millisecond):
				}
				if i := strings.Index(out.String(), "server listening on "); i >= 0 && strings.Contains(out.String()[i:], "\n") {
					url = strings.Fields(out.String()[i:])[3]
				}
			}
			// (On, the page and the module would build it.)
			paths := []string{"/train/static/app.js"}
			if tc.off {
				paths = append(paths, "/train/some-run", "/train/static/psyche.wasm", "/train/static/wasm_exec.js")
			}
			for _, path := range paths {
				resp, err := http.Get(url + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case tc.off && (resp.StatusCode != http.StatusNotFound || strings.TrimSpace(string(body)) != browserOff):
					t.Errorf("%s: HTTP %d %q, want 404 %q", path, resp.StatusCode, body, browserOff)
				case !tc.off && resp.StatusCode != http.StatusOK:
					t.Errorf("%s: HTTP %d %q", path, resp.StatusCode, body)
				}
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("the server exited %d: %s", code, logs.String())
			}
			log := logs.String()
			if strings.Contains(log, "building its WebAssembly module") {
				t.Errorf("the server built the browser trainer's module with nothing needing it:\n%s", log)
			}
			want := "when first needed"
			if web.Included() {
				want = "built into this binary"
			}
			if tc.off {
				want = "the browser trainer is off"
			}
			if !strings.Contains(log, want) {
				t.Errorf("the log lacks %q:\n%s", want, log)
			}
		})
	}
}
