package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"
	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/urfave/cli/v2"
)

// The rule for what a failing command prints (docs/running.md, "When a
// command fails"): one line, saying what was wrong, where (the file and
// key, the flag, or the URL) and what to do, with no Go-internal text.
// TestErrorsFollowTheRule runs the commands' failure paths against it.

// userMessage is the line psyche prints for err: the error's own text,
// except for the errors of Go's HTTP client and of the backends, which it
// says in the rule's words.
func userMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		at := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" {
			at = u.Scheme + "://" + u.Host
		}
		var dns *net.DNSError
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			// The most common first-hour error: no server where the
			// command looked (the default is 127.0.0.1:7600).
			return fmt.Sprintf("nothing listens at %s (--server): start `psyche server` there, or point --server (PSYCHE_SERVER) or --rpc at a running one", at)
		case ue.Timeout():
			return fmt.Sprintf("%s did not answer in time (--server): check that a psyche server runs there and that the network lets you reach it", at)
		case errors.As(err, &dns):
			return fmt.Sprintf("%s: no such host (--server): check the URL's host name", at)
		default:
			return fmt.Sprintf("cannot reach %s (--server): %s", at, ue.Err)
		}
	}
	msg := err.Error()
	if errors.Is(err, chain.ErrRunNotFound) {
		msg = strings.Replace(msg, chain.ErrRunNotFound.Error(), "no such run", 1) +
			" (--run-id): check the id, or create the run with psyche init-coordinator"
	}
	// A multi-error (errors.Join) is still one line.
	return strings.ReplaceAll(strings.TrimSpace(msg), "\n", "; ")
}

// checkBackendFlags refuses a --server that is not an http(s) URL and a
// --run-id that no run can have, before anything is sent.
func checkBackendFlags(c *cli.Context) error {
	if len(c.StringSlice("rpc")) == 0 {
		if s := c.String("server"); s != "" {
			u, err := url.Parse(s)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("--server %q: not an http:// or https:// URL; give the server's, e.g. http://127.0.0.1:7600", s)
			}
		}
	}
	for _, f := range c.Command.Flags {
		if f == runIDFlag {
			if _, err := coordinator.ParseRunID(c.String("run-id")); err != nil {
				return fmt.Errorf("--run-id %q: not a valid run id: 1-32 characters of A-Z, a-z, 0-9, '.', '_' and '-'", c.String("run-id"))
			}
		}
	}
	return nil
}

// tomlError says a run file's TOML error in one line: the file, the line
// of the fault (the decoder counts the newline that ends a line as the
// next line's: an unclosed "[config" on line 1 was "line 2") and the key.
func tomlError(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: no such file: give the path of a run file (examples/tiny-run.toml is one)", path)
	}
	var pe toml.ParseError
	if errors.As(err, &pe) {
		line := pe.Position.Line
		if b, rerr := os.ReadFile(path); rerr == nil && pe.Position.Start >= 0 && pe.Position.Start <= len(b) {
			line = 1 + bytes.Count(b[:pe.Position.Start], []byte("\n"))
		}
		where := fmt.Sprintf("%s line %d", path, line)
		if pe.LastKey != "" {
			where += " (key " + pe.LastKey + ")"
		}
		return fmt.Errorf("%s: %s: fix the TOML there (examples/tiny-run.toml documents every key)", where, pe.Message)
	}
	return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "toml: "))
}

// ruleKey names the run file's key in a coordinator rule's message: the
// config's rules start with the key ("warmup_time (40) must ..."), the
// model's with the key or its table ("lr base_lr must ...").
func ruleKey(err error) string {
	msg := err.Error()
	for _, p := range []struct {
		wrapped error
		table   string
	}{{coordinator.ErrInvalidConfig, "config."}, {coordinator.ErrInvalidModel, "model."}} {
		rest, ok := strings.CutPrefix(msg, p.wrapped.Error()+": ")
		if !ok {
			continue
		}
		first, tail, _ := strings.Cut(rest, " ")
		if first == "lr" || first == "optimizer" {
			if second, tail2, ok := strings.Cut(tail, " "); ok && strings.Contains(second, "_") {
				return p.table + first + "." + second + " " + tail2
			}
		}
		if strings.Contains(first, "_") || first == "architecture" {
			return p.table + rest
		}
		return strings.TrimSuffix(p.table, ".") + ": " + rest
	}
	return msg
}

// modelError says what is wrong with a --model that psyche could not
// read as a checkpoint.
func modelError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("--model %s: no such file or directory: give a .safetensors file a run wrote, or a Hugging Face model directory", path)
	case errors.Is(err, checkpoint.ErrMalformed):
		what := "not a checkpoint psyche can read"
		if strings.EqualFold(filepath.Ext(path), ".toml") {
			what = "a run file, not a checkpoint"
		}
		return fmt.Errorf("--model %s: %s: give a .safetensors file a run wrote (psyche status shows the recorded one), or a Hugging Face model directory", path, what)
	}
	return fmt.Errorf("--model %s: %s", path, strings.TrimPrefix(trimPackage(err.Error()), path+": "))
}

// trimPackage drops the package prefix (runmodel's or modelspec's) that
// begins a model's load error: it names Go code, not anything a user set.
func trimPackage(msg string) string {
	for _, p := range []string{"runmodel: ", "modelspec: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}
