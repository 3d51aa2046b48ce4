// Package drive owns how a trainer carries out its machine's decisions:
// the order of a machine.Ready's fields, the queue of Readies that the
// work answers with (a load answers Loaded or LoadFailed, a training
// Trained), events taken one at a time with announcements first, and the
// points at which the work may pause.
//
// trainer/node's Run (real time, real work, every effect finished before
// it returns) and tools/simscale's trainers (virtual time, modelled work
// that pauses for as long as it would take) both drive the machine through
// a Driver, so a simulated trainer takes the same steps in the same order
// as a real one. Like the machine it does no I/O and reads no clock: what
// each step does is the Effects' business.
package drive
