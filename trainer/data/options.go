package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// Option configures a Provider or a source. Options that do not concern the
// thing being built are ignored (WithShuffleSeed means nothing to a
// FileSource), so one option list can be passed to Open.
type Option func(*config) error

// config is what the options set; newConfig fills in the defaults.
type config struct {
	shuffle        bool
	seed           uint64
	vocabSize      uint32 // 0: tokens are not checked
	client         *http.Client
	retries        int
	backoffBase    time.Duration
	backoffMax     time.Duration
	requestTimeout time.Duration
	logger         *slog.Logger
	serverURL      string                                                     // WithServerURL
	openObject     func(ctx context.Context, location string) (Source, error) // WithObjectOpener
}

// Defaults for the HTTP source.
const (
	DefaultRetries        = 5
	DefaultBackoffBase    = 250 * time.Millisecond
	DefaultBackoffMax     = 10 * time.Second
	DefaultRequestTimeout = time.Minute
)

func newConfig(opts []Option) (*config, error) {
	c := &config{
		client:         &http.Client{},
		retries:        DefaultRetries,
		backoffBase:    DefaultBackoffBase,
		backoffMax:     DefaultBackoffMax,
		requestTimeout: DefaultRequestTimeout,
		logger:         slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("data: nil Option")
		}
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// WithShuffleSeed makes the Provider visit sequences in a pseudo-random order
// keyed by seed instead of in file order. Any seed, 0 included, shuffles.
func WithShuffleSeed(seed uint64) Option {
	return func(c *config) error {
		c.shuffle, c.seed = true, seed
		return nil
	}
}

// WithVocabSize makes the Provider reject (with ErrTokenRange) any token that
// is not below size, so a corrupt or mismatched file fails loudly instead of
// indexing past the model's embedding table. By default tokens are not checked.
func WithVocabSize(size uint32) Option {
	return func(c *config) error {
		if size == 0 {
			return errors.New("data: WithVocabSize: size must be positive")
		}
		c.vocabSize = size
		return nil
	}
}

// WithHTTPClient sets the client the HTTP source uses (default: a new
// http.Client on http.DefaultTransport). The client's own Timeout, if any,
// applies on top of WithRequestTimeout.
func WithHTTPClient(client *http.Client) Option {
	return func(c *config) error {
		if client == nil {
			return errors.New("data: WithHTTPClient: nil client")
		}
		c.client = client
		return nil
	}
}

// WithRetries sets how many times the HTTP source retries a request after a
// transient failure (a network error, a 5xx or a 429); 0 disables retries.
// The default is DefaultRetries. Under RetryUntil, retries go on past it
// until that time.
func WithRetries(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("data: WithRetries: retries must not be negative, got %d", n)
		}
		c.retries = n
		return nil
	}
}

// WithBackoff sets the HTTP source's retry backoff: the wait before retry k
// (counting from 0) is about base·2^k, capped at limit, with random jitter so
// that many trainers do not retry in lockstep. A Retry-After header is
// honoured up to limit. The defaults are DefaultBackoffBase and DefaultBackoffMax.
func WithBackoff(base, limit time.Duration) Option {
	return func(c *config) error {
		if base <= 0 || limit < base {
			return fmt.Errorf("data: WithBackoff: need 0 < base ≤ limit, got base %v, limit %v", base, limit)
		}
		c.backoffBase, c.backoffMax = base, limit
		return nil
	}
}

// WithRequestTimeout bounds each HTTP attempt; an attempt that runs out of
// time counts as a transient failure and is retried. 0 means no bound beyond
// the caller's ctx. The default is DefaultRequestTimeout.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("data: WithRequestTimeout: timeout must not be negative, got %v", d)
		}
		c.requestTimeout = d
		return nil
	}
}

// WithLogger sets the logger for retries and other events worth knowing
// about. By default nothing is logged.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) error {
		if logger == nil {
			return errors.New("data: WithLogger: nil logger")
		}
		c.logger = logger
		return nil
	}
}

// WithServerURL is the coordinator server this trainer talks to
// (http(s)://host[:port]): a "server:PATH" location is read from it, at
// ServerDataPath + PATH, with range requests as any http(s) URL. Without
// it (a trainer on Solana), such a location fails to open, saying so.
func WithServerURL(base string) Option {
	return func(c *config) error {
		if _, err := ServerDataURL(base, "x"); err != nil {
			return fmt.Errorf("data: WithServerURL: %w", err)
		}
		c.serverURL = base
		return nil
	}
}

// WithObjectOpener opens "s3://bucket/key" locations. The trainer gives one
// that reads through its checkpoint store client (trainer/store), under the
// run's store endpoint and its own rules on credentials; this package
// speaks no S3 itself. Without it, such a location fails to open.
func WithObjectOpener(open func(ctx context.Context, location string) (Source, error)) Option {
	return func(c *config) error {
		if open == nil {
			return errors.New("data: WithObjectOpener: nil function")
		}
		c.openObject = open
		return nil
	}
}
