//go:build unix

package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/psyche-go/psyche/internal/floodtest"
)

// TestServeDataRefusesAFIFO: a FIFO in the data directory is refused
// without being opened (opening one waits for a writer): more GETs of it
// than the server has places for reads are answered 404 at once, and a
// regular file is read after them. Before, each GET held a place and an OS
// thread until the server restarted.
func TestServeDataRefusesAFIFO(t *testing.T) {
	data := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(data, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "tokens.bin"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serveDataDir(t, data, WithDataLimits(2, 2))
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/data/fifo", http.StatusNotFound},
		{"/data/fifo", http.StatusNotFound},
		{"/data/fifo", http.StatusNotFound},
		{"/data/tokens.bin", http.StatusOK},
	} {
		_, status, err := floodtest.Get(context.Background(), addr, "127.0.0.1", tc.path, floodGuard)
		if err != nil || status != tc.status {
			t.Fatalf("GET %s: %d %v, want %d", tc.path, status, err, tc.status)
		}
	}
}
