// Package machine owns the trainer's decisions: which epoch to join and
// when, what to load, which batch to train and when to train ahead, which
// results to fetch, pull and apply, whom to vouch for in a witness report,
// whom to health-check, how long to wait for a silent trainer (patience.go),
// what verified work to do and whom it condemns (verify.go), and when to
// tick a run nobody ticks.
//
// It does no I/O, reads no clock and draws no randomness (internal/archtest
// holds it to that): each event (a snapshot at a time, an announcement, a
// fetched or trained result, a loaded model, a pull's answer, a tick at a
// time, verified work's answer) returns a Ready saying what to apply, load,
// train, send, fetch, pull, share, save, verify and tick, and the driver
// (trainer/node/drive's step, with trainer/node's effects or
// tools/simscale's virtual-time ones) does it and answers with the next
// event. What it has done once per epoch
// is kept in one epochBook. Its transcripts are testdata/*.txt
// (interaction_test.go; -rewrite regenerates them).
package machine
