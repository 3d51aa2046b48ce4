// Package explorer is the run explorer: a read-only web page that shows runs
// as they happen. It follows each run's snapshots (the server's event stream,
// the server in process, or a Solana account subscription), keeps what the
// coordinator account forgets (the account holds only the last four rounds)
// as a per-run history, and serves the page and a JSON and server-sent-events
// API that the page reads:
//
//	GET /api/runs              the runs (JSON List)
//	GET /api/runs/events       the same, again on every change (server-sent events)
//	GET /api/runs/{id}         one run: its View and every History point (JSON Update)
//	GET /api/runs/{id}/events  the first Update, then one per change with the points that changed
//	GET /                      the page (web/dist, embedded; built from web/src with esbuild)
//
// Where the numbers come from: every witness's report (coordinator.Witness)
// carries its own metadata, which the trainer fills with the loss of the
// batch it trained that step and its tokens and result bytes per second of
// training and publishing (trainer/node). The explorer averages a step's
// witness reports into the loss curve and the step's rates, so no extra
// service or wire format is needed; held-out loss is whatever the caller
// records with RecordHeldOut (psyche localnet measures it before and after
// training). Nothing the page sends changes anything: the API has only GET
// routes and takes no input but a run id, which is only looked up.
package explorer
