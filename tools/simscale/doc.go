// Package simscale owns the scale simulator (scripts/sim-scale): it runs the
// real coordinator (package coordinator, its instructions and ticks) and the
// real trainer decision machines (trainer/node/machine) for N trainers over
// a modelled network in virtual time, and reports what a round costs at that
// N: its time and parts, bytes and messages per trainer, witness reports,
// quorum misses, bloom false positives, health-check drops and coordinator
// instructions.
//
// Everything runs on one goroutine from one event queue (sched.go), so a
// seed gives one report. What is modelled and what is not:
//
//   - The network (net.go): every host has an access link (uplink and
//     downlink in bytes per second), a latency (the one-way delay between
//     two hosts is the sum of their halves) and a packet loss rate. Bulk
//     transfers (result blobs, coordinator snapshots) are fluid flows that
//     share each uplink and downlink max-min fairly (what TCP converges to),
//     each capped by its window over its RTT and, with loss, by the
//     loss-limited rate of TCP (Mathis et al.). Rates are recomputed every
//     Config.FluidStep. Small messages (announcements, requests,
//     instructions) take the latency alone, plus one retransmission timeout
//     with the probability that a packet of them is lost; their bytes are
//     counted but take no bandwidth.
//   - The p2p layer (trainer.go), after p2p/libp2p: an announcement is flood
//     published to every peer and relayed by each receiver to its gossip
//     mesh (the relayed copies and the re-announcements every two seconds
//     are counted, not simulated: they deliver nothing new on a network
//     that loses no message); a result blob is streamed from its announcer;
//     a pull asks every peer, eight at a time, and costs what each peer
//     answers.
//   - The trainer driver is trainer/node's own step (trainer/node/drive):
//     each Ready in field order, one event at a time, announcements first.
//     The effects (trainer.go) take modelled time where Node.Run's compute:
//     applies and loads pause the driver, training ahead runs beside it,
//     instructions go out one at a time, fetches are bounded in total and
//     per peer as there. Compute is synthetic: a fixed time per sequence
//     trained and per apply.
//   - The coordinator server (server.go), after chain/server: it applies
//     each instruction when it arrives, ticks after every change and when
//     the next transition falls due (coordinator.DueAt), and streams the
//     whole account to every subscriber and then the deltas chain/server
//     sends (what changed since the account that stream sent last, sized by
//     chain/server's own encoder), keeping only the newest pending snapshot
//     per subscriber.
//
// Not modelled: CPU time of validation, hashing and (de)compression; TCP
// slow start and connection setup; bitswap's fallback; NAT traversal and
// relays; peers that fail or lie; checkpoint loading and the offers to
// joiners; Solana (compute units come from the measurements that
// docs/testing.md cites).
package simscale
