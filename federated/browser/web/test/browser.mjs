// Drives the browser trainer (federated/browser/web) in a real browser
// (Debian's chromium, through playwright-core) against psyche server and a
// psyche join --local-data client, as separate processes. Every wait is for
// an event (a page's figure, a process's line), never for a fixed time; the
// one timeout (BROWSER_TEST_TIMEOUT, seconds) stops a run that hangs.
//
//   BROWSER_TEST_PSYCHE=/path/to/psyche BROWSER_TEST_NATIVEBENCH=/path/to/nativebench \
//     [CHROMIUM=/usr/bin/chromium] [ARTIFACTS=dir] node test/browser.mjs
//
// What it checks:
//   1. a federated run: two tabs of one browser on different text files and
//      one CLI client train 5 rounds together; each tab's held-out loss
//      falls; the first tab keeps its key in IndexedDB, the second says it
//      has a key of its own for the session (the first holds the stored
//      one); a file that is not text is refused with a message before
//      anything starts; the page fits 390 px; Stop stops.
//   2. the same with secure aggregation (threshold 2 of 3): once a round is
//      aggregated, the second tab is closed mid-round; the round completes
//      with the other two (a phase closes at its deadline) and they train on.
//   3. a run with DisTrO-compressed updates: the page sends frames (over 50×
//      fewer bytes a round than dense updates) and the loss falls; a run with
//      central DP: the page shows ε growing round by round.
//   4. figures: tokens/s in the browser against the native build of the
//      same code on this machine, the module's size, time to the first step.
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../../..");
const bin = process.env.BROWSER_TEST_PSYCHE || "psyche";
const nativeBench = process.env.BROWSER_TEST_NATIVEBENCH || "";
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
const artifacts = resolve(process.env.ARTIFACTS || "artifacts");
const limit = Number(process.env.BROWSER_TEST_TIMEOUT || 1200) * 1000;
const rounds = 5;
mkdirSync(artifacts, { recursive: true });

