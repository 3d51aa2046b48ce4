// Package archtest holds repository-wide rules that are checked by tests: which
// packages may import what. It has no code of its own.
package archtest
