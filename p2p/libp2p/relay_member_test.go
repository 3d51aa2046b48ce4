package libp2p

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// logLines hands each log line to a channel.
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l <- line
	}
	return len(p), nil
}

// TestRelayRefusesANonMemberQuietly: a server's relay admits its runs'
// members only, so a trainer that is no member yet (it has not joined, or
// sits an epoch out) is refused; that is no fault, and it stays DEBUG
// however long it lasts (a restarted trainer warned "no reservation on a
// relay … PERMISSION_DENIED" while it sat an epoch out). Once the trainer
// is a member (its key in the allowlist it is given, as the relay's), it
// asks again and holds a reservation.
func TestRelayRefusesANonMemberQuietly(t *testing.T) {
	self := clientIDOf("late")
	b := startBootstrap(t, true, clientIDOf("other"))
	lines := make(logLines, 256)
	log := slog.New(slog.NewTextHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := startNode(t, "late", WithRelays(b.Addrs()...), WithLogger(log))
	n.SetClients([]coordinator.ClientID{clientIDOf("other")})
	refused := 0
	for refused <= warnAfterFailures {
		select {
		case l := <-lines:
			if strings.Contains(l, "level=WARN") {
				t.Fatalf("a non-member's refusal warned: %s", l)
			}
			if strings.Contains(l, "no reservation on a relay") {
				refused++
			}
		case <-time.After(2 * time.Minute): // a hang guard: the backoff is seconds
			t.Fatalf("%d refusals logged, want %d", refused, warnAfterFailures+1)
		}
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the node logs on; a full channel would hold it
		for {
			select {
			case <-lines:
			case <-stop:
				return
			}
		}
	}()
	b.SetRuns(map[string][]coordinator.Pubkey{testRun: {clientIDOf("other").P2P, self.P2P}})
	n.SetClients([]coordinator.ClientID{clientIDOf("other"), self})
	eventually(t, 2*time.Minute, "a reservation once a member", func() bool {
		for _, a := range n.Addrs() {
			if strings.Contains(a, "/p2p-circuit") {
				return true
			}
		}
		return false
	})
}
