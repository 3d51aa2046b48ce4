// The run explorer's page. It only reads: two server-sent-event streams
// (the run list, one run) and, after a stream breaks, one GET that says why
// before it reconnects. Nothing here polls.
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import "./style.css";

const C = { blue: "#0072b2", orange: "#e69f00", sky: "#56b4e9", green: "#009e73", vermillion: "#d55e00", purple: "#cc79a7" };
const $ = (sel, el = document) => el.querySelector(sel);
const main = $("#main");
const banner = $("#banner");
const conn = $("#conn");

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function short(s, n = 8) {
  s = String(s ?? "");
  return s.length > 2 * n + 1 ? s.slice(0, n) + "…" + s.slice(-n) : s;
}
function fmt(x, digits = 3) {
  return x == null || Number.isNaN(x) ? "–" : Number(x).toFixed(digits);
}
function si(x, unit = "") {
  if (x == null) return "–";
  const k = ["", "k", "M", "G", "T"];
  let i = 0;
  while (Math.abs(x) >= 1000 && i < k.length - 1) { x /= 1000; i++; }
  return (i ? x.toFixed(1) : Math.round(x)) + " " + k[i] + unit;
}
function dur(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}
function showBanner(text, info = false) {
  if (!text) { banner.hidden = true; banner.textContent = ""; return; }
  banner.hidden = false;
  banner.className = info ? "banner info" : "banner";
  banner.textContent = text;
}
function setConn(live, text) {
  conn.className = "conn " + (live ? "live" : "down");
  conn.textContent = text;
}

// stream opens an EventSource on url; when it breaks it asks check() what
// went wrong (one GET), says so, and opens it again after a backoff.
function stream(url, { onData, onClock, check }) {
  let es = null, timer = null, delay = 1000, closed = false;
  const open = () => {
    es = new EventSource(url);
    es.onmessage = (ev) => {
      delay = 1000;
      setConn(true, "live");
      onData(JSON.parse(ev.data));
    };
    es.addEventListener("clock", (ev) => onClock && onClock(Number(ev.data)));
    es.onerror = async () => {
      es.close();
      if (closed) return;
      setConn(false, "reconnecting");
      let why = "The connection to the explorer broke";
      try {
        why = await check();
      } catch {
        why = "The explorer cannot be reached";
      }
      if (closed) return;
      showBanner(`${why}. Reconnecting in ${Math.round(delay / 1000)}s…`);
      timer = setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    };
  };
  open();
  return () => { closed = true; clearTimeout(timer); if (es) es.close(); };
}

async function describeFailure(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (r.ok) return "The live stream broke";
  let msg = `HTTP ${r.status}`;
  try { msg = (await r.json()).error || msg; } catch {}
  return r.status === 404 ? `No such run: ${msg}` : msg;
}

// ---- the run list ----
function showList() {
  main.innerHTML = `<h1>Runs</h1><div class="card scroll"><table id="runs"><thead><tr>
    <th>run</th><th class="hide-phone">name</th><th>state</th><th>epoch</th><th>step</th><th>clients</th></tr></thead>
    <tbody><tr><td colspan="6" class="muted">connecting…</td></tr></tbody></table></div>`;
  return stream("api/runs/events", {
    check: () => describeFailure("api/runs"),
    onData: (l) => {
      showBanner(l.error);
      const rows = l.runs.map((r) => `<tr data-run="${esc(r.id)}">
        <td><a href="#/run/${encodeURIComponent(r.id)}">${esc(r.id)}</a></td><td class="hide-phone">${esc(r.name)}</td>
        <td><span class="state" data-state="${esc(r.state)}">${esc(r.state)}</span>${r.error ? ` <span class="short">${esc(r.error)}</span>` : ""}</td>
        <td>${r.epoch}</td><td>${r.step}</td><td>${r.clients}</td></tr>`);
      $("#runs tbody").innerHTML = rows.join("") || `<tr><td colspan="6" class="muted">no runs yet</td></tr>`;
    },
  });
}

// ---- one run ----
function lineChart(el, title, series, axes) {
  const opts = {
    title, width: el.clientWidth || 600, height: 240,
    scales: { x: { time: false } },
    axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000] }, ...axes],
    series: [{ label: "step" }, ...series],
    legend: { live: true },
  };
  const data = [[], ...series.map(() => [])];
  const u = new uPlot(opts, data, el);
  new ResizeObserver(() => u.setSize({ width: el.clientWidth, height: 240 })).observe(el);
  return u;
}

