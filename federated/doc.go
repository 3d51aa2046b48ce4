// Package federated is Disco.js's federated mode on the server backend: the
// server holds a run's model, its version (the round) and an asynchronous
// buffer of client updates; clients pull the model, train on their own
// private data for round_duration steps and push the difference; once the
// buffer holds capacity updates the server aggregates them, bumps the round
// and serves the new model. An update trained on a round older than
// max_staleness rounds is refused, and its client fetches the new model.
//
// This package is the pure part, in the manner of the coordinator: Machine
// consumes messages (Step) and says what happened (Ready: persist the state,
// rounds aggregated) without clocks, randomness or I/O; noise seeds come in
// with the messages. The wire formats live one per file (wire_*.go), each
// with a table of offsets and a fuzz target. federated/fedserver is the
// driver on the server backend (HTTP, files, metrics), federated/fedclient
// the client (psyche join --local-data), federated/dp the differential
// privacy (clipping, noise, accountant) and federated/secagg secure
// aggregation.
package federated
