// Package fedserver is the driver of federated runs on the server backend
// (chain/server): it keeps each run's federated.Machine, answers the HTTP
// API below, persists every change before acknowledging it (the state
// atomically, <dir>/<run id>.fed; a join appended to <dir>/<run id>.joins,
// which the next full write takes in: joinlog.go), and counts metrics. The run itself (its model shape,
// authority and pause state) is the coordinator account the server holds.
//
//	POST /v1/federated                      a signed request (federated.EncodeRequest): a join, an update (members only),
//	                                        or a config from the run's authority; the header is read first and the
//	                                        rest only if the run exists and the payload fits its model
//	GET  /v1/runs/{id}/federated            federated.Info (JSON)
//	GET  /v1/runs/{id}/federated/model      the model (federated.EncodeModel); ?after=R waits (up to 20 s) for a round past R
//	GET  /v1/runs/{id}/federated/secagg     ?base=R&phase=keys|inbox|survivors|done&id=N: a secure aggregation phase's
//	                                        outcome (secagg.View, JSON), once it has closed
//
// A secure aggregation round (federated/secagg) runs over the same signed
// requests (kinds 3-6): its phases close when every client of the phase
// before has answered or at the run's secagg_timeout with at least the
// threshold; its state is in memory only (a restart aborts the round, and
// its clients start it again), and each message is taken once per round
// (the phase rules refuse a replay). Only members take part in one, and in
// an open run the clients whose updates were aggregated in the last
// federated.RecentRounds rounds keep their slots: a key new to the run takes
// only the others (Busy otherwise), until failed tries of the round lapse
// the reservation.
//
// A state file that cannot be read at start quarantines its run alone (503
// Quarantined; the file is left as it is); no request removes a state file:
// Forget does, when the server frees the run.
package fedserver
