package libp2p

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/psyche-go/psyche/p2p"

	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	pbv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/pb"
)

// TestReservationErrorWording: a relay's refusal is logged as its status
// and reason, not as go-libp2p's "err: %!s(<nil>)".
func TestReservationErrorWording(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{client.ReservationError{Status: pbv2.Status_RESERVATION_REFUSED, Reason: "too many reservations"},
			"the relay answered RESERVATION_REFUSED (too many reservations)"},
		{client.ReservationError{Status: pbv2.Status_PERMISSION_DENIED}, "the relay answered PERMISSION_DENIED"},
		{errors.New("dial backoff"), "dial backoff"},
	} {
		got := reservationError(tc.err)
		if got != tc.want || strings.Contains(got, "%!") {
			t.Errorf("reservationError(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestRejectLevels: the first refusal of a reason from a peer is a
// warning, except a view-dependent one and a replay (ignored, not
// punished: every healthy restart logged "announcement refused
// reason=replayed" as a warning); repeats are DEBUG.
func TestRejectLevels(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want []string // the levels of two refusals in a row
	}{
		{p2p.ErrBadSignature, []string{"WARN", "DEBUG"}},
		{p2p.ErrReplayed, []string{"DEBUG", "DEBUG"}},
		{p2p.ErrStepOutOfWindow, []string{"DEBUG", "DEBUG"}},
	} {
		var log bytes.Buffer
		n := &Node{log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})), m: NewMetrics(nil),
			rejectLogged: map[rejectKey]bool{}}
		n.reject(tc.err, peer.ID("remote"))
		n.reject(tc.err, peer.ID("remote"))
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			_, after, _ := strings.Cut(line, "level=")
			level, _, _ := strings.Cut(after, " ")
			got = append(got, level)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: levels %v, want %v", tc.err, got, tc.want)
		}
	}
}
