// Package chain owns how a run's coordinator is reached: the Backend
// interface (send an instruction, subscribe to snapshots), the Solana backend
// and the embedded server backend.
package chain
