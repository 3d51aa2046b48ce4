package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/minio/minio-go/v7"

	"github.com/psyche-go/psyche/trainer/data"
)

// Object is one object of the store's bucket read with range requests: a
// run's token file at s3://bucket/key (data.Source). Every read is pinned
// to the version Open saw (its ETag), so a file replaced while a run trains
// fails the read (data.ErrChanged) instead of mixing two data sets.
type Object struct {
	s    *Store
	info minio.ObjectInfo
	url  string
}

var _ data.Source = (*Object)(nil)

// OpenObject looks up the object key of the store's bucket (one HEAD
// request, under the rules of Open on endpoints and credentials) and
// returns it for reading. A missing object wraps data.ErrNotFound and
// fs.ErrNotExist.
func (s *Store) OpenObject(ctx context.Context, key string) (*Object, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: no object key", ErrSetting)
	}
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		err = finish(ctx, s.explain(err, s.bucket, key))
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %w", data.ErrNotFound, err)
		}
		return nil, err
	}
	if info.Size < 0 {
		return nil, fmt.Errorf("store: s3://%s/%s at %s reports %d bytes", s.bucket, key, s.where, info.Size)
	}
	return &Object{s: s, info: info, url: "s3://" + s.bucket + "/" + key}, nil
}

// String names the object and its endpoint.
func (o *Object) String() string { return o.url + " at " + o.s.where }

// Size is the object's length when it was opened.
func (o *Object) Size(context.Context) (int64, error) { return o.info.Size, nil }

// ReadAt fills p with the bytes at off: one ranged GET (minio retries a
// failed one), refused if the object is no longer the one opened.
func (o *Object) ReadAt(ctx context.Context, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	if off < 0 || off > o.info.Size || int64(len(p)) > o.info.Size-off {
		return fmt.Errorf("%w: %s: wanted bytes [%d, %d) but the object has %d", data.ErrShortRead, o, off, off+int64(len(p)), o.info.Size)
	}
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	err := finish(ctx, o.s.readRange(ctx, o.s.bucket, o.info, off, p))
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && resp.Code == "PreconditionFailed" {
		return fmt.Errorf("%w: %s was replaced since it was opened (its ETag was %s)", data.ErrChanged, o, o.info.ETag)
	}
	return err
}

// Close releases nothing: connections belong to the store's client.
func (o *Object) Close() error { return nil }
