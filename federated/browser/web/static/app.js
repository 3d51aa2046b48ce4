// The browser trainer's page: it picks and checks the person's text file,
// keeps the client's key, starts and stops the worker that trains
// (worker.js, psyche.wasm) and shows what the client reports. window.psyche
// holds the same figures for scripts (the browser tests read it).

const run = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const $ = (id) => document.getElementById(id);
const state = { run, ready: false, rounds: [], steps: 0, sent: 0, address: "", persistentKey: false, status: "loading", error: "" };
window.psyche = state;

const fmtBytes = (n) => n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(2)} MiB`;
const maxBytes = 256 << 20; // fedclient.MaxLocalData

function say(text, ok = false) {
	$("message").textContent = text;
	$("message").className = ok ? "ok" : "";
	if (!ok) state.error = text;
}
function setStatus(s, text) {
	state.status = s;
	$("state").textContent = text;
}

// The key: one per browser, kept in IndexedDB, used by one tab at a time
// (a Web Lock says which); a second tab trains with a key of its own for
// this session, and says so.
function randomSeed() {
	return crypto.getRandomValues(new Uint8Array(32));
}
function idb(op) {
	return new Promise((resolve, reject) => {
		const open = indexedDB.open("psyche", 1);
		open.onupgradeneeded = () => open.result.createObjectStore("keys");
		open.onerror = () => reject(open.error);
		open.onsuccess = () => {
			const tx = open.result.transaction("keys", "readwrite");
			const req = op(tx.objectStore("keys"));
			req.onsuccess = () => resolve(req.result);
			req.onerror = () => reject(req.error);
		};
	});
}
async function clientKey() {
	if (!navigator.locks || !window.indexedDB) return { seed: randomSeed(), note: "a key for this session only (this browser keeps no storage for it)" };
	const held = await new Promise((resolve) => {
		navigator.locks.request("psyche-client-key", { ifAvailable: true }, (lock) => {
			resolve(lock !== null);
			if (lock) return new Promise(() => {}); // held while this tab lives
		});
	});
	if (!held) return { seed: randomSeed(), note: "a key for this tab only: another tab of this browser trains with its stored key" };
	try {
		let seed = await idb((s) => s.get("client"));
		if (!(seed instanceof Uint8Array) || seed.length !== 32) {
			seed = randomSeed();
			await idb((s) => s.put(seed, "client"));
		}
		return { seed, persistent: true, note: "kept in this browser's storage" };
	} catch (err) {
		return { seed: randomSeed(), note: `a key for this session only (storage failed: ${err.message || err})` };
	}
}

let key;
let file = null;
let text = null;
let worker = null;
let startedAt = 0;

function newWorker() {
	state.ready = false;
	const w = new Worker("/train/static/worker.js");
	w.onmessage = (e) => onEvent(e.data);
	w.onerror = (e) => { say(`the trainer failed: ${e.message}`); setStatus("failed", "failed"); };
	return w;
}

function onEvent(ev) {
	switch (ev.kind) {
	case "ready":
		state.ready = true;
		if (key) worker.postMessage({ cmd: "address", seed: key.seed });
		if (state.status === "loading") setStatus("idle", "ready: pick a text file, then start");
		updateButtons();
		break;
	case "address":
		state.address = ev.address;
		$("key").textContent = `Key: ${ev.address} (${key.note})`;
		break;
	case "checked":
		if (ev.error) {
			text = null;
			say(`${ev.error}. Pick a plain-text file.`);
		} else {
			say(`${file.name}: ${fmtBytes(file.size)} of text, read in this browser; nothing is sent until you start, and then only model updates.`, true);
		}
		updateButtons();
		break;
	case "joined":
		setStatus("training", "training");
		state.params = ev.params;
		state.compressed = !!ev.compressed;
		state.roundSteps = ev.round_steps;
		$("filename").textContent = `${file.name}: ${ev.train_tokens.toLocaleString()} tokens to train on, ${ev.heldout_tokens.toLocaleString()} held out; a model of ${ev.params.toLocaleString()} parameters; updates sent ${ev.compressed ? "DisTrO-compressed" : "dense"}${ev.secagg ? ", masked (secure aggregation)" : ""}.`;
		break;
	case "step":
		state.steps++;
		$("step").textContent = `${ev.step} of ${state.roundSteps || "?"} (loss ${ev.step_loss.toFixed(3)})`;
		if (!state.firstStepMs) {
			state.firstStepMs = performance.now() - startedAt;
			$("firststep").textContent = `${(state.firstStepMs / 1000).toFixed(2)} s from Start`;
		}
		break;
	case "round": {
		state.rounds.push(ev);
		state.sent = ev.sent || 0;
		$("myround").textContent = String(ev.round);
		$("heldout").textContent = `${ev.heldout_loss.toFixed(4)}${state.rounds.length > 1 ? ` (from ${state.rounds[0].heldout_loss.toFixed(4)})` : ""}`;
		if (ev.train_loss) $("trainloss").textContent = ev.train_loss.toFixed(4);
		$("sent").textContent = fmtBytes(state.sent);
		if (ev.tokens_per_s) {
			state.tokensPerSec = ev.tokens_per_s;
			$("speed").textContent = `${Math.round(ev.tokens_per_s).toLocaleString()} tokens/s`;
		}
		const eps = [];
		if (ev.epsilon != null) eps.push(`ε = ${ev.epsilon.toPrecision(3)} (central)`);
		if (ev.epsilon_local != null) eps.push(`ε = ${ev.epsilon_local.toPrecision(3)} (local)`);
		state.epsilon = ev.epsilon ?? ev.epsilon_local ?? null;
		$("epsilon").textContent = eps.length ? `${eps.join(", ")} at δ = ${ev.delta}` : "no DP noise in this run";
		if (ev.stale) $("step").textContent = "the round moved on; training on the new model";
		drawCurve();
		break;
	}
	case "done":
		setStatus("done", "the run finished");
		worker.terminate();
		worker = newWorker();
		updateButtons(false);
		break;
	case "bench":
		if (benchDone) benchDone(ev.tokens_per_s);
		break;
	case "error":
		say(ev.error);
		if (state.status === "training") {
			setStatus("failed", "stopped by an error");
			worker.terminate();
			worker = newWorker();
		} else if (state.status === "loading") {
			setStatus("failed", "the trainer could not load");
		}
		updateButtons(false);
		break;
	}
}

function drawCurve() {
	const ys = state.rounds.map((r) => r.heldout_loss);
	if (ys.length < 2) return;
	const lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || 1;
	$("curve").setAttribute("points", ys.map((y, i) => `${(i / (ys.length - 1)) * 300},${95 - ((y - lo) / span) * 90}`).join(" "));
}

function updateButtons(running = state.status === "training" || state.status === "starting") {
	$("start").disabled = running || !state.ready || !text;
	$("stop").disabled = !running;
}

$("file").addEventListener("change", async () => {
	file = $("file").files[0] || null;
	text = null;
	say(""); // the last file's verdict no longer holds
	updateButtons();
	if (!file) return;
	$("filename").textContent = file.name;
	if (file.size > maxBytes) {
		say(`${file.name} is ${fmtBytes(file.size)}; the most a client takes is ${fmtBytes(maxBytes)}. Pick a smaller text file.`);
		return;
	}
	if (file.size === 0) {
		say(`${file.name} is empty. Pick a text file.`);
		return;
	}
	text = await file.arrayBuffer();
	worker.postMessage({ cmd: "check", name: file.name, text: text.slice(0) });
});

$("start").addEventListener("click", () => {
	if (!text) return;
	startedAt = performance.now();
	state.firstStepMs = 0;
	setStatus("starting", "starting: fetching the model");
	say("");
	worker.postMessage({ cmd: "start", config: { server: location.origin, run, name: file.name }, text: text.slice(0), seed: key.seed });
	updateButtons(true);
});

$("stop").addEventListener("click", () => {
	worker.terminate();
	worker = newWorker();
	setStatus("stopped", "stopped by you (the server counts this client out of the rounds it was in)");
	$("step").textContent = "–";
	updateButtons(false);
});

// psycheBench trains steps local steps of the run's model on the chosen
// file in a worker of its own and resolves to tokens a second: the page's
// speed against the native build's (scripts/test-browser).
let benchDone = null;
window.psycheBench = (steps) => new Promise((resolve, reject) => {
	if (!text) return reject(new Error("pick a file first"));
	const w = new Worker("/train/static/worker.js");
	w.onmessage = (e) => {
		if (e.data.kind === "bench") { w.terminate(); resolve(e.data.tokens_per_s); }
		if (e.data.kind === "error") { w.terminate(); reject(new Error(e.data.error)); }
	};
	w.postMessage({ cmd: "bench", config: { server: location.origin, run, name: file.name }, text: text.slice(0), steps });
});

async function refreshRun() {
	try {
		const resp = await fetch(`/v1/runs/${encodeURIComponent(run)}/federated`);
		if (!resp.ok) {
			let why = `HTTP ${resp.status}`;
			try { why = (await resp.json()).error || why; } catch {}
			say(resp.status === 404 ? `This server has no federated run named "${run}" (${why}).` : `Reading the run failed: ${why}`);
			return;
		}
		const info = await resp.json();
		state.info = info;
		$("round").textContent = `${info.round}${info.rounds ? ` of ${info.rounds}` : ""}${info.paused ? " (paused)" : ""}${info.finished ? " (finished)" : ""}`;
		$("capacity").textContent = `${info.capacity} (${info.buffered} in)`;
		$("aggregation").textContent = info.aggregation;
		const dp = [];
		if (info.noise_multiplier > 0) dp.push(`central DP, σ = ${info.noise_multiplier}`);
		if (info.local_noise_multiplier > 0) dp.push(`local DP, σ = ${info.local_noise_multiplier}`);
		if (info.clip > 0) dp.push(`updates clipped to norm ${info.clip}`);
		$("privacy").textContent = dp.length ? dp.join("; ") : "no clipping, no noise";
		$("secagg").textContent = info.secagg ? `on: the server sees only the sum (${info.secagg_threshold} of ${info.capacity} must answer)` : "off";
	} catch (err) {
		say(`The server is unreachable: ${err.message || err}`);
	}
}

$("run").textContent = run || "(no run named in the address)";
document.title = `psyche · train ${run} in this browser`;
worker = newWorker();
refreshRun();
setInterval(refreshRun, 2000);
clientKey().then((k) => {
	key = k;
	state.persistentKey = !!k.persistent;
	$("key").textContent = `Key: ${k.note}`;
	if (state.ready) worker.postMessage({ cmd: "address", seed: key.seed });
});
