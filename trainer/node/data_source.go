package node

import (
	"context"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/store"
)

// serverBackend is a backend that is a coordinator server at a URL (the
// server backend's client): a run's "server:PATH" data is read from it.
type serverBackend interface{ URL() string }

// dataOptions are the options the run's data opens with: the node's own
// (WithDataOptions), the run's vocabulary (tokens are checked against it: a
// local file whole, before any training; a remote one per sequence), the
// server this node talks to for "server:" data, and s3:// objects read
// through the checkpoint store client, with the run's store endpoint and
// region and this trainer's rules on credentials (WithStoreAccess).
func (n *Node) dataOptions(m *coordinator.Model) []data.Option {
	opts := slices.Clip(n.cfg.dataOpts)
	if m.VocabSize > 0 {
		opts = append(opts, data.WithVocabSize(m.VocabSize))
	}
	if b, ok := n.backend.(serverBackend); ok {
		opts = append(opts, data.WithServerURL(b.URL()))
	}
	st := m.Store
	return append(opts, data.WithObjectOpener(func(ctx context.Context, location string) (data.Source, error) {
		return n.openObject(ctx, location, st)
	}))
}

// openObject opens an s3://bucket/key token file: the location's bucket at
// the run's store endpoint and region, as a recorded s3:// checkpoint is
// downloaded (downloadCheckpoint).
func (n *Node) openObject(ctx context.Context, location string, st coordinator.CheckpointStore) (data.Source, error) {
	bucket, key, err := data.ParseS3(location)
	if err != nil {
		return nil, err
	}
	sc := store.FromRun(st)
	sc.URL = data.S3Prefix + bucket
	s, err := store.Open(sc, n.storeOptions()...)
	if err != nil {
		return nil, err
	}
	o, err := s.OpenObject(ctx, key)
	if err != nil {
		return nil, err
	}
	return o, nil
}