const started = Date.now();
const left = () => Math.max(1000, limit - (Date.now() - started));
const log = (...a) => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s]`, ...a);
const dir = mkdtempSync(join(tmpdir(), "browser-trainer-"));
const procs = [];

// start runs a psyche process; wait(re) resolves with the first match of re
// in its output (from the start), done with its exit.
function start(name, args) {
	const p = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
	const proc = { name, p, output: "", waiters: [], exit: null };
	proc.done = new Promise((res) => p.on("exit", (code, sig) => { proc.exit = { code, sig }; res(proc.exit); proc.waiters.forEach((w) => w.check()); }));
	const feed = (d) => { proc.output += d; proc.waiters.forEach((w) => w.check()); };
	p.stdout.on("data", feed);
	p.stderr.on("data", feed);
	proc.wait = (re) => new Promise((res, rej) => {
		const w = {
			check() {
				const m = proc.output.match(re);
				if (m) { proc.waiters = proc.waiters.filter((x) => x !== w); res(m); }
				else if (proc.exit) rej(new Error(`${name} exited (${JSON.stringify(proc.exit)}) before printing ${re}:\n${proc.output.slice(-3000)}`));
			},
		};
		proc.waiters.push(w);
		w.check();
	});
	procs.push(proc);
	return proc;
}
async function psyche(...args) {
	const p = start(args[0], args);
	const e = await p.done;
	if (e.code !== 0) throw new Error(`psyche ${args.join(" ")} exited ${e.code}:\n${p.output}`);
	return p.output;
}
function check(ok, what) {
	if (!ok) throw new Error(what);
	log(`ok: ${what}`);
}

// The texts: three slices of the bundled Opticks, and a file that is not text.
const opticks = readFileSync(join(repo, "trainer/data/corpus/opticks.txt"));
const files = [0, 1, 2].map((i) => {
	const f = join(dir, `notes${i + 1}.txt`);
	writeFileSync(f, opticks.subarray(i * 60000, (i + 1) * 60000));
	return f;
});
const binary = join(dir, "photo.jpg");
writeFileSync(binary, Buffer.from(Array.from({ length: 50000 }, (_, i) => (i * 2654435761) >>> 24)));

const key = async (who) => { const k = join(dir, `${who}.json`); await psyche("keygen", "--out", k); return k; };
const admin = await key("admin");
const server = start("server", ["server", "--dir", join(dir, "server"), "--listen", "127.0.0.1:0", "--tick-interval", "200ms", "--p2p=false", "--creators", admin]);
const url = "http://" + (await server.wait(/server listening on http:\/\/(\S+)/))[1];
log(`server at ${url}`);
// The binary was built without go generate, as the README builds it: its
// server builds the module from the source once it is needed (here, once
// the first federated run exists), never before, and says so in its log.
await server.wait(/its WebAssembly module will be built from the source when first needed/);
check(!/building its WebAssembly module/.test(server.output), "the server builds no module before a federated run exists");
const example = readFileSync(join(repo, "examples/federated-run.toml"), "utf8");
async function createRun(id, toml) {
	const f = join(dir, `${id}.toml`);
	writeFileSync(f, toml);
	for (const args of [["init-coordinator"], ["update", "--config", f], ["set-paused", "--resume"]]) {
		await psyche(...args, "--server", url, "--key", admin, "--run-id", id);
	}
}
await createRun("fed", example);
await createRun("sa", example.replace("secagg = false", "secagg = true").replace("secagg_threshold = 0 ", "secagg_threshold = 2 ")
	.replace("secagg_timeout = 0 ", "secagg_timeout = 2 "));
// DisTrO-compressed updates, one client a round.
await createRun("dz", example.replace("capacity = 3 ", "capacity = 1 ").replace('kind = "adamw"', 'kind = "distro"')
	.replace("compression_topk = 1", "compression_topk = 8").replace("compression_chunk = 1", "compression_chunk = 32")
	.replace("quantize_1bit = false", "quantize_1bit = true").replace("compression_decay = 0.0", "compression_decay = 0.9"));
// Central DP with one client a round: what the page shows of the privacy spent.
await createRun("dp", example.replace("capacity = 3 ", "capacity = 1 ").replace("noise_multiplier = 0.0", "noise_multiplier = 1.0"));
const built = await server.wait(/WebAssembly module is built.* mib=([\d.]+) gzipped_mib=([\d.]+)/);
const wasmMiB = { raw: Number(built[1]), gz: Number(built[2]) };
check(/building its WebAssembly module from the source/.test(server.output), "the server built the browser trainer's module from its source once a federated run existed, and said so");

let browser;
let failed = false;
let closing = false;
const figures = {};
try {
	browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
	const context = await browser.newContext({ viewport: { width: 1000, height: 1100 } });
	context.setDefaultTimeout(left());
	const open = async (run, name) => {
		const page = await context.newPage();
		page.on("pageerror", (e) => { console.error(`${name}: page error:`, e); failed = true; });
		page.on("console", (m) => { if (m.type() === "error") console.error(`${name}: console:`, m.text()); });
		const t0 = Date.now();
		await page.goto(`${url}/train/${run}`);
		await page.waitForFunction(() => window.psyche?.ready || window.psyche?.status === "failed");
		const st = await page.evaluate(() => window.psyche);
		if (!st.ready) throw new Error(`${name}: the trainer did not load: ${st.error}`);
		figures.loadMs = Math.max(figures.loadMs || 0, Date.now() - t0);
		return page;
	};
	// pick chooses a file and returns the page's verdict on it: the message
	// that replaces the one before (the check runs in the worker, later).
	const pick = async (page, f) => {
		const before = await page.locator("#message").textContent();
		await page.setInputFiles("#file", f);
		await page.waitForFunction((b) => { const t = document.querySelector("#message").textContent; return t !== "" && t !== b; }, before);
		return page.locator("#message").textContent();
	};
	const roundsOf = (page) => page.evaluate(() => window.psyche.rounds);
	const waitRound = (page, r) => page.waitForFunction((r) => window.psyche.rounds.some((x) => x.round >= r) || window.psyche.status === "failed", r)
		.then(async () => { const st = await page.evaluate(() => window.psyche); if (st.status === "failed") throw new Error(`a tab failed: ${st.error}`); });

	// 1. A federated run: two tabs and one CLI client.
	const a = await open("fed", "tab 1");
	const b = await open("fed", "tab 2");
	const refused = await pick(a, binary);
	check(/not text/.test(refused) && await a.locator("#start").isDisabled(), `a file that is not text is refused with a message ("${refused}")`);
	check(/notes1\.txt: .* of text/.test(await pick(a, files[0])), "a text file is taken");
	await pick(b, files[1]);
	await a.waitForFunction(() => window.psyche.address !== "");
	await b.waitForFunction(() => window.psyche.address !== "");
	const [ka, kb] = await Promise.all([a.evaluate(() => window.psyche), b.evaluate(() => window.psyche)]);
	check(ka.persistentKey && !kb.persistentKey && /this tab only/.test(await b.locator("#key").textContent()) && ka.address !== kb.address,
		`tab 1 keeps its key in IndexedDB (${ka.address}); tab 2 says it trains with a key of its own (${kb.address})`);
	const cliKey = await key("cli");
	const cli = start("cli", ["join", "--server", url, "--key", cliKey, "--run-id", "fed", "--local-data", files[2], "--rounds", String(rounds)]);
	await a.click("#start");
	await b.click("#start");
	await Promise.all([waitRound(a, rounds), waitRound(b, rounds)]);
	const cliExit = await cli.done;
	check(cliExit.code === 0, `the CLI client reached round ${rounds} and left`);
	for (const [name, page] of [["tab 1", a], ["tab 2", b]]) {
		const rs = await roundsOf(page);
		const first = rs[0].heldout_loss, last = rs.filter((r) => r.round <= rounds).at(-1).heldout_loss;
		check(last < first - 0.1, `${name}: held-out loss ${first.toFixed(4)} at round ${rs[0].round} -> ${last.toFixed(4)} at round ${rounds}`);
	}
	const st = await a.evaluate(() => window.psyche);
	check(st.sent > 0 && /KiB|MiB/.test(await a.locator("#sent").textContent()), `tab 1 shows the bytes it sent (${st.sent})`);
	check(/no DP noise/.test(await a.locator("#epsilon").textContent()), "tab 1 says the run adds no DP noise");
	figures.firstStepMs = st.firstStepMs;
	figures.browserRoundTokensPerSec = st.tokensPerSec;
	const cliLosses = [...cli.output.matchAll(/federated round (\d+) heldout loss (\S+)/g)].map((m) => Number(m[2]));
	check(cliLosses.at(-1) < cliLosses[0], `the CLI client in the same run: held-out loss ${cliLosses[0]} -> ${cliLosses.at(-1)}`);

	// The page at a phone's width.
	await a.setViewportSize({ width: 390, height: 844 });
	const overflow = await a.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
	await a.screenshot({ path: join(artifacts, "browser-trainer-390px.png"), fullPage: true });
	check(overflow <= 0, `the page fits 390 px (overflow ${overflow} px)`);
	await a.setViewportSize({ width: 1000, height: 1100 });
	await a.screenshot({ path: join(artifacts, "browser-trainer.png"), fullPage: true });

	// The speed of the same code in the browser and natively.
	const steps = 60;
	const wasmTps = await a.evaluate((n) => window.psycheBench(n), steps);
	await a.click("#stop");
	await b.click("#stop");
	check((await a.evaluate(() => window.psyche.status)) === "stopped", "Stop stops the client");
	await b.close();
	await a.close();
	if (nativeBench) {
		const nb = spawn(nativeBench, ["--server", url, "--run", "fed", "--file", files[0], "--steps", String(steps)], { stdio: ["ignore", "pipe", "inherit"] });
		let out = "";
		nb.stdout.on("data", (d) => { out += d; });
		const code = await new Promise((res) => nb.on("exit", res));
		if (code !== 0) throw new Error(`nativebench exited ${code}`);
		figures.nativeTokensPerSec = parseFloat(out);
	}
	figures.wasmTokensPerSec = wasmTps;

	// DisTrO-compressed updates from the page.
	const z = await open("dz", "distro tab");
	await pick(z, files[0]);
	await z.click("#start");
	await waitRound(z, 4);
	const zr = (await roundsOf(z)).filter((r) => r.round <= 4);
	const perRound = zr.at(-1).sent / zr.length; // each round's report counts the update it pushed
	const densePerRound = st.sent / st.rounds.length;
	check(/DisTrO-compressed/.test(await z.locator("#filename").textContent()) && perRound < densePerRound / 50 && zr.at(-1).heldout_loss < zr[0].heldout_loss,
		`a DisTrO run's page sends compressed updates: ${Math.round(perRound)} bytes a round against ${Math.round(densePerRound)} dense; held-out loss ${zr[0].heldout_loss.toFixed(4)} -> ${zr.at(-1).heldout_loss.toFixed(4)} in 4 rounds`);
	await z.click("#stop");
	await z.close();

	// The privacy spent, in a run with central DP.
	const d = await open("dp", "dp tab");
	await pick(d, files[0]);
	await d.click("#start");
	await waitRound(d, 3);
	const eps = (await roundsOf(d)).filter((r) => r.epsilon != null).map((r) => r.epsilon);
	const shown = await d.locator("#epsilon").textContent();
	check(eps.length >= 3 && eps.every((e, i) => e >= 0 && isFinite(e) && (i === 0 || e > eps[i - 1])) && /ε = [0-9.e+]+ \(central\) at δ = 0.00001|ε = [0-9.e+]+ \(central\) at δ = 1e-5/.test(shown),
		`a DP run's page shows the privacy spent, growing round by round (${eps.map((e) => e.toPrecision(3)).join(", ")}; "${shown}")`);
	await d.click("#stop");
	await d.close();

	// 2. Secure aggregation, and a tab closed mid-round.
	const s1 = await open("sa", "secagg tab 1");
	const s2 = await open("sa", "secagg tab 2");
	await pick(s1, files[0]);
	await pick(s2, files[1]);
	const cli2 = start("cli-sa", ["join", "--server", url, "--key", cliKey, "--run-id", "sa", "--local-data", files[2], "--rounds", "4"]);
	await s1.click("#start");
	await s2.click("#start");
	await waitRound(s2, 1);
	// Mid-round: tab 2 has started training on the next model.
	await s2.waitForFunction(() => window.psyche.status === "training" && window.psyche.steps > window.psyche.rounds.length * (window.psyche.roundSteps || 1));
	const closedAt = (await roundsOf(s2)).at(-1).round;
	await s2.close();
	log(`secagg tab 2 closed during round ${closedAt}`);
	await waitRound(s1, closedAt + 2);
	check((await cli2.done).code === 0, "the CLI client of the secure aggregation run reached round 4");
	check(server.output.includes("secure aggregation phase deadline"), `round ${closedAt} completed without the closed tab (a phase closed at its deadline); the others trained on to round ${closedAt + 2}`);
	const sr = await roundsOf(s1);
	check(sr.at(-1).heldout_loss < sr[0].heldout_loss, `secagg tab 1: held-out loss ${sr[0].heldout_loss.toFixed(4)} -> ${sr.at(-1).heldout_loss.toFixed(4)}`);
	await s1.screenshot({ path: join(artifacts, "browser-trainer-secagg.png"), fullPage: true });
} catch (err) {
	console.error(err);
	for (const p of procs) if (p.exit?.code || !p.exit) console.error(`--- ${p.name} (last output)\n${p.output.slice(-2000)}`);
	failed = true;
} finally {
	closing = true;
	if (browser) await browser.close();
	for (const p of procs) if (!p.exit) p.p.kill("SIGINT");
	await Promise.all(procs.map((p) => p.done));
	rmSync(dir, { recursive: true, force: true });
}

if (!failed) {
	console.log("\nfigures (this machine, this run)");
	console.log(`  psyche.wasm: ${wasmMiB.raw.toFixed(2)} MiB, ${wasmMiB.gz.toFixed(2)} MiB gzipped`);
	console.log(`  page load to trainer ready: ${(figures.loadMs / 1000).toFixed(2)} s; Start to first trained step: ${(figures.firstStepMs / 1000).toFixed(2)} s`);
	if (figures.nativeTokensPerSec) {
		console.log(`  local training, ${60} steps of the run's model: browser ${figures.wasmTokensPerSec.toFixed(0)} tokens/s, native ${figures.nativeTokensPerSec.toFixed(0)} tokens/s: ${(figures.wasmTokensPerSec / figures.nativeTokensPerSec).toFixed(2)}x (target >= 0.3x)`);
	} else {
		console.log(`  local training in the browser: ${figures.wasmTokensPerSec.toFixed(0)} tokens/s (no native figure: BROWSER_TEST_NATIVEBENCH unset)`);
	}
	console.log("browser trainer: all checks passed");
}
process.exit(failed ? 1 : 0);
