// Package archtest holds repository-wide rules that are checked by tests:
// which packages may import what, which packages may be tested without
// the race detector (those that start no goroutine), and that no file
// refers to a file or issue tracker outside the repository. It has no code
// of its own.
package archtest
