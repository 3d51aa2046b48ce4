//go:build adversary

package p2p

import "context"

// What the adversary build adds to the contract: announcements that honest
// nodes must refuse, which the checked encoder cannot produce. The default
// binary has none of this.

// Forger is a network that can announce a blob reference other than its
// payload's own (a block listed many times, a size it does not hold).
type Forger interface {
	// Forge stores payload's first block, and signs and gossips an
	// announcement of step and batch whose blob reference is ref, unchecked.
	Forge(ctx context.Context, step uint32, batch BatchRange, payload []byte, ref BlobRef) (Announcement, error)
}
