// Package localrun is the one harness for a whole run on one machine: the
// run's definition (its coordinator config and model, and the files it
// trains on: a token file and the seed its initial model is drawn from),
// the keys of its admin and of trainer i, derived from names so that the
// same run gets the same keys every time, its creation on a backend, the
// embedded server started as its backend (on the wall clock or on a
// quietclock in virtual time), and N trainers started on it, each with
// options of its own, dialling the trainers started before it.
//
// psyche localnet, the trainer's end-to-end tests and the scale simulator
// (tools/simscale) all build such a run. They keep what is theirs (the
// CLI's flags and report, the tests' assertions, the simulator's modelled
// network and virtual time) and share this, so that a change to how a
// local run is made is made once and the three stay in step.
//
// It sits beside trainer/start in the wiring layer: it imports the server,
// the client, the networks and the trainer, and nothing imports it but
// the command line, tests and tools.
package localrun
