package p2p

import (
	"fmt"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
)

// The checkpoint offer protocol: how a joiner learns which checkpoint to
// fetch. The coordinator only says that the previous epoch's clients hold
// the model; the manifest id that names it is asked of them directly.
//
// Protocol id OfferProtocol. The requester writes one request and closes its
// write side; the responder writes one response and closes. Encoding version
// 1, little-endian:
//
//	request:  the pull request's encoding (pull_protocol.go), with the epoch
//	          whose starting model is wanted in place of the step
//	response: 0 u8 version (1) | 1 u8 count N (0 or 1) | 2 N × 32 manifest id
//
// N is 0 when the peer serves no checkpoint for that epoch.

// OfferProtocol is the libp2p protocol id of checkpoint offers.
const OfferProtocol = "/psyche/checkpoint-offer/1"

const (
	offerVersion = 1
	// MaxOfferResponse is the size of the longest offer response.
	MaxOfferResponse = 2 + 32
)

// EncodeOffer encodes the answer for a checkpoint (ok) or for none.
func EncodeOffer(id coordinator.Hash, ok bool) []byte {
	if !ok {
		return []byte{offerVersion, 0}
	}
	return append([]byte{offerVersion, 1}, id[:]...)
}

// DecodeOffer parses a checkpoint offer: the manifest id, or ok false if the
// peer offers none.
func DecodeOffer(b []byte) (id coordinator.Hash, ok bool, err error) {
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != offerVersion {
		return id, false, fmt.Errorf("%w: offer version %d", ErrVersion, v)
	}
	switch n := r.u8(); {
	case r.err != nil:
	case n > 1:
		return id, false, fmt.Errorf("%w: %d offers", ErrMalformed, n)
	case n == 1:
		copy(id[:], r.bytes(len(id)))
		ok = true
	}
	if err := r.done(); err != nil {
		return coordinator.Hash{}, false, err
	}
	return id, ok, nil
}

// MajorityOffer is the rule a joiner decides by: the manifest id offered by
// more than half of the peers that answered (answered counts every peer
// that answered, with an offer or without; votes counts the peers behind
// each id). A plurality is not enough: with three holders answering, one
// that offers a bogus checkpoint while the others offer none must not win.
// No offer at all wraps ErrNoCheckpoint; offers short of a majority wrap
// ErrCheckpointDisputed.
func MajorityOffer(votes map[coordinator.Hash]int, answered int) (coordinator.Hash, error) {
	if len(votes) == 0 {
		return coordinator.Hash{}, ErrNoCheckpoint
	}
	ids := make([]coordinator.Hash, 0, len(votes))
	total := 0
	for id, n := range votes {
		ids = append(ids, id)
		total += n
	}
	answered = max(answered, total)
	// Most votes first; ties by id, so that the message names the same ids
	// on every node.
	sort.Slice(ids, func(a, b int) bool {
		if votes[ids[a]] != votes[ids[b]] {
			return votes[ids[a]] > votes[ids[b]]
		}
		return string(ids[a][:]) < string(ids[b][:])
	})
	if 2*votes[ids[0]] <= answered {
		return coordinator.Hash{}, fmt.Errorf("%w: %d of %d peers that answered offer %x, short of a majority", ErrCheckpointDisputed,
			votes[ids[0]], answered, ids[0][:8])
	}
	return ids[0], nil
}
