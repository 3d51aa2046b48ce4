// Package dp is differential privacy for federated runs: clipping an update
// to an L2 bound, Gaussian noise drawn from a seed, and a Rényi-DP accountant
// for the (Poisson-)sampled Gaussian mechanism (Mironov, Talwar and Zhang,
// "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019) that
// turns the steps taken so far into an (ε, δ) guarantee.
//
// The package is pure: the noise comes from a ChaCha20 stream keyed by a
// 32-byte seed the caller draws (crypto/rand in the drivers), so tests
// replay it exactly.
//
// Two places to add noise, as Flower and Disco.js offer:
//   - central: the server clips each client's update to C, averages k of
//     them and adds N(0, (σ·C/k)²) to every coordinate of the mean. The
//     accountant's noise multiplier is σ and its sampling rate q is the
//     share of the population an aggregation draws on (k/N; 1 when every
//     client takes part). It protects each client's whole contribution
//     (user-level DP) against everyone who sees the model, not against the
//     server, which sees the updates.
//   - local: each client clips its own update to C and adds N(0, (σ·C)²)
//     before sending it, which protects it against the server too, at the
//     price of k times the noise in the mean for the same σ.
//
// Floating-point Gaussian sampling leaks through the low bits of its output
// (Mironov 2012); the accountant's numbers hold for the ideal mechanism.
package dp
