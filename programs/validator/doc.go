// Package validator starts and stops the repository's local Solana validator
// (scripts/validator): LiteSVM — the real Agave runtime and SBPF loader, as
// an npm package pinned to litesvm 1.5.0 — behind Solana's JSON-RPC and
// websocket API as solana-go, @solana/web3.js and @coral-xyz/anchor use it
// (scripts/validator/web3.test.mjs drives it with the last two), on
// 127.0.0.1 with the websocket on the RPC port + 1, with slots and the Clock
// sysvar advancing with wall time (docs/architecture.md §5).
//
// It exists for tests and for users without the Solana CLI. Start runs
// `node validator.mjs` (after `npm ci` when its node_modules is missing),
// waits for the line on which the script reports its URLs, and returns a
// Validator; Close or Run stops it. The process also exits when its standard
// input closes, so it does not outlive a test binary that crashed.
//
// Three behaviours of the script matter to Go clients: websocket request ids
// above 2^53 (solana-go's) are echoed digit for digit; rentEpoch is
// u64::MAX written as an exact integer; and a subscription is live from the
// moment its confirmation is sent — a client must wait for that confirmation
// (solana-go's AccountSubscribe returns before it arrives) before it makes
// the change it wants to observe.
package validator