function showRun(id) {
  main.innerHTML = `
  <h1 id="run-id">${esc(id)}</h1>
  <div class="muted" id="run-name"></div>
  <div class="grid" style="margin-top:.8rem">
    <section class="card wide" aria-label="state">
      <span class="state" id="state" data-state="unknown">connecting…</span>
      <span id="timer" class="muted"></span>
      <div class="stats">
        <div class="stat"><b id="epoch">–</b><span>epoch</span></div>
        <div class="stat"><b id="step">–</b><span>step</span></div>
        <div class="stat"><b id="healthy">–</b><span>healthy clients</span></div>
        <div class="stat"><b id="last-loss">–</b><span>training loss</span></div>
        <div class="stat"><b id="last-tps">–</b><span>tokens/s</span></div>
        <div class="stat"><b id="last-bytes">–</b><span>bytes sent / step</span></div>
      </div>
      <div id="epoch-timer" class="legend-note"></div>
    </section>
    <section class="card wide"><h2>Loss</h2><div id="loss-chart" class="chart" data-points="0"></div>
      <p class="legend-note">Training loss: mean of the batch losses the step's witnesses report. Held-out loss: where it was measured.</p></section>
    <section class="card"><h2>Throughput</h2><div id="rate-chart" class="chart"></div>
      <p class="legend-note">Tokens/s: the trainers' training speed while they train (their own reports, summed). Bytes: the results all trainers sent for the step.</p></section>
    <section class="card"><h2>Clients</h2><div class="scroll"><table id="clients"><thead><tr>
      <th>#</th><th>signer</th><th>p2p id</th><th>health</th></tr></thead><tbody></tbody></table></div></section>
    <section class="card"><h2>Rounds (witnesses and quorum)</h2><div class="scroll"><table id="rounds"><thead><tr>
      <th>step</th><th>height</th><th>witnesses</th><th>quorum</th><th class="hide-phone">losses</th></tr></thead><tbody></tbody></table></div></section>
    <section class="card"><h2>Checkpoints</h2><div id="checkpoint"></div><div class="scroll"><table id="checkpoints"><thead><tr>
      <th>epoch</th><th>step</th><th>kind</th><th>source</th></tr></thead><tbody></tbody></table></div></section>
  </div>`;
  const loss = lineChart($("#loss-chart"), "", [
    { label: "training loss", stroke: C.blue, width: 2, spanGaps: true, points: { show: false } },
    { label: "held-out loss", stroke: C.vermillion, width: 2, dash: [6, 4], spanGaps: true, points: { show: true, size: 8, fill: C.vermillion } },
  ], [{ label: "loss" }]);
  const rate = lineChart($("#rate-chart"), "", [
    { label: "tokens/s", stroke: C.blue, width: 2, scale: "tps", spanGaps: true },
    { label: "bytes sent/step", stroke: C.orange, width: 2, dash: [4, 3], scale: "bytes", spanGaps: true },
  ], [{ label: "tokens/s", scale: "tps", values: (u, v) => v.map((x) => si(x)) },
    { label: "bytes", scale: "bytes", side: 1, grid: { show: false }, values: (u, v) => v.map((x) => si(x, "B")) }]);

  const points = new Map(); // step → point
  let view = null, skew = 0; // skew: the run's clock minus this browser's, seconds

  const render = () => {
    if (!view) return;
    const steps = [...points.keys()].sort((a, b) => a - b);
    const col = (f) => steps.map((s) => f(points.get(s)) ?? null);
    loss.setData([steps, col((p) => p.loss), col((p) => p.held_out)]);
    rate.setData([steps, col((p) => p.tokens_per_sec), col((p) => p.bytes_sent)]);
    $("#loss-chart").dataset.points = String(steps.filter((s) => points.get(s).loss != null).length);
    $("#loss-chart").dataset.heldOut = String(steps.filter((s) => points.get(s).held_out != null).length);
    const last = [...steps].reverse().map((s) => points.get(s)).find((p) => p.loss != null);
    $("#last-loss").textContent = last ? fmt(last.loss) : "–";
    $("#last-tps").textContent = last ? si(last.tokens_per_sec) : "–";
    $("#last-bytes").textContent = last ? si(last.bytes_sent, "B") : "–";

    $("#run-name").textContent = [view.name, view.description, view.parameters ? si(view.parameters) + " parameters" : ""].filter(Boolean).join(" · ");
    const st = $("#state");
    st.dataset.state = view.state;
    st.textContent = view.state + (view.pending_pause ? " (pause pending)" : "");
    $("#epoch").textContent = view.epoch;
    $("#step").textContent = view.total_epochs ? `${view.step} (the run ends after ${view.total_epochs} epochs)`
      : view.total_steps ? `${view.step} / ${view.total_steps}` : view.step;
    $("#healthy").textContent = `${view.clients.filter((c) => c.health === "healthy").length} (min ${view.min_clients})`;

    $("#clients tbody").innerHTML = view.clients.map((c) => `<tr data-signer="${esc(c.signer)}">
      <td>${c.index >= 0 ? c.index : ""}</td><td class="mono" title="${esc(c.signer)}">${esc(short(c.signer, 6))}</td>
      <td class="mono" title="${esc(c.p2p)}">${esc(short(c.p2p, 6))}</td>
      <td><span class="health" data-health="${esc(c.health)}">${esc(c.health)}</span></td></tr>`).join("") ||
      `<tr><td colspan="4" class="muted">no clients yet</td></tr>`;
    $("#rounds tbody").innerHTML = view.rounds.map((r) => {
      const met = r.witnesses.length >= r.quorum;
      const open = r.current && (view.state === "RoundTrain" || view.state === "RoundWitness");
      const verdict = met ? "✓ met" : open ? "… waiting" : "✗ short";
      return `<tr><td>${r.step}${r.current ? " (now)" : ""}</td><td>${r.height}</td>
        <td>${r.witnesses.length} / ${r.witness_slots}</td>
        <td class="${met ? "ok" : open ? "muted" : "short"}">${verdict} (${r.quorum})</td>
        <td class="hide-phone mono">${r.witnesses.map((w) => `#${w.index}: ${fmt(w.loss)}`).join(", ")}</td></tr>`;
    }).join("") || `<tr><td colspan="5" class="muted">no rounds in this epoch yet</td></tr>`;
    const ck = view.checkpoint;
    $("#checkpoint").innerHTML = ck && ck.kind !== "None"
      ? `<p>Model now: <b>${esc(ck.kind)}</b> <span class="mono">${esc(ck.url)}</span> ${ck.revision ? `<span class="muted">rev ${esc(short(ck.revision))}</span>` : ""}</p>` : "";
    if (view.data) $("#checkpoint").innerHTML += `<p>Data: <span class="mono">${esc(view.data)}</span></p>`;
    $("#checkpoints tbody").innerHTML = [...view.checkpoints].reverse().map((k) => `<tr><td>${k.epoch}</td><td>${k.step}</td>
      <td>${esc(k.kind)}${k.recorded ? " (recorded)" : ""}</td><td class="mono">${esc(short(k.url, 18))}</td></tr>`).join("");
    tick();
  };

  const tick = () => {
    if (!view) return;
    const now = Date.now() / 1000 + skew;
    let t = `since ${dur(now - view.state_start)}`;
    if (view.state_deadline) {
      const left = view.state_deadline - now;
      t += left > 0 ? ` · ${view.state_timeout} in ${dur(left)}` : ` · ${view.state_timeout} at the next tick`;
    }
    $("#timer").textContent = t;
    $("#epoch-timer").textContent = view.epoch_deadline
      ? `epoch started ${dur(now - view.epoch_start)} ago; its time ends ${view.epoch_deadline > now ? "in " + dur(view.epoch_deadline - now) : "now (two more steps)"}`
      : view.state === "Finished" ? "the run is finished" : view.state === "Paused" ? "the run is paused" : "";
  };
  const timer = setInterval(tick, 1000); // redraws the countdown; asks the server nothing

  const stop = stream(`api/runs/${encodeURIComponent(id)}/events`, {
    check: () => describeFailure(`api/runs/${encodeURIComponent(id)}`),
    onClock: (now) => { skew = now - Date.now() / 1000; tick(); },
    onData: (u) => {
      skew = u.now - Date.now() / 1000;
      if (u.reset) points.clear();
      for (const p of u.points) points.set(p.step, p);
      view = u.view;
      const problems = [u.error, view.error, u.listed ? "" : "This run is not listed by the backend any more"].filter(Boolean);
      showBanner(problems.join(". "));
      render();
    },
  });
  return () => { clearInterval(timer); stop(); };
}

// ---- routing ----
let leave = null;
function route() {
  if (leave) leave();
  showBanner("");
  const m = location.hash.match(/^#\/run\/(.+)$/);
  leave = m ? showRun(decodeURIComponent(m[1])) : showList();
}
window.addEventListener("hashchange", route);
route();
