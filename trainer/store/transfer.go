package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
)

// Upload copies a checkpoint (a file, or a directory's regular files) to
// url, a directory of this store (CheckpointURL), then reads every object
// back and compares its SHA-256 with the local file's; only then is the
// upload done. Parts that an earlier, killed upload of the same objects left
// are discarded first, and objects under url that this checkpoint does not
// have (an earlier layout) are removed, so a retry after a crash leaves
// exactly this checkpoint.
func (s *Store) Upload(ctx context.Context, local, dst string) error {
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	return finish(ctx, s.upload(ctx, local, dst))
}

func (s *Store) upload(ctx context.Context, local, dst string) error {
	bucket, key, err := splitURL(dst)
	if err != nil {
		return err
	}
	files, err := localFiles(local)
	if err != nil {
		return err
	}
	start, total := time.Now(), int64(0)
	names := map[string]bool{}
	for _, f := range files {
		obj := key + "/" + filepath.Base(f)
		names[obj] = true
		if err := s.client.RemoveIncompleteUpload(ctx, bucket, obj); err != nil {
			if e := s.explain(err, bucket, obj); !errors.Is(e, fs.ErrNotExist) {
				return e
			}
		}
		fi, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		t0 := time.Now()
		s.o.log.Info("uploading", "file", f, "to", "s3://"+bucket+"/"+obj, "bytes", fi.Size())
		_, err = s.client.FPutObject(ctx, bucket, obj, f, minio.PutObjectOptions{
			ContentType: "application/octet-stream", PartSize: s.o.partSize, NumThreads: uint(s.o.parallel)})
		if err != nil {
			return s.explain(err, bucket, obj)
		}
		total += fi.Size()
		s.o.log.Info("uploaded", "object", "s3://"+bucket+"/"+obj, "bytes", fi.Size(), "MB/s", rate(fi.Size(), time.Since(t0)))
	}
	for obj, err := range s.list(ctx, bucket, key+"/") {
		if err != nil {
			return err
		}
		if !names[obj.Key] {
			if err := s.client.RemoveObject(ctx, bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
				return s.explain(err, bucket, obj.Key)
			}
		}
	}
	for _, f := range files {
		if err := s.verify(ctx, f, bucket, key+"/"+filepath.Base(f)); err != nil {
			return err
		}
	}
	s.o.log.Info("checkpoint uploaded and read back", "url", dst, "files", len(files), "bytes", total, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func rate(n int64, d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(n)/1e6/max(d.Seconds(), 1e-6))
}

// localFiles lists a checkpoint's files: the file itself, or a directory's
// regular files (a Hugging Face directory is flat), config.json last.
func localFiles(local string) ([]string, error) {
	fi, err := os.Stat(local)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if !fi.IsDir() {
		return []string{local}, nil
	}
	ents, err := os.ReadDir(local)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	var files []string
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, filepath.Join(local, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("store: %s holds no files", local)
	}
	slices.SortFunc(files, func(a, b string) int {
		ac, bc := filepath.Base(a) == "config.json", filepath.Base(b) == "config.json"
		if ac != bc {
			if ac {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return files, nil
}

// verify reads an object back and compares its SHA-256 with the file's.
func (s *Store) verify(ctx context.Context, file, bucket, obj string) error {
	want, err := fileHash(file)
	if err != nil {
		return err
	}
	o, err := s.client.GetObject(ctx, bucket, obj, minio.GetObjectOptions{})
	if err != nil {
		return s.explain(err, bucket, obj)
	}
	defer o.Close()
	h := sha256.New()
	if _, err := io.Copy(h, o); err != nil {
		return s.explain(err, bucket, obj)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: s3://%s/%s has SHA-256 %s, the uploaded file %s", ErrVerify, bucket, obj, got, want)
	}
	return nil
}

func fileHash(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// list yields the objects directly under prefix (not deeper). The listing
// is the store's word, so it is bounded as it is read, not after: more than
// maxObjects entries, a key that is not an object directly under prefix, a
// negative size, or a listing still going at the list timeout is refused
// (ErrListing), and so is a page longer than maxPage bytes (bounded).
func (s *Store) list(ctx context.Context, bucket, prefix string) func(yield func(minio.ObjectInfo, error) bool) {
	return func(yield func(minio.ObjectInfo, error) bool) {
		where := "s3://" + bucket + "/" + prefix + " at " + s.where
		lctx, cancel := context.WithTimeout(ctx, s.o.listTimeout)
		defer cancel()
		// The listing ends without an error when its context does.
		ended := func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if lctx.Err() != nil {
				return fmt.Errorf("%w: %s: the listing took longer than %v", ErrListing, where, s.o.listTimeout)
			}
			return nil
		}
		n := 0
		for obj := range s.client.ListObjectsIter(lctx, bucket, minio.ListObjectsOptions{Prefix: prefix, MaxKeys: min(s.o.maxObjects+1, 1000)}) {
			if obj.Err != nil {
				err := ended()
				if err == nil && errors.Is(obj.Err, ErrListing) {
					err = fmt.Errorf("%w: %s: %v", ErrListing, where, obj.Err)
				} else if err == nil {
					err = s.explain(obj.Err, bucket, prefix)
				}
				yield(minio.ObjectInfo{}, err)
				return
			}
			if n++; n > s.o.maxObjects {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists more than %d entries", ErrListing, where, s.o.maxObjects))
				return
			}
			rest, ok := strings.CutPrefix(obj.Key, prefix)
			if !ok || rest == "" || strings.Contains(strings.TrimSuffix(rest, "/"), "/") {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists %q, which is not directly under it", ErrListing, where, obj.Key))
				return
			}
			if strings.HasSuffix(rest, "/") {
				continue // a "directory" entry
			}
			if obj.Size < 0 {
				yield(minio.ObjectInfo{}, fmt.Errorf("%w: %s lists %q with %d bytes", ErrListing, where, obj.Key, obj.Size))
				return
			}
			if !yield(obj, nil) {
				return
			}
		}
		if err := ended(); err != nil {
			yield(minio.ObjectInfo{}, err)
		}
	}
}

// Download copies the checkpoint at src (s3://bucket/key: a .safetensors
// object, or a directory of objects) into dir and returns the local path
// to load: the file, or dir itself. Each object is fetched as parallel range
// requests written in place; a file appears under its name only once whole.
// At most maxBytes are accepted in all (0: no limit), so a checkpoint URL
// cannot fill the disk: the listing is refused as soon as its sizes add up
// to more (ErrTooLarge), or it is refused for what list refuses
// (ErrListing), before anything is written. A src with nothing under it
// wraps fs.ErrNotExist.
func (s *Store) Download(ctx context.Context, src, dir string, maxBytes int64) (string, error) {
	ctx, cancel := begin(ctx)
	defer cancel(nil)
	p, err := s.download(ctx, src, dir, maxBytes)
	return p, finish(ctx, err)
}

func (s *Store) download(ctx context.Context, src, dir string, maxBytes int64) (string, error) {
	bucket, key, err := splitURL(src)
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", fmt.Errorf("%w: %q names a bucket, not a checkpoint", ErrSetting, src)
	}
	var objs []minio.ObjectInfo
	var total int64
	names := map[string]bool{}
	accept := func(o minio.ObjectInfo) error {
		base := path.Base(o.Key)
		switch {
		case base == "." || base == ".." || strings.ContainsAny(base, `/\`):
			return fmt.Errorf("%w: %s: object %q has no usable file name", ErrListing, src, o.Key)
		case names[base]:
			return fmt.Errorf("%w: %s: %q is listed twice", ErrListing, src, base)
		case o.Size < 0:
			return fmt.Errorf("%w: %s: object %q has %d bytes", ErrListing, src, o.Key, o.Size)
		case maxBytes > 0 && o.Size > maxBytes-total:
			return fmt.Errorf("%w: %s holds more than %d bytes (%d listed so far), the run's model at most %d", ErrTooLarge, src, maxBytes, total+o.Size, maxBytes)
		case o.Size > math.MaxInt64-total:
			return fmt.Errorf("%w: %s: the listed sizes overflow", ErrListing, src)
		}
		names[base] = true
		total += o.Size
		objs = append(objs, o)
		return nil
	}
	single := strings.HasSuffix(key, ".safetensors")
	if single {
		info, err := s.client.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return "", s.explain(err, bucket, key)
		}
		if err := accept(info); err != nil {
			return "", err
		}
	} else {
		for obj, err := range s.list(ctx, bucket, strings.TrimSuffix(key, "/")+"/") {
			if err == nil {
				err = accept(obj)
			}
			if err != nil {
				return "", err
			}
		}
		if len(objs) == 0 {
			return "", fmt.Errorf("store: %s: no objects under it: %w", src, fs.ErrNotExist)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	start := time.Now()
	s.o.log.Info("downloading the checkpoint", "url", src, "files", len(objs), "bytes", total)
	for _, o := range objs {
		if err := s.fetch(ctx, bucket, o, filepath.Join(dir, path.Base(o.Key))); err != nil {
			return "", err
		}
	}
	s.o.log.Info("checkpoint downloaded", "url", src, "bytes", total, "MB/s", rate(total, time.Since(start)))
	if single {
		return filepath.Join(dir, path.Base(key)), nil
	}
	return dir, nil
}

// fetch writes one object to dst with parallel range requests.
func (s *Store) fetch(ctx context.Context, bucket string, o minio.ObjectInfo, dst string) error {
	tmp := dst + ".partial"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer os.Remove(tmp) // after the rename: nothing
	defer f.Close()
	if err := f.Truncate(o.Size); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	offs := make(chan int64)
	var wg sync.WaitGroup
	for range min(s.o.parallel, int((o.Size+s.o.rangeSize-1)/s.o.rangeSize)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, s.o.rangeSize)
			for off := range offs {
				n := min(s.o.rangeSize, o.Size-off)
				if err := s.readRange(ctx, bucket, o, off, buf[:n]); err != nil {
					cancel(err)
					return
				}
				if _, err := f.WriteAt(buf[:n], off); err != nil {
					cancel(fmt.Errorf("store: %w", err))
					return
				}
			}
		}()
	}
send:
	for off := int64(0); off < o.Size; off += s.o.rangeSize {
		select {
		case offs <- off:
		case <-ctx.Done():
			break send
		}
	}
	close(offs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return os.Rename(tmp, dst)
}

// readRange reads p from offset off of the object, pinned to the version
// listed (its ETag): an object replaced meanwhile fails the read rather
// than mixing two uploads.
func (s *Store) readRange(ctx context.Context, bucket string, o minio.ObjectInfo, off int64, p []byte) error {
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+int64(len(p))-1); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if o.ETag != "" {
		if err := opts.SetMatchETag(o.ETag); err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	r, err := s.client.GetObject(ctx, bucket, o.Key, opts)
	if err != nil {
		return s.explain(err, bucket, o.Key)
	}
	defer r.Close()
	if _, err := io.ReadFull(r, p); err != nil {
		return s.explain(err, bucket, o.Key)
	}
	return nil
}
