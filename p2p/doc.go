// Package p2p owns the network between trainers: the libp2p host, the run's
// gossip topic, blob exchange and the epoch allowlist.
package p2p
