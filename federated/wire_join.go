package federated

import (
	"crypto/ed25519"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// A join request (KindJoin) makes its signer a member of a federated run;
// only members push. Its payload is empty for a run without a join
// authority (anyone may join, up to MaxMembers), and otherwise a join token:
// the authority's ed25519 signature (64 bytes) over
//
//	offset  size  field
//	0       24    "psyche federated join 1\x00"
//	24      32    run id, zero-padded
//	56      32    the client's public key
//
// which the authority hands to the client out of band (psyche
// federated-token), as it co-signs a trainer's join_run.

const (
	joinTokenDomain = "psyche federated join 1\x00"
	// JoinTokenSize is the size of a join token.
	JoinTokenSize = ed25519.SignatureSize
)

func joinTokenMessage(runID string, client coordinator.Pubkey) ([]byte, error) {
	var id [coordinator.MaxRunIDLen]byte
	if err := coordinator.SetFixedString(id[:], runID); err != nil {
		return nil, fmt.Errorf("%w: run id %q", ErrMalformed, runID)
	}
	msg := append([]byte(joinTokenDomain), id[:]...)
	return append(msg, client[:]...), nil
}

// JoinToken is the join authority's token for client in run runID.
func JoinToken(authority Signer, runID string, client coordinator.Pubkey) ([]byte, error) {
	msg, err := joinTokenMessage(runID, client)
	if err != nil {
		return nil, err
	}
	return authority.Sign(msg), nil
}

// VerifyJoinToken reports whether token is authority's for client in runID.
func VerifyJoinToken(authority coordinator.Pubkey, runID string, client coordinator.Pubkey, token []byte) bool {
	msg, err := joinTokenMessage(runID, client)
	return err == nil && len(token) == JoinTokenSize && ed25519.Verify(authority[:], msg, token)
}
