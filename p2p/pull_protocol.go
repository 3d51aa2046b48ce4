package p2p

import (
	"encoding/binary"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// The pull protocol: the fallback for a lost gossip message. A node opens a
// direct stream to a peer, asks for every announcement the peer holds for one
// step of one run, and validates each answer exactly as if it had arrived by
// gossip (so a peer can only hand over announcements someone really signed).
//
// Protocol id PullProtocol. The requester writes one request and closes its
// write side; the responder writes one response and closes. Encoding version
// 1, little-endian:
//
//	request:  0 u8 version (1) | 1 u8 run id length L (≤ 32) | 2 L run id | 2+L u32 step
//	response: 0 u8 version (1) | 1 u16 count N (≤ MaxPullAnnouncements)
//	          then N × ( u32 length M (≤ MaxAnnouncementSize) | M announcement bytes )

// PullProtocol is the libp2p protocol id of the pull fallback.
const PullProtocol = "/psyche/pull/1"

const (
	pullVersion = 1
	// MaxPullAnnouncements bounds one response: one announcement per batch
	// and trainer, and an epoch has at most 256 trainers.
	MaxPullAnnouncements = 4 * coordinator.MaxClients
	// MaxPullRequestSize is the size of the longest pull request.
	MaxPullRequestSize = 2 + coordinator.MaxRunIDLen + 4
	// MaxPullResponseSize bounds what a requester reads from one peer (4 MiB:
	// a thousand typical announcements of a few blocks each). A responder
	// holding more sends what fits.
	MaxPullResponseSize = 4 << 20
)

// PullRequest asks for a step's announcements.
type PullRequest struct {
	RunID string
	Step  uint32
}

// MarshalBinary encodes r in version 1.
func (r PullRequest) MarshalBinary() ([]byte, error) {
	if len(r.RunID) > coordinator.MaxRunIDLen {
		return nil, fmt.Errorf("%w: run id of %d bytes", ErrMalformed, len(r.RunID))
	}
	b := []byte{pullVersion, byte(len(r.RunID))}
	b = append(b, r.RunID...)
	return binary.LittleEndian.AppendUint32(b, r.Step), nil
}

// DecodePullRequest parses a request read from a stream.
func DecodePullRequest(b []byte) (PullRequest, error) {
	var p PullRequest
	if len(b) > MaxPullRequestSize {
		return p, fmt.Errorf("%w: pull request of %d bytes", ErrOversize, len(b))
	}
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != pullVersion {
		return p, fmt.Errorf("%w: pull version %d", ErrVersion, v)
	}
	n := int(r.u8())
	if n > coordinator.MaxRunIDLen {
		return p, fmt.Errorf("%w: run id of %d bytes", ErrMalformed, n)
	}
	p.RunID = string(r.bytes(n))
	p.Step = r.u32()
	if err := r.done(); err != nil {
		return PullRequest{}, err
	}
	return p, nil
}

// EncodePullResponse frames already-encoded announcements.
func EncodePullResponse(items [][]byte) ([]byte, error) {
	if len(items) > MaxPullAnnouncements {
		return nil, fmt.Errorf("%w: %d announcements", ErrOversize, len(items))
	}
	b := []byte{pullVersion}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(items)))
	for _, it := range items {
		if len(it) > MaxAnnouncementSize {
			return nil, fmt.Errorf("%w: announcement of %d bytes", ErrOversize, len(it))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(it)))
		b = append(b, it...)
	}
	return b, nil
}

// DecodePullResponse splits a response into announcement encodings. Each
// still has to be decoded and validated.
func DecodePullResponse(b []byte) ([][]byte, error) {
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != pullVersion {
		return nil, fmt.Errorf("%w: pull version %d", ErrVersion, v)
	}
	n := int(r.u16())
	if n > MaxPullAnnouncements {
		return nil, fmt.Errorf("%w: %d announcements", ErrOversize, n)
	}
	var items [][]byte
	for i := 0; i < n && r.err == nil; i++ {
		m := r.u32()
		if m > MaxAnnouncementSize {
			return nil, fmt.Errorf("%w: announcement of %d bytes", ErrOversize, m)
		}
		if it := r.bytes(int(m)); r.err == nil {
			items = append(items, it)
		}
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return items, nil
}
