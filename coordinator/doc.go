// Package coordinator owns the run state machine of psyche: the one piece of
// state that every trainer agrees on, whether it lives in a Solana account or
// in the embedded server.
//
// It is pure and deterministic. Nothing here reads a clock, draws randomness,
// does I/O or logs: the time (unix seconds) and a seed are parameters of every
// instruction (Context), and an instruction either mutates the state and bumps
// its nonce or returns a coded error and changes nothing. The same package
// defines the byte formats that the on-chain program must reproduce exactly:
// the account layout (account.go, codec.go, pinned by
// testdata/account_layout.golden) and the instruction data (instruction.go).
//
// A run moves through these states (docs/architecture.md §3.3):
//
//	Uninitialized --resume--> WaitingForMembers --enough joiners--> Warmup
//	Warmup --timeout or all warmup witnesses--> RoundTrain
//	Warmup --healthy clients < min_clients--> WaitingForMembers (or Finished)
//	RoundTrain --timeout or all witnesses--> RoundWitness
//	RoundWitness --timeout--> RoundTrain (next round) or Cooldown (epoch over)
//	Cooldown --timeout or checkpoint recorded--> WaitingForMembers, Paused or Finished
//
// A client that a health check drops sits out the next epoch: the warmup
// leaves it out unless the run needs it to reach min_clients (SittingOut).
//
// Committee and witness selection use a keyed swap-or-not shuffle
// (committee.go), witness reports carry bits-and-blooms bloom filters
// (bloom.go), and each round's batch is split among trainers by a seeded
// Fisher–Yates shuffle (data.go).
package coordinator
