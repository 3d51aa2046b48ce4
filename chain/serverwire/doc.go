// Package serverwire holds the formats the server backend (chain/server)
// and its client (chain/serverclient) both speak, in one place so the two
// cannot drift: the signed request and what it is bound to (wire.go), the
// binding and p2p answers, the reply to a request and its refusals, which
// turn back into the same errors on the client's side (errors.go), and the
// event stream's deltas (delta.go). Each decoder has a fuzz target.
package serverwire
