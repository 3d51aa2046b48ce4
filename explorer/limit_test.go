package explorer

import (
	"fmt"
	"testing"
)

// Event streams are bounded per address and in all; a released stream
// frees its place.
func TestStreamLimits(t *testing.T) {
	l := newStreamLimit()
	var releases []func()
	for i := range maxStreamsPerAddr {
		r, ok := l.acquire(fmt.Sprintf("10.0.0.1:%d", 1000+i), nil)
		if !ok {
			t.Fatalf("stream %d of one address refused", i)
		}
		releases = append(releases, r)
	}
	if _, ok := l.acquire("10.0.0.1:9999", nil); ok {
		t.Fatal("one address held more than maxStreamsPerAddr streams")
	}
	if r, ok := l.acquire("10.0.0.2:1", nil); !ok {
		t.Fatal("another address was refused")
	} else {
		r()
	}
	releases[0]()
	releases[0]() // twice: counted once
	if _, ok := l.acquire("10.0.0.1:9999", nil); !ok {
		t.Fatal("a released stream did not free its place")
	}
	if _, ok := l.acquire("10.0.0.1:9998", nil); ok {
		t.Fatal("releasing twice freed two places")
	}
	for i := 0; ; i++ {
		if n, _ := l.pool.Len(""); n >= maxStreams {
			break
		}
		if _, ok := l.acquire(fmt.Sprintf("10.1.%d.%d:1", i/250, i%250), nil); !ok {
			t.Fatalf("refused below the total limit at stream %d", i)
		}
	}
	// Full: a newcomer takes the place of the oldest stream of 10.0.0.1,
	// which holds the most; one from 10.0.0.1 itself is refused (nobody
	// holds two more than it).
	if _, ok := l.acquire("10.9.9.8:1", nil); !ok {
		t.Fatal("a newcomer to a full explorer was refused while one address held 64 streams")
	}
	if n, held := l.pool.Len("10.0.0.1/32"); n != maxStreams || held != maxStreamsPerAddr-1 {
		t.Fatalf("%d streams, 10.0.0.1 holds %d; want %d, %d", n, held, maxStreams, maxStreamsPerAddr-1)
	}
	if _, ok := l.acquire("10.0.0.1:2", nil); ok {
		t.Fatal("the heaviest address shed another's stream")
	}
}

// The per-address cap counts an IPv6 /64 as one address (before, every
// address of a /64 had its own 64 streams), and once the explorer holds
// all it takes, a new address's stream takes the place of the oldest of
// the address group that holds the most: 16 addresses x 64 streams no
// longer keep everyone else out.
func TestStreamLimitsGroupAndShed(t *testing.T) {
	l := newStreamLimit()
	for i := range maxStreamsPerAddr {
		if _, ok := l.acquire(fmt.Sprintf("[2001:db8::%x]:1", i+1), nil); !ok {
			t.Fatalf("stream %d of a /64 refused", i+1)
		}
	}
	if _, ok := l.acquire("[2001:db8::ffff]:1", nil); ok {
		t.Fatal("a /64 held more than maxStreamsPerAddr streams")
	}
	if _, ok := l.acquire("[2001:db8:0:1::1]:1", nil); !ok {
		t.Fatal("the next /64 was refused")
	}
	// 16 IPv4 addresses hold every stream.
	l = newStreamLimit()
	shed := map[string]int{}
	for a := range maxStreams / maxStreamsPerAddr {
		from := fmt.Sprintf("127.0.0.%d", a+1)
		for range maxStreamsPerAddr {
			if _, ok := l.acquire(from+":1", func() { shed[from]++ }); !ok {
				t.Fatalf("a stream of %s refused below the caps", from)
			}
		}
	}
	for i, from := range []string{"127.0.1.1:5", "[::1]:5", "127.0.1.1:6"} {
		if _, ok := l.acquire(from, nil); !ok {
			t.Fatalf("a fresh address's stream %d (%s) refused while the flood holds every stream", i, from)
		}
	}
	total := 0
	for _, n := range shed {
		total += n
	}
	if total != 3 {
		t.Fatalf("%d flood streams shed, want 3", total)
	}
	// The flood addresses that lost one cannot take it back from each other.
	for from := range shed {
		if _, ok := l.acquire(from+":2", nil); ok {
			t.Fatalf("%s took a stream back from another flood address", from)
		}
	}
}
