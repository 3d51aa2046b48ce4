// Package data owns the trainer's training data: the byte-level tokenizer,
// the token-file format, the sources a token file is read from (a local file,
// an HTTP(S) URL read with range requests, or a built-in corpus) and the
// Provider that turns the data indices the coordinator assigns into training
// sequences.
//
// # Token files
//
// A token file is a flat array of little-endian unsigned integers, 2 bytes
// (u16) or 4 bytes (u32) each, with no header: the reader is told the token
// size (the run's model.token_size). nanoGPT's train.bin and val.bin have
// the same layout. A location ending in ".npy" is a NumPy array instead,
// whose header gives the dtype and length (npy.go). Layout (layout.go) is
// the one description of how a file stores its tokens. WriteTokenFile
// replaces a file atomically, so a crash never leaves a half-written token
// file behind.
//
// With WithVocabSize, a local file is read whole when it is opened and a
// token at or above the vocabulary size fails then, naming the file, before
// any training; an HTTP file is checked sequence by sequence.
//
// # Sequences and data indices
//
// With T tokens and sequence length S the file holds N = (T−1)/S sequences;
// sequence i is the S+1 tokens [i·S, i·S+S+1), the inputs plus the next-token
// targets, so neighbouring sequences share one token. Data index d maps to
// sequence perm(d mod N), where perm is the identity or, with WithShuffleSeed,
// a keyed pseudo-random permutation of [0, N). Every trainer computes the same
// mapping from the same file, sequence length and seed, on any platform: the
// permutation is part of the data contract and is pinned by a golden test.
//
// # HTTP sources
//
// An HTTP(S) token file is read with one "Range: bytes=a-b" GET per sequence.
// The server must honour range requests: a 200 response with the full body is
// rejected with ErrRangeIgnored rather than downloading the whole file for
// every sequence. Network errors, 5xx and 429 are retried with bounded
// exponential backoff (WithRetries, WithBackoff); other 4xx are not, and 404
// fails at once with ErrNotFound.
//
// # Corpus
//
// Opticks returns a small public-domain corpus for demos and tests: Isaac
// Newton's Opticks (first published 1704; this text is the fourth edition of
// 1730), as prepared by the Online Distributed Proofreading Team for Project
// Gutenberg and shipped by Go as src/testdata/Isaac.Newton-Opticks.txt. It is
// in the public domain. A run can train on it with no token file: the data
// location "builtin:opticks" is the corpus tokenized by the byte tokenizer at
// the run's token size, built in memory by Open.
package data
