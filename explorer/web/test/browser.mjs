// Drives the run explorer in a real browser (Debian's chromium, through
// playwright-core) against a live psyche localnet run, and saves
// screenshots. Every wait is for an event on the page, never for a fixed
// time: a loaded machine is only slower. The one timeout (EXPLORER_TEST_TIMEOUT,
// seconds) stops a run that hangs.
//
//   EXPLORER_TEST_PSYCHE=/path/to/psyche [CHROMIUM=/usr/bin/chromium] [ARTIFACTS=dir] node test/browser.mjs
//
// What it checks: the run appears in the list; its state changes as the run
// advances (three different states seen); the loss curve gains points and
// held-out points; the trainer that localnet stops (--drop-trainer-at) is
// shown as dropped; the
// page fits a phone's width; a run id that does not exist is reported; and
// when the explorer goes away the page says so and keeps reconnecting.
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

// (Not PSYCHE_*: psyche warns about variables of that prefix it does not read.)
const bin = process.env.EXPLORER_TEST_PSYCHE || "psyche";
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
const artifacts = resolve(process.env.ARTIFACTS || "artifacts");
const limit = Number(process.env.EXPLORER_TEST_TIMEOUT || 900) * 1000;
mkdirSync(artifacts, { recursive: true });

const started = Date.now();
const left = () => Math.max(1000, limit - (Date.now() - started));
const log = (...a) => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s]`, ...a);

const dir = mkdtempSync(join(tmpdir(), "explorer-browser-"));
// More epochs than the test needs: it ends the run itself (SIGINT) once it has seen
// everything, so a slow browser never finds the run already over.
const args = ["localnet", "--virtual-time", "--trainers", "3", "--epochs", "50", "--epoch-time", "12",
  "--drop-trainer-at", "4", "--explorer-addr", "127.0.0.1:0", "--dir", dir];
log(`starting ${bin} ${args.join(" ")}`);
const ln = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
let output = "";
let exited = null;
const lnExit = new Promise((res) => ln.on("exit", (code, sig) => { exited = { code, sig }; res(exited); }));
ln.stderr.on("data", (d) => { output += d; });
const url = await new Promise((res, rej) => {
  let buf = "";
  ln.stdout.on("data", (d) => {
    output += d;
    buf += d;
    const m = buf.match(/localnet: explorer (http:\/\/\S+)/);
    if (m) res(m[1]);
  });
  lnExit.then((e) => rej(new Error(`localnet exited (${JSON.stringify(e)}) before printing the explorer's URL`)));
  const t = setTimeout(() => rej(new Error("localnet printed no explorer URL")), left());
  ln.stdout.on("data", () => { if (/localnet: explorer /.test(output)) clearTimeout(t); });
});
const base = url.split("#")[0];
const runID = decodeURIComponent(url.split("#/run/")[1]);
log(`explorer at ${base}, run ${runID}`);

let browser;
let failed = false;
let closing = false;
try {
  // --disable-dev-shm-usage: a container's /dev/shm may be 64 MiB, too small
  // for chromium's shared memory; /tmp serves on any machine.
  browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(left());
  page.on("pageerror", (e) => { console.error("page error:", e); failed = true; });
  page.on("crash", () => console.error("the page crashed"));
  browser.on("disconnected", () => closing || console.error("the browser went away"));

  // The run list shows the run; its link opens the run.
  await page.goto(base);
  await page.locator(`tr[data-run="${runID}"]`).waitFor();
  log("the run is listed");
  await page.click(`tr[data-run="${runID}"] a`);
  await page.waitForFunction(() => document.querySelector("#state")?.dataset.state !== "unknown");

  // Remember every state the page shows from now on.
  await page.evaluate(() => {
    const el = document.querySelector("#state");
    window.seenStates = [el.dataset.state];
    new MutationObserver(() => {
      const s = el.dataset.state;
      if (window.seenStates[window.seenStates.length - 1] !== s) window.seenStates.push(s);
    }).observe(el, { attributes: true, attributeFilter: ["data-state"] });
  });
  await page.waitForFunction(() => new Set(window.seenStates).size >= 3, null, { timeout: left() });
  log("states seen:", (await page.evaluate(() => window.seenStates)).join(" → "));

  // The loss curve gains points.
  const points = () => page.evaluate(() => Number(document.querySelector("#loss-chart").dataset.points));
  await page.waitForFunction(() => Number(document.querySelector("#loss-chart").dataset.points) >= 2);
  const before = await points();
  await page.waitForFunction((n) => Number(document.querySelector("#loss-chart").dataset.points) > n, before);
  log(`loss curve: ${before} points, then ${await points()}`);

  // The stopped trainer is shown as dropped.
  await page.locator('#clients .health[data-health="dropped"]').waitFor();
  log("a client is shown as dropped:", await page.locator('#clients tr:has(.health[data-health="dropped"]) td.mono').first().getAttribute("title"));
  // Held-out loss: the initial model's, and the first recorded
  // checkpoint's (localnet measures both); then a curve past the drop for
  // the picture.
  await page.waitForFunction(() => Number(document.querySelector("#loss-chart").dataset.heldOut) >= 2);
  log("held-out loss points:", await page.evaluate(() => document.querySelector("#loss-chart").dataset.heldOut));
  const atDrop = await points();
  await page.waitForFunction((n) => Number(document.querySelector("#loss-chart").dataset.points) >= n + 2, atDrop);
  await page.screenshot({ path: join(artifacts, "explorer.png"), fullPage: true });
  log(`screenshot: ${join(artifacts, "explorer.png")}`);

  // A phone: the page fits its width.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForFunction(() => document.documentElement.scrollWidth <= window.innerWidth + 1);
  await page.screenshot({ path: join(artifacts, "explorer-phone.png"), fullPage: true });
  log("fits a 390 px wide phone");

  // A run that does not exist is reported (and asked for again).
  const missing = await browser.newPage();
  missing.setDefaultTimeout(left());
  await missing.goto(base + "#/run/no-such-run");
  await missing.locator("#banner", { hasText: "No such run" }).waitFor();
  log("missing run:", await missing.locator("#banner").textContent());
  await missing.close();

  // The explorer goes away (localnet ends): the page says so and reconnects.
  ln.kill("SIGINT");
  await page.locator("#banner", { hasText: "Reconnecting" }).waitFor();
  await page.waitForFunction(() => document.querySelector("#conn").textContent === "reconnecting");
  log("after localnet ended:", await page.locator("#banner").textContent());
  const e = await lnExit;
  if (e.code !== 0) throw new Error(`localnet exited with ${JSON.stringify(e)}`);
} catch (err) {
  failed = true;
  console.error("FAILED:", err.message);
  console.error("localnet's output (last 60 lines):\n" + output.split("\n").slice(-60).join("\n"));
  if (browser) {
    for (const ctx of browser.contexts()) {
      for (const p of ctx.pages()) {
        await p.screenshot({ path: join(artifacts, "explorer-failure.png"), fullPage: true }).catch(() => {});
      }
    }
  }
} finally {
  closing = true;
  if (browser) await browser.close();
  if (!exited) ln.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
}
if (failed) process.exit(1);
log("explorer browser test passed");
process.exit(0);
