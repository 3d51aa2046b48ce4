// Package browser is the federated client a web page runs: the run's model
// fetched from the server, a trainer on a text the person picked (read in
// the browser, never sent), fedclient's loop, and what the page shows as
// events (loss, round, privacy spent, bytes sent, speed). It is portable Go:
// federated/browser/wasm compiles it to WebAssembly for the page's worker,
// and the same code runs natively for the speed comparison
// (federated/browser/nativebench). The page itself is federated/browser/web.
package browser
