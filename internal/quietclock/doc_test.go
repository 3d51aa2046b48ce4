package quietclock_test

import (
	"fmt"
	"time"

	"github.com/psyche-go/psyche/internal/quietclock"
)

// A server's tick runs on every advance; work in progress holds the clock.
func ExampleClock() {
	clock := quietclock.New(time.Unix(1_800_000_000, 0))
	clock.OnAdvance(func(now time.Time) { fmt.Println("tick at", now.Unix()) })
	done := clock.Work() // e.g. a trainer computing its batch
	// ... Run would not advance the clock now ...
	done()
	clock.Advance(time.Second) // what Run does once nothing has happened for a while
	// Output: tick at 1800000001
}
