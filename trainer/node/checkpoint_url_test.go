package node

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
)

// The run's checkpoint source may be a file on this machine or an HTTP(S)
// URL read with range requests; either way the model must be the run's.
func TestLoadCheckpointURL(t *testing.T) {
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	want, err := gpt.New(cfg, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	if err := want.Save(context.Background(), path, nil); err != nil {
		t.Fatal(err)
	}
	other, _ := gpt.New(gpt.Config{Vocab: 256, Context: 16, Width: 32, Layers: 1, Heads: 2}, 3, nil)
	if err := other.Save(context.Background(), filepath.Join(dir, "bigger.safetensors"), nil); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	mux := http.NewServeMux()
	mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(dir)))) // ranges supported
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "short", time.Time{}, strings.NewReader(string(raw[:len(raw)-10])))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	n := &Node{cfg: config{dataOpts: []data.Option{data.WithRetries(1)}}}
	for _, tc := range []struct {
		name, url string
		err       error // nil: loads want
	}{
		{"file", "file://" + path, nil},
		{"http", srv.URL + "/files/model.safetensors", nil},
		{"missing", srv.URL + "/files/none.safetensors", data.ErrNotFound},
		{"truncated", srv.URL + "/short", checkpoint.ErrMalformed}, // the header names bytes past the end
		{"more tensor bytes than the run's model", srv.URL + "/files/bigger.safetensors", checkpoint.ErrTooLarge},
	} {
		got, err := n.loadURL(context.Background(), tc.url, cfg)
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == nil && !slices.Equal(got.Params, want.Params):
			t.Errorf("%s: other weights", tc.name)
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
	}
	if _, err := n.loadURL(context.Background(), "s3://bucket/model", cfg); err == nil {
		t.Error("an unsupported scheme was accepted")
	}
}
