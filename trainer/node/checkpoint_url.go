package node

import (
	"os"
	"path/filepath"
	"strings"

	"context"

	"github.com/psyche-go/psyche/coordinator"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/store"
	"github.com/psyche-go/psyche/trainer/weights"
)

// loadURL loads the run's checkpoint source (as modelspec.ParseSource reads
// it): fresh weights drawn from a seed (seed:N, the run's model built here,
// the same on every trainer), a file:// path on this machine, or an
// http(s):// URL read with range requests (the data provider's HTTP source,
// with its retries), streamed into the decoder, which accepts no more
// tensor bytes than the run's model has.
//
// A checkpoint whose config (config.json, or a checkpoint file's psyche.model
// metadata) is not cfg is refused before its model is allocated: whoever
// recorded the URL may have put any size there. A Llama directory on this
// disk (file://, or s3:// once downloaded) is read as the weights are
// asked for, not loaded here; the caller closes the weights.
func (n *Node) loadURL(ctx context.Context, url string, cfg modelspec.Config, st coordinator.CheckpointStore) (weights.Weights, error) {
	src, err := modelspec.ParseSource(url)
	if err != nil {
		return weights.Weights{}, err
	}
	accept := func(c modelspec.Config) error { return modelspec.Compare(c, cfg) }
	switch src.Kind {
	case modelspec.FromSeed:
		// Drawn as they are read: an engine that holds the model
		// elsewhere never has it built here.
		return runmodel.Seeded(cfg, src.Seed)
	case modelspec.FromFile:
		return runmodel.OpenChecked(ctx, src.Path, n.cfg.kernels, accept)
	case modelspec.FromS3:
		path, err := n.downloadCheckpoint(ctx, url, cfg, st)
		if err != nil {
			return weights.Weights{}, err
		}
		return runmodel.OpenChecked(ctx, path, n.cfg.kernels, accept)
	}
	return n.loadHTTP(ctx, url, cfg, accept)
}

// loadHTTP opens an http(s):// checkpoint (loadURL), downloaded to disk
// with range requests and read-ahead, never into memory: a Hugging Face
// directory's files (a Llama run's URL that does not name a .safetensors
// file), or one file that Save wrote.
func (n *Node) loadHTTP(ctx context.Context, url string, cfg modelspec.Config, accept runmodel.Accept) (weights.Weights, error) {
	if cfg.Arch == coordinator.ArchLlama && !strings.HasSuffix(strings.SplitN(url, "?", 2)[0], ".safetensors") {
		return runmodel.OpenHF(ctx, llama.HTTPDir{URL: url, Opts: n.cfg.dataOpts}, accept)
	}
	hs, err := data.NewHTTPSource(url, n.cfg.dataOpts...)
	if err != nil {
		return weights.Weights{}, err
	}
	defer hs.Close()
	size, err := hs.Size(ctx)
	if err != nil {
		return weights.Weights{}, err
	}
	lim := checkpoint.Limits{MaxDataSize: 4 * int64(cfg.NumParams()), MaxHeaderSize: checkpoint.HeaderLimit(cfg.Layers())}
	body := data.ReadAhead(ctx, hs, size, 4<<20, 4)
	defer body.Close()
	f, err := lim.Spool(body, size, url)
	if err != nil {
		return weights.Weights{}, err
	}
	return runmodel.OpenFile(f, accept)
}

// downloadCheckpoint fetches an s3:// checkpoint through the run's store
// settings (endpoint, region; this trainer's credentials if that endpoint is
// the one it named, else anonymously, under store.Access's rules) into the
// checkpoint directory (or a temporary one), where it stays: this trainer
// can then offer it to others. No more bytes are accepted than the run's
// model can have.
func (n *Node) downloadCheckpoint(ctx context.Context, url string, cfg modelspec.Config, st coordinator.CheckpointStore) (string, error) {
	sc := store.FromRun(st)
	bucket, _, _ := strings.Cut(strings.TrimPrefix(url, "s3://"), "/")
	sc.URL = "s3://" + bucket // the URL's bucket, with the run's endpoint and region
	s, err := store.Open(sc, n.storeOptions()...)
	if err != nil {
		return "", err
	}
	base := n.cfg.checkpoints
	if base == "" {
		base = filepath.Join(os.TempDir(), "psyche-"+n.runID)
	}
	dir := filepath.Join(base, "from-store", strings.NewReplacer("/", "_", "..", "_").Replace(strings.TrimPrefix(url, "s3://")))
	// At most 8 bytes a parameter (F32, and a tied head's copy that a
	// Hugging Face file may hold) and a megabyte of JSON.
	params := int64(cfg.NumParams())
	return s.Download(ctx, url, dir, 8*params+1<<20)
}

// WithStoreAccess sets what this trainer says about checkpoint stores: the
// endpoint its credentials are for, and whether plain http is allowed
// (store.Access). Without it, the environment's (store.AccessFromEnv:
// PSYCHE_STORE_ENDPOINT, PSYCHE_STORE_ALLOW_HTTP). A run's store at any
// other endpoint is used anonymously, and refused on this machine or its
// local networks.
func WithStoreAccess(a store.Access) Option {
	return func(c *config) error { c.storeAccess = &a; return nil }
}

// storeOptions are the options every store this node opens gets.
func (n *Node) storeOptions() []store.Option {
	opts := []store.Option{store.WithLogger(n.cfg.log)}
	if n.cfg.storeAccess != nil {
		opts = append(opts, store.WithAccess(*n.cfg.storeAccess))
	}
	return opts
}
