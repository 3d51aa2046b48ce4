// Package serverclient is the chain.Backend of a server backend
// (chain/server) over HTTP: it signs and sends instructions (Send), reads a
// run's account (Snapshot), follows its event stream, polling while the
// server refuses one (Subscribe), and learns the server's libp2p host
// (P2PBootstrap). It speaks serverwire's formats and never imports the
// server, so a program that only talks to a server (a trainer, the admin
// commands, the explorer) does not compile one.
package serverclient
