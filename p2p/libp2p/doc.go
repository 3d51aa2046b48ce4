// Package libp2p is the p2p.Network of real machines: the libp2p host (TCP and
// QUIC), the run's gossipsub topic, blob exchange (a stream from the
// announcer, bitswap as the fallback), P2P checkpoints and
// the epoch allowlist.
//
// The host speaks go-libp2p's protocols with settings for bulk data
// (transport.go): TLS whose records reach the socket in batches, yamux with
// 256 KiB frames, and gossip messages without gossipsub's own signature (an
// announcement carries its trainer's).
//
// # Shape of a round
//
// A trainer Publishes its result: the payload is cut into raw CIDv1 BLAKE3
// blocks of at most 1 MiB (BlockSize) held in an in-memory blockstore served
// by bitswap, and a small signed Announcement (run, step, batch, trainer,
// commitment, block digests, nonce) goes out on the run's gossipsub topic.
// Every receiving node validates it inline (size, encoding, ed25519
// signature, run id, step within [current-2, current+1], the coordinator's
// assignment as SetAssignments last gave it, nonce replay) before it is relayed or
// delivered on Announcements. The trainer then Fetches the payload by its
// block list, which must match the announced commitment (CommitmentOf) before
// anything is fetched: the announcer streams the blocks (BlobProtocol, over a
// TCP connection when there is one), each read straight into the payload and
// checked against its digest while the next arrives; whatever the stream does
// not deliver (a peer slower than WithMinFetchRate, one that stops mid-blob or
// sends a wrong block) comes from bitswap, which takes each block from
// whichever connected peer has it.
//
// Gossip is best-effort (docs/architecture.md §7: publishes before the mesh forms, and
// multi-hop delivery while it forms, can be lost), so a node re-announces its
// own recent results with fresh nonces, and a trainer missing a batch can
// Pull a step's announcements from its peers over a direct stream
// (PullProtocol); pulled announcements pass the same validation.
//
// Before its result, a trainer Notifies: a signed Notice (run, step, batch,
// trainer, nonce) on the same topic says it has begun its batch, so that
// its witnesses wait for a slow result instead of taking the trainer for a
// silent one. It is validated as an announcement is, delivered once on
// Notices, and re-sent with the re-announcements until the result is
// published (notice.go).
//
// The node learns the run only as data pushed to it: SetStep moves the
// validation window and collects blobs more than two steps old,
// SetAssignments installs who trains which batch of each round the
// coordinator holds, and SetClients installs the epoch's clients as the allowlist: a
// connection gater refuses every other peer (bootstrap peers excepted) in
// both directions, and connections to peers that left are closed. Until the
// first SetClients only bootstrap peers may connect.
//
// # Checkpoints
//
// ShareCheckpoint serves a model from its source (a p2p.CheckpointSource: the
// tensors' bytes back to back, in a file or in memory) as blocks per tensor,
// read from the source when a peer asks for one, plus a manifest block; the
// manifest's id (its BlockDigest) names the checkpoint, and the node holds
// the manifest, not the model. FetchCheckpoint gets the manifest, then
// streams the blocks from the peers that offer it (the blob stream, in
// chunks that two streams per peer take in turn) into a p2p.CheckpointFile,
// each verified on arrival and written at its place; whatever the streams do
// not deliver comes with a bounded number of requests in flight over a
// bitswap session (which spreads the wants over the peers that have the
// blocks), verified too and retried, so a peer leaving mid-transfer costs a
// retry, not the transfer. A joiner learns the
// manifest id by asking the previous epoch's clients (FindCheckpoint over
// OfferProtocol) and takes the id most of them offer.
//
// # Wire formats
//
// The byte formats are the contract's, in package p2p; this package moves
// them over libp2p streams and topics.
package libp2p
