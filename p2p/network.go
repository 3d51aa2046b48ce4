package p2p

import (
	"context"

	"github.com/psyche-go/psyche/coordinator"
)

// Network is everything the trainer's client node needs from the network,
// in the project's own value types: no libp2p type crosses it, so the trainer
// can be tested against any implementation and libp2p can be upgraded without
// touching it. p2p/libp2p implements it over libp2p; p2p/memnet in memory.
type Network interface {
	// ID is this node's p2p key (the ClientID.P2P it joins the run with).
	ID() coordinator.Pubkey
	// Addrs are this node's dialable multiaddrs, each ending in /p2p/<id>.
	Addrs() []string
	// Connect dials a peer given as a multiaddr ending in /p2p/<id>.
	Connect(ctx context.Context, addr string) error
	// AddrKey returns the p2p key an address names (it does not dial), or
	// ErrBadAddress.
	AddrKey(addr string) (coordinator.Pubkey, error)
	// Peers lists the p2p keys of connected peers.
	Peers() []coordinator.Pubkey

	// SetStep moves the validator's window and collects blobs older than two
	// steps. Call it on every coordinator snapshot.
	SetStep(step uint32)
	// SetClients replaces the allowlist with the current epoch's clients and
	// drops connections to everyone else (bootstrap peers excepted).
	SetClients(ids []coordinator.ClientID)
	// SetAssignments replaces the batches the validator checks
	// announcements against: each round the coordinator holds, who trains
	// which batch. From the first call on, an announcement is valid only if
	// its trainer is the one assigned its step and batch; before it, any
	// client of the epoch (SetClients) is accepted.
	SetAssignments(as []Assignment)

	// SetMaxPayload sets the largest result blob the run's model allows
	// (0: only the protocol's limit): Fetch refuses larger ones with
	// ErrOversize before fetching anything. Their announcements are still
	// delivered (they are small, and signed by the assigned trainer), so
	// that the trainer learns the batch has no usable result instead of
	// waiting for one.
	SetMaxPayload(bytes int64)

	// Publish stores payload as blocks and gossips a signed announcement.
	Publish(ctx context.Context, step uint32, batch BatchRange, payload []byte) (Announcement, error)
	// Announcements delivers each valid announcement of other trainers once.
	// Once means once per commitment: announcements of the same trainer,
	// step and batch with different commitments (a trainer that sent
	// different results to different peers: equivocation) are all
	// delivered, once each, so the trainer holds the evidence; only the
	// same commitment again (a re-announcement, a relayed or pulled copy) is
	// filtered out.
	Announcements() <-chan Announcement
	// Notify gossips a signed training notice: this node has begun work on
	// its batch of step (p2p.Notice). It is re-sent while the step is
	// current and its result not published, so that a peer whose view lags
	// (it refuses a notice for a batch it does not know assigned yet) or
	// that missed it hears of it; Publish for the same step and batch ends
	// that.
	Notify(ctx context.Context, step uint32, batch BatchRange) error
	// Notices delivers each valid notice of other trainers once per
	// trainer, step and batch. Notices are validated as announcements are
	// (signature, run, step window, assignment), and a peer that sends an
	// invalid one is trusted less the same way.
	Notices() <-chan Notice
	// Pull asks connected peers for the announcements they hold for step and
	// returns the valid ones not delivered before (the gossip fallback),
	// conflicting ones included.
	Pull(ctx context.Context, step uint32) ([]Announcement, error)
	// Fetch gets an announced payload and checks it against the commitment.
	// The payload may be shared with the blocks the node serves to other
	// peers: callers must not modify it.
	Fetch(ctx context.Context, a Announcement) ([]byte, error)

	// ShareCheckpoint serves src to joiners of epoch and returns the
	// manifest id. The network takes src over: it closes it once it serves
	// another checkpoint, or is closed itself, or sharing fails.
	ShareCheckpoint(ctx context.Context, epoch uint32, src CheckpointSource) (coordinator.Hash, error)
	// FindCheckpoint asks peers for the manifest id of the model that
	// epoch starts from, and returns the one most of them offer. When none
	// offers one, the error is ErrNoCheckpoint, with ErrNoHolder too if
	// every peer of from answered (none was unreachable).
	FindCheckpoint(ctx context.Context, epoch uint32, from []coordinator.Pubkey) (coordinator.Hash, error)
	// FetchCheckpoint writes the checkpoint whose manifest id is id, fetched
	// from peers, into a file of the tensors it must hold: the manifest must
	// Match into's specs before any tensor block is fetched, and each block
	// is checked against its digest before it is written. On success the
	// file knows its manifest (Verified), so sharing it in turn costs no
	// second read. The caller keeps the file: it closes it, or hands it to
	// ShareCheckpoint.
	FetchCheckpoint(ctx context.Context, id coordinator.Hash, from []coordinator.Pubkey, into *CheckpointFile) error

	// ReportPeer records misconduct the trainer found in what a peer sent (a
	// result that does not decode or fit the run's model, equivocation):
	// the network then trusts the peer less (gossip scoring).
	ReportPeer(key coordinator.Pubkey, why string)

	// Stats is a snapshot of the node's counters.
	Stats() Stats
}

// Assignment is one batch of a round and the trainer the coordinator
// assigned it to.
type Assignment struct {
	Step    uint32
	Batch   BatchRange
	Trainer coordinator.ClientID
}

// Stats counts what the node has done since it started: its Metrics, read
// back.
type Stats struct {
	Published   uint64
	Reannounced uint64
	Accepted    uint64 // announcements accepted by the validator (gossip and pull)
	Delivered   uint64 // announcements handed to the trainer (including those then dropped)
	Dropped     uint64 // announcements lost because Announcements() was not drained
	// Early counts announcements for the next round that came before this
	// node's view of the run reached it, kept and judged once it did.
	Early uint64
	// Rejected counts refused announcements by reason: bad_signature,
	// wrong_run, step_window, not_assigned, oversize, malformed, replayed.
	Rejected map[string]uint64
	// NoticesRejected counts refused training notices by the same reasons.
	NoticesRejected  map[string]uint64
	BlobsFetched     uint64
	FetchRetries     uint64
	FetchFailures    uint64
	CheckpointBlocks uint64 // checkpoint blocks fetched and verified
	// PeerErrors counts failures attributed to a peer (an announcer that
	// could not be reached or did not deliver, a bad commitment, a bad pull
	// answer).
	PeerErrors map[coordinator.Pubkey]uint64
	// BlocksFrom counts blob blocks received from each peer (over the
	// blob stream or bitswap).
	BlocksFrom map[coordinator.Pubkey]uint64
}
