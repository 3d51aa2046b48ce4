// Package fedclient is a federated run's client (psyche join
// --local-data): Client speaks the server's federated API, Trainer trains
// the run's model on the client's own text for a round and measures the
// held-out loss, and Participate is the loop: fetch the model, train,
// push the update, catch up when it is refused as stale, wait for the next
// round.
package fedclient
