package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/psyche-go/psyche/trainer/store"
)

// liar is an S3 server on 127.0.0.1 whose listing says what the test
// wants: page(n) writes the n-th page's <Contents> and says whether more
// follow; objects read back as zeros of whatever range is asked.
type liar struct {
	*httptest.Server
	pages atomic.Int64
}

func lie(t *testing.T, page func(w http.ResponseWriter, n int) (more bool)) *liar {
	l := &liar{}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Has("location"):
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><LocationConstraint>us-east-1</LocationConstraint>`)
		case q.Get("list-type") == "2":
			n := int(l.pages.Add(1))
			w.Header().Set("Content-Type", "application/xml")
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>ckpt</Name><Prefix>%s</Prefix><Delimiter>/</Delimiter><MaxKeys>1000</MaxKeys>`, q.Get("prefix"))
			more := page(w, n)
			if more {
				fmt.Fprintf(w, `<IsTruncated>true</IsTruncated><NextContinuationToken>page-%d</NextContinuationToken>`, n+1)
			} else {
				fmt.Fprint(w, `<IsTruncated>false</IsTruncated>`)
			}
			fmt.Fprint(w, `</ListBucketResult>`)
		case r.Method == http.MethodGet:
			var from, to int64
			if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to); err != nil {
				http.Error(w, "range", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Length", strconv.FormatInt(to-from+1, 10))
			w.Header().Set("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")
			w.Header().Set("ETag", `"e"`)
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/*", from, to))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(make([]byte, to-from+1))
		}
	}))
	t.Cleanup(l.Close)
	return l
}

func object(w http.ResponseWriter, key string, size int64) {
	fmt.Fprintf(w, `<Contents><Key>runs/run/step-1/%s</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>"e"</ETag><Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>`, key, size)
}

// openLiar opens the liar as the trainer's own endpoint (its loopback, so
// plain http is fine): the listing bounds hold whoever the store is.
func openLiar(t *testing.T, l *liar, opts ...store.Option) *store.Store {
	t.Helper()
	s, err := store.Open(store.Config{URL: "s3://ckpt", Endpoint: l.URL, Region: "us-east-1"},
		append([]store.Option{store.WithStaticCredentials("k", "s"), store.WithAccess(store.Access{Endpoint: l.URL})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// peakHeap samples the heap while f runs and returns f's error and the
// most the heap grew by.
func peakHeap(f func() error) (error, uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, peak := m.HeapAlloc, m.HeapAlloc
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	err := f()
	close(done)
	wg.Wait()
	return err, peak - base
}

// download runs a download with a deadline that the bounds should beat by
// far (without them, an endless listing runs into it).
func download(s *store.Store, dir string, maxBytes int64) (error, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Download(ctx, "s3://ckpt/runs/run/step-1", dir, maxBytes)
	return err, time.Since(start)
}

// Negative sizes do not pass the bound: 65 MiB and -64 MiB listed under a
// 1 MiB bound (1 MiB in all) are refused with nothing written, in either
// order.
func TestListingNegativeSize(t *testing.T) {
	for _, order := range [][2]int64{{65 << 20, -64 << 20}, {-64 << 20, 65 << 20}} {
		l := lie(t, func(w http.ResponseWriter, _ int) bool {
			object(w, "a.safetensors", order[0])
			object(w, "b.json", order[1])
			return false
		})
		dir := filepath.Join(t.TempDir(), "dl")
		err, _ := download(openLiar(t, l), dir, 1<<20)
		var written int64
		filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if fi, err := d.Info(); err == nil {
					written += fi.Size()
				}
			}
			return nil
		})
		if written != 0 {
			t.Fatalf("listed %v: %d bytes landed on disk under a 1 MiB bound (%v)", order, written, err)
		}
		// 65 MiB first is over the bound as soon as it is read; a negative
		// size is refused as such.
		if !errors.Is(err, store.ErrTooLarge) && !(errors.Is(err, store.ErrListing) && strings.Contains(err.Error(), "-67108864")) {
			t.Errorf("listed %v: %v, want ErrTooLarge, or ErrListing naming the size", order, err)
		}
		if order[0] < 0 && !errors.Is(err, store.ErrListing) {
			t.Errorf("listed %v: %v, want ErrListing", order, err)
		}
	}
}

// An endless listing is refused as it is read: by the bytes it lists
// against the model's bound, else by its entries, and the heap stays small.
func TestListingEndless(t *testing.T) {
	mib := lie(t, func(w http.ResponseWriter, n int) bool {
		for i := range 1000 {
			object(w, fmt.Sprintf("shard-%d-%d.safetensors", n, i), 1<<20)
		}
		return true
	})
	err, took := download(openLiar(t, mib), t.TempDir(), 64<<20)
	if !errors.Is(err, store.ErrTooLarge) || mib.pages.Load() != 1 {
		t.Errorf("endless listing of 1 MiB objects, 64 MiB bound: %v after %d pages and %v, want ErrTooLarge at the first page", err, mib.pages.Load(), took)
	}

	empty := lie(t, func(w http.ResponseWriter, n int) bool {
		for i := range 1000 {
			object(w, fmt.Sprintf("f-%d-%d", n, i), 0)
		}
		return true
	})
	var took2 time.Duration
	err, grew := peakHeap(func() error { err, d := download(openLiar(t, empty), t.TempDir(), 64<<20); took2 = d; return err })
	t.Logf("endless listing of empty objects: %v after %d pages and %v; heap grew by at most %.1f MiB", err, empty.pages.Load(), took2, float64(grew)/(1<<20))
	if !errors.Is(err, store.ErrListing) || !strings.Contains(err.Error(), "more than 1000 entries") || empty.pages.Load() > 2 {
		t.Errorf("endless listing of empty objects: %v after %d pages, want ErrListing at 1,000 entries", err, empty.pages.Load())
	}
	if grew > 32<<20 {
		t.Errorf("the heap grew by %d MiB reading the listing", grew>>20)
	}

	// A bound of fewer entries is kept too.
	few := lie(t, func(w http.ResponseWriter, n int) bool {
		for i := range 4 {
			object(w, fmt.Sprintf("f-%d-%d", n, i), 0)
		}
		return true
	})
	err, _ = download(openLiar(t, few, store.WithMaxObjects(10)), t.TempDir(), 0)
	if !errors.Is(err, store.ErrListing) || !strings.Contains(err.Error(), "more than 10 entries") {
		t.Errorf("10 entries at most: %v", err)
	}
}

// One page that never ends is refused at maxPage bytes, before it is
// decoded.
func TestListingEndlessPage(t *testing.T) {
	l := lie(t, func(w http.ResponseWriter, n int) bool {
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, `<Contents><Key>runs/run/step-1/f-%d</Key><Size>0</Size></Contents>`, i); err != nil {
				return false
			}
		}
	})
	err, grew := peakHeap(func() error { err, _ := download(openLiar(t, l), t.TempDir(), 64<<20); return err })
	t.Logf("one endless page: %v; heap grew by at most %.1f MiB", err, float64(grew)/(1<<20))
	if !errors.Is(err, store.ErrListing) || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("one endless page: %v, want ErrListing", err)
	}
	if grew > 32<<20 {
		t.Errorf("the heap grew by %d MiB reading one page", grew>>20)
	}
}

// A listing that trickles (a page now and then, forever) is refused at
// the list timeout.
func TestListingTimeout(t *testing.T) {
	l := lie(t, func(w http.ResponseWriter, n int) bool {
		time.Sleep(200 * time.Millisecond)
		object(w, fmt.Sprintf("f-%d", n), 0)
		return true
	})
	err, took := download(openLiar(t, l, store.WithListTimeout(time.Second)), t.TempDir(), 64<<20)
	if !errors.Is(err, store.ErrListing) || !strings.Contains(err.Error(), "took longer than 1s") || took > 5*time.Second {
		t.Errorf("trickling listing: %v after %v, want ErrListing at 1s", err, took)
	}
}

// Keys that are not files of the checkpoint directory are refused.
func TestListingKeys(t *testing.T) {
	for name, page := range map[string]func(w http.ResponseWriter){
		"outside the prefix": func(w http.ResponseWriter) {
			fmt.Fprint(w, `<Contents><Key>elsewhere/model.safetensors</Key><Size>1</Size></Contents>`)
		},
		"deeper": func(w http.ResponseWriter) { object(w, "sub/model.safetensors", 1) },
		"twice": func(w http.ResponseWriter) {
			object(w, "model.safetensors", 1)
			object(w, "model.safetensors", 1)
		},
	} {
		l := lie(t, func(w http.ResponseWriter, _ int) bool { page(w); return false })
		if err, _ := download(openLiar(t, l), t.TempDir(), 0); !errors.Is(err, store.ErrListing) {
			t.Errorf("%s: %v, want ErrListing", name, err)
		}
	}
	// An honest listing of the same server downloads.
	l := lie(t, func(w http.ResponseWriter, _ int) bool {
		object(w, "model.safetensors", 3<<20)
		object(w, "config.json", 10)
		return false
	})
	dir := t.TempDir()
	if err, _ := download(openLiar(t, l, store.WithRangeSize(1<<20)), dir, 4<<20); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil || fi.Size() != 3<<20 {
		t.Fatalf("downloaded model: %v", err)
	}
}
