package data

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestServerPath(t *testing.T) {
	for _, tc := range []struct {
		loc, path, err string
		notServer      bool
	}{
		{loc: "server:tokens.bin", path: "tokens.bin"},
		{loc: "server:shards/a b/0.bin", path: "shards/a b/0.bin"},
		{loc: "server:", err: "empty path"},
		{loc: "server:/etc/passwd", err: "absolute"},
		{loc: "server:../secret", err: `"." or ".."`},
		{loc: "server:a/../../b", err: `"." or ".."`},
		{loc: "server:a//b", err: "empty"},
		{loc: "server:a/./b", err: `"." or ".."`},
		{loc: "server:a/", err: "empty"},
		{loc: "server:.git/config", err: "hidden"},
		{loc: "server:a/.env", err: "hidden"},
		{loc: `server:a\..\b`, err: "backslash"},
		{loc: "server:a\x00b", err: "NUL"},
		{loc: "server:\xff", err: "UTF-8"},
		{loc: "tokens.bin", notServer: true},
		{loc: "https://example.com/server:x", notServer: true},
	} {
		p, ok, err := ServerPath(tc.loc)
		switch {
		case ok == tc.notServer:
			t.Errorf("%q: server location %v", tc.loc, ok)
		case tc.err == "" && (err != nil || p != tc.path):
			t.Errorf("%q: %q, %v; want %q", tc.loc, p, err, tc.path)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error saying %q", tc.loc, err, tc.err)
		}
	}
}

func TestServerDataURL(t *testing.T) {
	for _, tc := range []struct{ base, path, want string }{
		{"http://127.0.0.1:7600", "tokens.bin", "http://127.0.0.1:7600/data/tokens.bin"},
		{"https://coord.example/", "a b/c?d#e.bin", "https://coord.example/data/a%20b/c%3Fd%23e.bin"},
		{"http://h:1/prefix", "x", "http://h:1/prefix/data/x"},
		{"ftp://h", "x", ""},
		{"127.0.0.1:7600", "x", ""},
		{"http://h", "../x", ""},
	} {
		got, err := ServerDataURL(tc.base, tc.path)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%s + %s: %q, %v; want %q", tc.base, tc.path, got, err, tc.want)
		}
	}
}

func TestParseS3(t *testing.T) {
	for _, tc := range []struct{ loc, bucket, key, err string }{
		{loc: "s3://tokens/run1/train.bin", bucket: "tokens", key: "run1/train.bin"},
		{loc: "s3://my.bucket-2/a", bucket: "my.bucket-2", key: "a"},
		{loc: "s3://tokens", err: "names a bucket"},
		{loc: "s3://tokens/", err: "names a bucket"},
		{loc: "s3://tokens/dir/", err: "directory"},
		{loc: "s3://ab/x", err: "3 to 63"},
		{loc: "s3://Tokens/x", err: "a-z"},
		{loc: "s3://tok_ens/x", err: "a-z"},
		{loc: "s3://-tokens/x", err: "start and end"},
		{loc: "s3:///x", err: "3 to 63"},
		{loc: "s3://tokens/x?versionId=3", err: "query"},
		{loc: "s3://tokens/" + strings.Repeat("k", 1025), err: "not an S3 key"},
		{loc: "http://tokens/x", err: "not an s3:// URL"},
	} {
		b, k, err := ParseS3(tc.loc)
		switch {
		case tc.err == "" && (err != nil || b != tc.bucket || k != tc.key):
			t.Errorf("%q: %q %q %v", tc.loc, b, k, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error saying %q", tc.loc, err, tc.err)
		}
	}
}

func TestCheckLocationAndDescribe(t *testing.T) {
	for _, tc := range []struct{ loc, err, describe string }{
		{loc: "builtin:opticks", describe: "built-in corpus opticks"},
		{loc: "builtin:nope", err: "no such built-in corpus"},
		{loc: "server:tokens.bin", describe: "server /data/tokens.bin"},
		{loc: "server:../x", err: `".."`},
		{loc: "s3://tokens/train.bin", describe: "s3://tokens/train.bin"},
		{loc: "s3://tokens", err: "names a bucket"},
		{loc: "https://h.example/t.bin?sig=secret", describe: "https://h.example/t.bin?…"},
		{loc: "http://", err: "no host"},
		{loc: "file:///data/t.bin", describe: "file /data/t.bin on every trainer"},
		{loc: "file://other/t.bin", err: "only local files"},
		{loc: "/data/t.bin", describe: "file /data/t.bin on every trainer"},
		{loc: "ftp://h/t.bin", err: `unsupported scheme "ftp"`},
		{loc: "", err: "empty"},
	} {
		err := CheckLocation(tc.loc)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.loc, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error saying %q", tc.loc, err, tc.err)
		}
		if tc.describe != "" {
			if got := Describe(tc.loc); got != tc.describe {
				t.Errorf("Describe(%q) = %q, want %q", tc.loc, got, tc.describe)
			}
		}
	}
}

