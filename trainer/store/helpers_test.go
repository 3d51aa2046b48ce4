package store_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/psyche-go/psyche/internal/s3test"
)

func credentialsFor() *credentials.Credentials {
	return credentials.NewStaticV4(s3test.AccessKey, s3test.SecretKey, "")
}

// holdAfter passes requests to the default transport until parts part
// uploads have been answered; then it writes marker and holds every later
// request forever, as a trainer does that is about to be killed.
type holdAfter struct {
	mu     sync.Mutex
	parts  int
	done   int
	marker string
}

func (h *holdAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	held := h.done >= h.parts
	h.mu.Unlock()
	if held {
		select {}
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && r.Method == http.MethodPut && r.URL.Query().Has("partNumber") {
		h.mu.Lock()
		h.done++
		if h.done == h.parts {
			if werr := os.WriteFile(h.marker, []byte("held"), 0o644); werr != nil {
				panic(werr)
			}
		}
		h.mu.Unlock()
	}
	return resp, err
}

// waitForFile waits until path exists, or the child exits (an error).
func waitForFile(path string, exited <-chan error) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the uploading child exited before it held a part: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
