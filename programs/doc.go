// Package programs owns the on-chain coordinator program (C compiled to SBPF)
// and its build chain.
package programs
