// Package p2p is the contract of the network between trainers, with no
// libp2p in it: the Network interface the trainer's node uses, the value
// types that cross it (Announcement, Notice, BlobRef, Assignment, Tensor, Stats,
// coordinator keys and hashes), its errors, and the wire formats every
// implementation speaks. p2p/libp2p implements it over real hosts,
// p2p/memnet in memory, and p2p/p2ptest is the suite both pass.
//
// # Wire formats
//
// Each has one file with its offset table and a version byte:
// announcement.go (the signed gossip message and its block digests),
// notice.go (the signed training notice, on the same topic),
// pull_protocol.go (the pull stream), blob_protocol.go (the blob stream,
// Fetch's fast path), checkpoint_manifest.go (the checkpoint manifest),
// offer.go (the checkpoint offer stream). Their decoders have
// fuzz targets in wire_test.go.
package p2p
