package store

import (
	"net/http"
	"net/url"
)

// WithLocalEndpoints lets a run's endpoint that the trainer did not name be
// on this machine: the tests' servers posing as a run's endpoint listen on
// 127.0.0.1.
func WithLocalEndpoints() Option {
	return func(o *options) error { o.allowLocal = true; return nil }
}

// WithProxy replaces the environment's proxy (read once per process).
func WithProxy(f func(*http.Request) (*url.URL, error)) Option {
	return func(o *options) error { o.proxy = f; return nil }
}
