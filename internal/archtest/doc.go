// Package archtest holds repository-wide rules that are checked by tests:
// which packages may import what, and which packages may be tested without
// the race detector (those that start no goroutine). It has no code of its
// own.
package archtest
