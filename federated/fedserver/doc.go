// Package fedserver is the driver of federated runs on the server backend
// (chain/server): it keeps each run's federated.Machine, answers the HTTP
// API below, persists every change atomically (<dir>/<run id>.fed) before
// acknowledging it, and counts metrics. The run itself (its model shape,
// authority and pause state) is the coordinator account the server holds.
//
//	POST /v1/federated                      a signed request (federated.EncodeRequest): an update, or a config from the run's authority
//	GET  /v1/runs/{id}/federated            federated.Info (JSON)
//	GET  /v1/runs/{id}/federated/model      the model (federated.EncodeModel); ?after=R waits (up to 20 s) for a round past R
package fedserver
