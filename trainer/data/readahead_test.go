package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
)

// memRanges serves ranges of a byte slice, counting the requests in flight.
type memRanges struct {
	b        []byte
	failAt   int64 // -1: never
	mu       sync.Mutex
	inFlight int
	most     int
	gate     chan struct{} // each request waits for a token (nil: none)
}

func (m *memRanges) ReadAt(ctx context.Context, p []byte, off int64) error {
	m.mu.Lock()
	m.inFlight++
	m.most = max(m.most, m.inFlight)
	m.mu.Unlock()
	defer func() { m.mu.Lock(); m.inFlight--; m.mu.Unlock() }()
	if m.gate != nil {
		select {
		case <-m.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if off == m.failAt {
		return fmt.Errorf("range at %d: %w", off, io.ErrUnexpectedEOF)
	}
	copy(p, m.b[off:])
	return nil
}

func TestReadAhead(t *testing.T) {
	b := make([]byte, 1000)
	for i := range b {
		b[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		size, chunk int64
		workers     int
	}{{1000, 64, 4}, {1000, 1000, 4}, {1000, 1, 3}, {999, 100, 1}, {0, 10, 2}, {1000, 7, 16}} {
		m := &memRanges{b: b, failAt: -1}
		r := ReadAhead(context.Background(), m, tc.size, tc.chunk, tc.workers)
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, b[:tc.size]) {
			t.Errorf("%+v: %d bytes, %v", tc, len(got), err)
		}
	}
}

// The requests overlap, never more than the workers asked for; a failed
// range ends the stream with its error.
func TestReadAheadParallelAndErrors(t *testing.T) {
	b := make([]byte, 1<<16)
	m := &memRanges{b: b, failAt: -1, gate: make(chan struct{})}
	r := ReadAhead(context.Background(), m, int64(len(b)), 1024, 4)
	done := make(chan []byte)
	go func() { got, _ := io.ReadAll(r); done <- got }()
	for range 64 {
		m.gate <- struct{}{}
	}
	if got := <-done; len(got) != len(b) {
		t.Fatalf("%d bytes", len(got))
	}
	r.Close()
	if m.most < 2 || m.most > 4 {
		t.Errorf("at most %d requests in flight, want 2..4", m.most)
	}
	m = &memRanges{b: b, failAt: 3 * 1024}
	r = ReadAhead(context.Background(), m, int64(len(b)), 1024, 4)
	got, err := io.ReadAll(r)
	r.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(got) != 3*1024 {
		t.Errorf("a failed range: %d bytes, %v", len(got), err)
	}
}
