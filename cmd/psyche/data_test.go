package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/data"
)

func TestDataTokenizeWritesTokenFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "opticks.txt")
	text := data.Opticks()[:5000]
	if err := os.WriteFile(in, text, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args      []string
		tokenSize int
	}{
		{nil, 2}, // the default
		{[]string{"--token-size", "2"}, 2},
		{[]string{"--token-size", "4"}, 4},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			out := filepath.Join(dir, fmt.Sprintf("tokens-%d.bin", len(tc.args)+tc.tokenSize))
			var stdout, stderr bytes.Buffer
			args := append([]string{"psyche", "data", "tokenize", "--in", in, "--out", out}, tc.args...)
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			info, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if info.Size() != int64(len(text)*tc.tokenSize) {
				t.Errorf("file has %d bytes, want %d", info.Size(), len(text)*tc.tokenSize)
			}
			tokens, err := data.ReadTokenFile(context.Background(), out, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tokens, data.Tokenize(text)) {
				t.Error("the file does not hold the text's tokens")
			}
			summary := stdout.String()
			for _, want := range []string{"5000 tokens", fmt.Sprintf("%d bytes", len(text)*tc.tokenSize), out} {
				if !strings.Contains(summary, want) {
					t.Errorf("summary %q lacks %q", summary, want)
				}
			}
		})
	}
}

func TestDataTokenizeErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.bin")
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"missing input", []string{"--in", filepath.Join(dir, "nope.txt"), "--out", out}, "no such file"},
		{"bad token size", []string{"--in", in, "--out", out, "--token-size", "3"}, "--token-size must be 2 or 4"},
		{"no --in", []string{"--out", out}, `"in"`},
		{"output directory missing", []string{"--in", in, "--out", filepath.Join(dir, "no", "out.bin")}, "data: write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(append([]string{"psyche", "data", "tokenize"}, tc.args...), &stdout, &stderr); code == 0 {
				t.Fatal("exit 0")
			}
			if !strings.Contains(stderr.String(), tc.msg) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.msg)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output written despite the error (%v)", err)
			}
		})
	}
}
