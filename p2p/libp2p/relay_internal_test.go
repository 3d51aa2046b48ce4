package libp2p

import (
	"errors"
	"strings"
	"testing"

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