// TestOpenServerAndObjectLocations: a server: location is read from the
// server WithServerURL names, at /data/, and fails to open, saying why,
// without one; an s3:// location goes to WithObjectOpener.
func TestOpenServerAndObjectLocations(t *testing.T) {
	ctx := context.Background()
	file, err := EncodeTokens(nil, Tokenize([]byte("the quick brown fox jumps over the lazy dog")), TokenSize16)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		http.ServeContent(w, r, "t.bin", time.Time{}, strings.NewReader(string(file)))
	}))
	defer hs.Close()
	p, err := Open(ctx, "server:dir/t.bin", TokenSize16, 8, WithServerURL(hs.URL))
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Sequence(ctx, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := Detokenize(got); string(text) != "k brown f" {
		t.Fatalf("sequence 1: %q", text)
	}
	if p.Source() != hs.URL+"/data/dir/t.bin" || paths[0] != "/data/dir/t.bin" {
		t.Errorf("read %s at %v", p.Source(), paths)
	}
	if _, err := Open(ctx, "server:t.bin", TokenSize16, 8); err == nil || !strings.Contains(err.Error(), "talks to none") {
		t.Errorf("server: data without a server: %v", err)
	}
	if _, err := Open(ctx, "server:../t.bin", TokenSize16, 8, WithServerURL(hs.URL)); err == nil || !strings.Contains(err.Error(), `".."`) {
		t.Errorf("server:../t.bin: %v", err)
	}
	if _, err := Open(ctx, "s3://tokens/t.bin", TokenSize16, 8); err == nil || !strings.Contains(err.Error(), "WithObjectOpener") {
		t.Errorf("s3:// data without an opener: %v", err)
	}
	var asked string
	p, err = Open(ctx, "s3://tokens/t.bin", TokenSize16, 8, WithObjectOpener(func(_ context.Context, loc string) (Source, error) {
		asked = loc
		return NewBytesSource(file), nil
	}))
	if err != nil || asked != "s3://tokens/t.bin" || p.NumSequences() != 5 {
		t.Fatalf("s3:// data: %v (asked %q)", err, asked)
	}
	notFound := func(context.Context, string) (Source, error) { return nil, ErrNotFound }
	if _, err := Open(ctx, "s3://tokens/t.bin", TokenSize16, 8, WithObjectOpener(notFound)); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "s3://tokens/t.bin") {
		t.Errorf("a missing object: %v", err)
	}
}

// FuzzDataLocation: a run file's data location (and, through
// ValidDataPath, a request path of the server's /data/) is outside input.
// A server: path that passes stays inside the directory it is joined to,
// and an s3:// location that parses is its bucket and key again.
func FuzzDataLocation(f *testing.F) {
	for _, s := range []string{"server:tokens.bin", "server:a/../b", "server:..", "server:/x", "server:a//b", "server:.x",
		"s3://tokens/a/b.bin", "s3://tokens/", "s3://Ab/x", "https://h/x?y", "builtin:opticks", "file:///x", "x://y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, loc string) {
		_ = CheckLocation(loc)
		_ = Describe(loc)
		if p, ok, err := ServerPath(loc); ok && err == nil {
			if !fs.ValidPath(p) || !filepath.IsLocal(filepath.FromSlash(p)) {
				t.Fatalf("server path %q accepted but not local", p)
			}
			if joined := filepath.Join("/srv/data", filepath.FromSlash(p)); !strings.HasPrefix(joined, "/srv/data/") {
				t.Fatalf("server path %q joins to %q", p, joined)
			}
			if CheckLocation(loc) != nil {
				t.Fatalf("%q: ServerPath accepts what CheckLocation refuses", loc)
			}
		}
		if b, k, err := ParseS3(loc); err == nil {
			if S3Prefix+b+"/"+k != loc {
				t.Fatalf("%q parsed to bucket %q, key %q", loc, b, k)
			}
			if CheckLocation(loc) != nil {
				t.Fatalf("%q: ParseS3 accepts what CheckLocation refuses", loc)
			}
		}
	})
}
