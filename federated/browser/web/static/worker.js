// The worker that runs the federated client (psyche.wasm): training blocks
// this thread, never the page's. The page ends the worker to stop the
// client. Messages in: {cmd: "start", config, text, seed} or
// {cmd: "bench", config, text, steps}. Messages out: the client's events
// (federated/browser.Event), and {kind: "ready"} once the module runs.
importScripts("/train/static/wasm_exec.js");

let loaded;
self.psycheEmit = (json) => {
	const ev = JSON.parse(json);
	if (ev.kind === "loaded" && loaded) loaded.resolve();
	postMessage(ev);
};

async function load() {
	const resp = await fetch("/train/static/psyche.wasm");
	if (!resp.ok) throw new Error((await resp.text()).trim() || `fetching psyche.wasm: HTTP ${resp.status}`);
	const go = new Go();
	const { instance } = await WebAssembly.instantiateStreaming(resp, go.importObject);
	const done = new Promise((resolve) => { loaded = { resolve }; });
	go.run(instance).then(() => postMessage({ kind: "error", error: "the trainer's module exited" }));
	await done;
}

const ready = load().then(
	() => postMessage({ kind: "ready" }),
	(err) => { postMessage({ kind: "error", error: String(err.message || err) }); throw err; },
);

onmessage = async (e) => {
	try {
		await ready;
	} catch {
		return;
	}
	const m = e.data;
	if (m.cmd === "start") self.psycheStart(JSON.stringify(m.config), new Uint8Array(m.text), new Uint8Array(m.seed));
	if (m.cmd === "check") self.psycheCheck(m.name, new Uint8Array(m.text));
	if (m.cmd === "address") self.psycheAddress(new Uint8Array(m.seed));
	if (m.cmd === "bench") self.psycheBench(JSON.stringify(m.config), new Uint8Array(m.text), m.steps);
};
