package explorer

import (
	"fmt"
	"testing"
)

// Event streams are bounded per address and in all; a released stream
// frees its place.
func TestStreamLimits(t *testing.T) {
	l := &streamLimit{byAddr: map[string]int{}}
	var releases []func()
	for i := range maxStreamsPerAddr {
		r, ok := l.acquire(fmt.Sprintf("10.0.0.1:%d", 1000+i))
		if !ok {
			t.Fatalf("stream %d of one address refused", i)
		}
		releases = append(releases, r)
	}
	if _, ok := l.acquire("10.0.0.1:9999"); ok {
		t.Fatal("one address held more than maxStreamsPerAddr streams")
	}
	if r, ok := l.acquire("10.0.0.2:1"); !ok {
		t.Fatal("another address was refused")
	} else {
		r()
	}
	releases[0]()
	releases[0]() // twice: counted once
	if _, ok := l.acquire("10.0.0.1:9999"); !ok {
		t.Fatal("a released stream did not free its place")
	}
	if _, ok := l.acquire("10.0.0.1:9998"); ok {
		t.Fatal("releasing twice freed two places")
	}
	for i := 0; l.total < maxStreams; i++ {
		if _, ok := l.acquire(fmt.Sprintf("10.1.%d.%d:1", i/250, i%250)); !ok {
			t.Fatalf("refused below the total limit at %d streams", l.total)
		}
	}
	if _, ok := l.acquire("10.9.9.9:1"); ok {
		t.Fatal("more than maxStreams streams")
	}
}
