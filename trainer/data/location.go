package data

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/psyche-go/psyche/chain"
)

// Data location forms beyond a local path, a file:// or http(s):// URL and
// a built-in corpus.
const (
	// ServerPrefix starts a location served by the run's coordinator
	// server (psyche server --data DIR): "server:tokens/shard0.bin" is
	// DIR/tokens/shard0.bin, fetched by each trainer from the server it
	// talks to, at chain.ServerDataPath + the path. The run names no host, so
	// every trainer reaches the data where it reaches the server.
	ServerPrefix = "server:"
	// S3Prefix starts an object of an S3-compatible bucket,
	// "s3://bucket/key", read through the run's checkpoint store settings
	// (endpoint, region) and the trainer's own rules on credentials.
	S3Prefix = "s3://"
)

// maxS3Key is S3's longest object key, in bytes.
const maxS3Key = 1024

// ServerPath returns the path under the server's data directory that a
// "server:" location names, checked as the server checks it (chain.ValidDataPath);
// ok is false for any other location.
func ServerPath(location string) (path string, ok bool, err error) {
	p, ok := strings.CutPrefix(location, ServerPrefix)
	if !ok {
		return "", false, nil
	}
	if err := chain.ValidDataPath(p); err != nil {
		return "", true, fmt.Errorf("data location %q: %w", location, err)
	}
	return p, true, nil
}

// ServerDataURL is the URL of path (chain.ValidDataPath) on the server at base
// (http(s)://host[:port], perhaps with a path prefix).
func ServerDataURL(base, path string) (string, error) {
	if err := chain.ValidDataPath(path); err != nil {
		return "", err
	}
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("server URL %q is not http(s)://host[:port]", base)
	}
	els := strings.Split(path, "/")
	for i, el := range els {
		els[i] = url.PathEscape(el)
	}
	return u.String() + chain.ServerDataPath + strings.Join(els, "/"), nil
}

// ParseS3 reads an "s3://bucket/key" data location. The bucket follows S3's
// naming rules (3-63 of a-z, 0-9, '.', '-', starting and ending with a letter
// or digit); the key is a whole object's (not empty, not ending in '/', at
// most 1,024 bytes of UTF-8).
func ParseS3(location string) (bucket, key string, err error) {
	bucket, key, err = parseS3(location)
	if err != nil {
		return "", "", fmt.Errorf("data location %q: %w", location, err)
	}
	return bucket, key, nil
}

func parseS3(location string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(location, S3Prefix)
	if !ok {
		return "", "", fmt.Errorf("not an s3:// URL")
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if err := checkBucket(bucket); err != nil {
		return "", "", err
	}
	switch {
	case key == "":
		return "", "", fmt.Errorf("names a bucket, not a token file: write s3://%s/KEY", bucket)
	case strings.HasSuffix(key, "/"):
		return "", "", fmt.Errorf("ends in '/', a directory: name the token file's object")
	case len(key) > maxS3Key || !utf8.ValidString(key):
		return "", "", fmt.Errorf("the key is not an S3 key (at most %d bytes of UTF-8)", maxS3Key)
	case strings.ContainsAny(key, "?#\x00"):
		return "", "", fmt.Errorf("the key holds '?', '#' or NUL: name the object itself, with no query")
	}
	return bucket, key, nil
}

func checkBucket(b string) error {
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("bucket name %q must have 3 to 63 characters", b)
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	for i := 0; i < len(b); i++ {
		if c := b[i]; !alnum(c) && c != '.' && c != '-' {
			return fmt.Errorf("bucket name %q may hold only a-z, 0-9, '.' and '-'", b)
		}
	}
	if !alnum(b[0]) || !alnum(b[len(b)-1]) {
		return fmt.Errorf("bucket name %q must start and end with a letter or digit", b)
	}
	return nil
}

// CheckLocation says whether a run's data location can be opened by a
// trainer at all, without opening it, and if not what is wrong (the error
// does not repeat the location): a built-in corpus's name, a server:
// path, an s3:// URL, an http(s):// URL with a host, a file:// URL or a
// local path. Run files are checked with it, so a typo fails the update
// instead of every trainer.
func CheckLocation(location string) error {
	if location == "" {
		return fmt.Errorf("empty data location")
	}
	if name, ok := strings.CutPrefix(location, BuiltinPrefix); ok {
		for _, b := range Builtins() {
			if b == name {
				return nil
			}
		}
		return fmt.Errorf("no such built-in corpus (the built-in ones are %s%s)",
			BuiltinPrefix, strings.Join(Builtins(), ", "+BuiltinPrefix))
	}
	if p, ok := strings.CutPrefix(location, ServerPrefix); ok {
		return chain.ValidDataPath(p)
	}
	scheme, _, isURL := strings.Cut(location, "://")
	if !isURL {
		return nil // a local path
	}
	var err error
	switch strings.ToLower(scheme) {
	case "s3":
		_, _, err = parseS3(location)
	case "http", "https":
		_, err = newHTTPSource(location, &config{})
	case "file":
		_, err = fileURLPath(location)
	default:
		err = fmt.Errorf("unsupported scheme %q: use a local path, file://, http(s)://, s3://bucket/key, %sPATH or %s%s",
			scheme, ServerPrefix, BuiltinPrefix, Builtins()[0])
	}
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "data: "))
	}
	return nil
}

// Describe says in a few words where a run's data comes from, for status
// output and the explorer: "server /data/tokens.bin", the s3:// or http(s)
// URL (without its query), "built-in corpus opticks", or "file PATH on
// every trainer".
func Describe(location string) string {
	if name, ok := strings.CutPrefix(location, BuiltinPrefix); ok {
		return "built-in corpus " + name
	}
	if p, ok, err := ServerPath(location); ok && err == nil {
		return "server " + chain.ServerDataPath + p
	}
	scheme, _, isURL := strings.Cut(location, "://")
	switch strings.ToLower(scheme) {
	case "http", "https":
		if s, err := newHTTPSource(location, &config{}); err == nil {
			return s.String()
		}
	case "s3":
		return location
	case "file":
		if p, err := fileURLPath(location); err == nil {
			return "file " + p + " on every trainer"
		}
	}
	if !isURL {
		return "file " + location + " on every trainer"
	}
	return location
}
