// Package memwatch measures how much Go heap a piece of work holds at its
// peak, for benchmarks that compare two ways of moving a model: a path that
// copies the whole model shows its size, one that streams shows a chunk.
package memwatch

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// HeapPeak runs f after a collection and returns the most bytes of live
// and not yet collected heap objects seen above the start while f ran,
// sampled every millisecond (a whole model held for a moment shows; a
// chunk's buffer, reused, stays small).
func HeapPeak(f func() error) (float64, error) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() float64 {
		metrics.Read(sample)
		return float64(sample[0].Value.Uint64())
	}
	base := read()
	peak := base
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, read())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	err := f()
	close(done)
	wg.Wait()
	peak = max(peak, read())
	return peak - base, err
}
