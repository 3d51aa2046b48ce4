package memwatch

import (
	"errors"
	"testing"
)

var kept []byte

// A buffer f still holds when it returns is seen whole; f's error comes
// back as it is.
func TestHeapPeak(t *testing.T) {
	const size = 64 << 20
	peak, err := HeapPeak(func() error {
		kept = make([]byte, size)
		return nil
	})
	if err != nil || peak < size {
		t.Fatalf("HeapPeak = %.0f bytes, %v; want at least %d", peak, err, size)
	}
	kept = nil
	boom := errors.New("boom")
	if _, err := HeapPeak(func() error { return boom }); err != boom {
		t.Fatalf("the error came back as %v", err)
	}
}
