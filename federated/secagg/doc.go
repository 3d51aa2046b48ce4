// Package secagg is secure aggregation for federated runs, after Bonawitz et
// al., "Practical Secure Aggregation for Privacy-Preserving Machine
// Learning" (CCS 2017), the semi-honest variant that Flower's SecAgg and
// SecAgg+ implement: the server learns the sum of the clients' updates and
// nothing else about any one of them, and the round completes while at
// least a threshold of the clients answer — where Disco.js's two-round
// additive secret sharing stalls on one missing peer.
//
// A round, with the server as the relay (Server is its pure machine; the
// driver decides when a phase closes, on arrival of every client or at a
// deadline):
//
//  1. Advertise: each client sends two X25519 public keys, c (to encrypt
//     shares) and s (for pairwise masks).
//  2. Share: each client draws a self-mask seed b and splits b and its s
//     private key into Shamir shares (threshold t, one share per other
//     client, over GF(2⁸) byte by byte), each encrypted with
//     ChaCha20-Poly1305 under the key agreed with its recipient's c key.
//  3. Mask: each client sends y = x + PRG(b) + Σ_{v>u} PRG(s_uv) − Σ_{v<u}
//     PRG(s_uv) (mod 2³²), where s_uv is the X25519 agreement of u's and
//     v's s keys: pairwise masks cancel in the sum, and b hides y even
//     from a server that later learns the pairwise masks of a dropped
//     client.
//  4. Unmask: the server names the clients whose masked input arrived; each
//     survivor returns, for every other client of step 2, its share of b
//     (if that client's input arrived) or of the s key (if it did not),
//     never both. With t shares the server rebuilds the survivors' b and
//     the dropped clients' s keys, removes their masks, and has the sum.
//
// Fixed point: a client's update, clipped to L2 norm C (so every value lies
// in [−C, C]), is encoded as round(x·2^F) mod 2³². The sum of n clients is
// decoded as a signed 32-bit number, which is exact as long as
// n·C·2^F < 2³¹ (FractionBits picks the largest F that keeps it so); each
// value then carries at most n·2^−(F+1) of rounding error. An update past
// the clip would wrap around silently, so Encode refuses one.
//
// Supported: dense updates, with the mean aggregation (the server sees only
// the sum). Not supported: the robust rules (median, clipped mean), which
// need each update; staleness (one round's updates are summed); DisTrO's
// top-k sparse updates, whose indices would leak which coordinates each
// client changed most even if their values were masked — a sparse update
// would have to be densified (or the index set agreed on beforehand)
// first. Central DP composes: clients clip, the server adds noise to the
// unmasked sum. Security is against a semi-honest server and clients;
// a server that lies about who dropped needs the consistency round of the
// malicious variant, which this package does not implement.
//
// SecAgg+ (Bell et al., CCS 2020): with a masking graph of degree k
// (Neighbors), each client masks with and shares its secrets to its k
// neighbors only, and the server rebuilds each secret from the neighbors
// that reveal; k = 0 is the complete graph above.
//
// The package is pure: every client's randomness comes from a 32-byte seed
// its caller draws from crypto/rand.
package secagg
