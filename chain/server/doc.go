// Package server owns the embedded server backend: one process that holds
// the coordinators of one or more runs, ticks them, executes the instructions
// clients send over HTTP (each request signed with the client's ed25519 key
// and checked like a transaction signature: bound to this server, the run's
// incarnation and a window of time, with replay protection), streams
// snapshots to subscribers, and persists every change to disk atomically
// before acknowledging it, so a restart (even after kill -9) loses nothing.
// chain/serverclient is the chain.Backend that talks to it, and
// chain/serverwire holds what both sides read and write (requests,
// bindings, replies, refusals, event deltas), so a program that only talks
// to a server does not compile this one.
//
// Nothing an anonymous client sends grows the server: replay state is kept
// only for signers a run knows (replay.go), refused and no-op requests store
// nothing, run creation is limited to allowed keys with a quota, event
// streams are capped and slow ones dropped, and a state file that cannot be
// trusted quarantines its run alone (store.go). Refusals are listed in
// serverwire (errors.go).
package server
