// Package server owns the embedded server backend: one process that holds
// the coordinators of one or more runs, ticks them, executes the instructions
// clients send over HTTP (each request signed with the client's ed25519 key
// and checked like a transaction signature, with replay protection), streams
// snapshots to subscribers, and persists every change to disk atomically
// before acknowledging it, so a restart (even after kill -9) loses nothing.
// Client is the chain.Backend that talks to it.
package server
