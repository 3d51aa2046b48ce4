#!/usr/bin/env node
// A local Solana validator for tests and for users without the Solana CLI:
// LiteSVM (the real Agave runtime and SBPF loader) behind the JSON-RPC and
// websocket subset that solana-go uses (DESIGN.md §5).
//
//   node validator.mjs [--port 0] [--slot-ms 400] [--program ID=path.so]... [--manual-clock] [--exit-with-stdin] [--verbose]
//
// It listens on 127.0.0.1 only and prints one JSON line on stdout when ready:
//   {"rpc":"http://127.0.0.1:PORT","websocket":"ws://127.0.0.1:PORT","slot_ms":400,...}
// JSON-RPC and websocket share the port. SIGINT/SIGTERM stop it; with
// --exit-with-stdin it also stops when its standard input closes, so it never
// outlives a parent that died without killing it.
//
// Slots always follow wall time. The Clock sysvar's unix_timestamp does too,
// unless --manual-clock is given: then it starts at the wall time and moves
// only when a client calls psycheSetClock([unixSeconds]) (a method of this
// validator, not of Solana's RPC), so a test can play a run in virtual time
// in which timeouts pass only when the test says.

import http from "node:http";
import process from "node:process";
import { parseArgs } from "node:util";
import { WebSocketServer } from "ws";
import { getBase58Decoder, getBase58Encoder, getBase64Decoder, getBase64Encoder } from "@solana/kit";
import { Chain, RENT_EPOCH_EXEMPT, RPCError, invalidParams } from "./chain.mjs";
import { describe } from "./errors.mjs";
import { JSONError, parse, stringify } from "./json.mjs";

const LITESVM_VERSION = "1.5.0";
// Agave version LiteSVM 1.5.0 embeds; reported by getVersion.
const SOLANA_CORE = "4.3.0";

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "slot-ms": { type: "string", default: "400" },
    program: { type: "string", multiple: true, default: [] },
    "manual-clock": { type: "boolean", default: false },
    "exit-with-stdin": { type: "boolean", default: false },
    verbose: { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  },
});
if (opts.help) {
  process.stdout.write(
    "usage: node validator.mjs [--port N] [--slot-ms MS] [--program ID=PATH]... [--manual-clock] [--exit-with-stdin] [--verbose]\n",
  );
  process.exit(0);
}
const port = Number(opts.port);
const slotMs = Number(opts["slot-ms"]);
if (!Number.isInteger(port) || port < 0 || port > 65535) fatal(`bad --port ${opts.port}`);
if (!Number.isFinite(slotMs) || slotMs < 1) fatal(`bad --slot-ms ${opts["slot-ms"]}`);

function fatal(msg) {
  process.stderr.write(`validator: ${msg}\n`);
  process.exit(2);
}
const log = opts.verbose ? (...a) => process.stderr.write(`validator: ${a.join(" ")}\n`) : () => {};

// The manual clock, in milliseconds (null: the wall clock).
let manualMs = opts["manual-clock"] ? Date.now() : null;
const chain = new Chain({ now: () => manualMs ?? Date.now() });
const programs = [];
for (const spec of opts.program) {
  const eq = spec.indexOf("=");
  if (eq <= 0) fatal(`--program wants ID=PATH, got ${spec}`);
  const id = spec.slice(0, eq);
  const path = spec.slice(eq + 1);
  try {
    chain.addProgram(id, path);
  } catch (e) {
    fatal(`loading program ${id} from ${path}: ${e.message ?? e}`);
  }
  programs.push({ id, path });
}

const b58enc = getBase58Encoder(); // base58 string -> bytes
const b58dec = getBase58Decoder(); // bytes -> base58 string
const b64enc = getBase64Encoder();
const b64dec = getBase64Decoder();

const context = () => ({ slot: chain.slot });

// encodeAccount renders an account for getAccountInfo and notifications.
function encodeAccount(a, cfg = {}) {
  if (!a) return null;
  let data = a.data;
  const slice = cfg.dataSlice;
  if (slice) {
    const off = Number(slice.offset ?? 0);
    data = data.subarray(off, off + Number(slice.length ?? 0));
  }
  let encoded;
  switch (cfg.encoding ?? "binary") {
    case "binary": // the legacy default: a bare base58 string
      encoded = b58dec.decode(data);
      break;
    case "base58":
      encoded = [b58dec.decode(data), "base58"];
      break;
    case "base64":
    case "jsonParsed": // nothing here is parsable: validators fall back to base64
      encoded = [b64dec.decode(data), "base64"];
      break;
    default:
      throw invalidParams(`unsupported encoding: ${cfg.encoding}`);
  }
  return {
    data: encoded,
    executable: a.executable,
    lamports: a.lamports,
    owner: a.owner,
    rentEpoch: a.rentEpoch,
    space: a.space,
  };
}

function decodeTx(s, encoding = "base58") {
  if (typeof s !== "string") throw invalidParams("transaction must be a string");
  try {
    if (encoding === "base64") return new Uint8Array(b64enc.encode(s));
    if (encoding === "base58") return new Uint8Array(b58enc.encode(s));
  } catch (e) {
    throw invalidParams(`invalid ${encoding}: ${e.message}`);
  }
  throw invalidParams(`unsupported encoding: ${encoding}`);
}

function statusOf(sig) {
  const s = chain.statuses.get(sig);
  if (!s) return null;
  return {
    slot: s.slot,
    confirmations: null,
    err: s.err,
    status: s.err === null ? { Ok: null } : { Err: s.err },
    confirmationStatus: "finalized",
  };
}

const methods = {
  psycheSetClock: ([unix]) => {
    if (manualMs === null) throw invalidParams("the clock follows wall time: start the validator with --manual-clock");
    if (typeof unix !== "number" || !Number.isSafeInteger(unix) || unix < 0) throw invalidParams("unix seconds must be a non-negative integer");
    const current = Math.floor(manualMs / 1000);
    if (unix < current) throw invalidParams(`the clock cannot go back (at ${current}, asked for ${unix})`);
    manualMs = unix * 1000;
    chain.refreshClock();
    return { slot: chain.slot, unixTimestamp: unix };
  },
  getHealth: () => "ok",
  getVersion: () => ({ "solana-core": SOLANA_CORE, "feature-set": 0, litesvm: LITESVM_VERSION }),
  getGenesisHash: () => chain.genesisHash,
  getSlot: () => chain.slot,
  getBlockHeight: () => chain.slot,
  getLatestBlockhash: () => ({ context: context(), value: chain.latestBlockhash() }),
  isBlockhashValid: ([bh]) => ({ context: context(), value: chain.isBlockhashValid(bh) }),
  getMinimumBalanceForRentExemption: ([len]) => {
    if (typeof len !== "number" || !Number.isInteger(len) || len < 0) throw invalidParams("data length must be a u64");
    return chain.minimumBalanceForRentExemption(len);
  },
  getBalance: ([addr]) => ({ context: context(), value: chain.balance(addr) }),
  getAccountInfo: ([addr, cfg]) => ({ context: context(), value: encodeAccount(chain.account(addr), cfg ?? {}) }),
  getMultipleAccounts: ([addrs, cfg]) => {
    cfg ??= {};
    if (!Array.isArray(addrs)) throw invalidParams("expected an array of pubkeys");
    return { context: context(), value: addrs.map((a) => encodeAccount(chain.account(a), cfg)) };
  },
  requestAirdrop: ([addr, amount]) => {
    if (typeof amount !== "number" && typeof amount !== "bigint") throw invalidParams("lamports must be a u64");
    return chain.airdrop(addr, amount);
  },
  sendTransaction: ([tx, cfg]) => {
    cfg ??= {};
    const bytes = decodeTx(tx, cfg.encoding);
    const out = chain.send(bytes, { preflight: !cfg.skipPreflight });
    log("sendTransaction", out.signature, JSON.stringify(out.err), `${out.unitsConsumed} CU`);
    // Failures that never land (bad blockhash, fee payer, signature) are
    // reported even with skipPreflight: a validator would drop them
    // silently, leaving the client to time out.
    if (out.err !== null && !(cfg.skipPreflight && out.landed)) {
      // What a validator's preflight simulation reports.
      throw new RPCError(-32002, `Transaction simulation failed: ${describe(out.err)}`, {
        err: out.err,
        logs: out.logs,
        accounts: null,
        unitsConsumed: out.unitsConsumed,
        returnData: null,
      });
    }
    return out.signature;
  },
  simulateTransaction: ([tx, cfg]) => {
    cfg ??= {};
    const bytes = decodeTx(tx, cfg.encoding);
    const out = chain.simulate(bytes, { sigVerify: !!cfg.sigVerify, replaceRecentBlockhash: !!cfg.replaceRecentBlockhash });
    let accounts = null;
    if (cfg.accounts?.addresses) {
      // Post-simulation state where the simulation had it, else current.
      const post = new Map(out.postAccounts.map((p) => [p.address, p]));
      accounts = cfg.accounts.addresses.map((a) => {
        const p = post.get(a);
        const acc = p
          ? {
              lamports: p.lamports,
              data: p.data,
              owner: p.programAddress,
              executable: p.executable,
              rentEpoch: RENT_EPOCH_EXEMPT,
              space: BigInt(p.data.length),
            }
          : chain.account(a);
        return encodeAccount(acc, { encoding: cfg.accounts.encoding ?? "base64" });
      });
    }
    return {
      context: context(),
      value: { err: out.err, logs: out.logs, accounts, unitsConsumed: out.unitsConsumed, returnData: null },
    };
  },
  getSignatureStatuses: ([sigs]) => {
    if (!Array.isArray(sigs)) throw invalidParams("expected an array of signatures");
    return { context: context(), value: sigs.map(statusOf) };
  },
  getTransaction: ([sig]) => {
    const s = chain.statuses.get(sig);
    if (!s) return null;
    return {
      slot: s.slot,
      blockTime: null,
      meta: { err: s.err, logMessages: s.logs, computeUnitsConsumed: s.unitsConsumed, status: s.err === null ? { Ok: null } : { Err: s.err } },
    };
  },
};

// call runs one JSON-RPC request object and returns the response object.
function call(req) {
  const id = req && typeof req === "object" && "id" in req ? req.id : null;
  if (!req || typeof req !== "object" || Array.isArray(req) || typeof req.method !== "string") {
    return { jsonrpc: "2.0", error: { code: -32600, message: "Invalid request" }, id };
  }
  const fn = methods[req.method];
  if (!fn) return { jsonrpc: "2.0", error: { code: -32601, message: "Method not found" }, id };
  try {
    const params = req.params === undefined ? [] : req.params;
    if (!Array.isArray(params)) throw invalidParams("params must be an array");
    return { jsonrpc: "2.0", result: fn(params), id };
  } catch (e) {
    if (e instanceof RPCError) {
      return { jsonrpc: "2.0", error: { code: e.code, message: e.message, data: e.data }, id };
    }
    log("internal error in", req.method, e.stack ?? e);
    return { jsonrpc: "2.0", error: { code: -32603, message: `Internal error: ${e.message ?? e}` }, id };
  }
}

function handleBody(text) {
  let req;
  try {
    req = parse(text);
  } catch (e) {
    if (!(e instanceof JSONError)) throw e;
    return stringify({ jsonrpc: "2.0", error: { code: -32700, message: `Parse error: ${e.message}` }, id: null });
  }
  if (Array.isArray(req)) return stringify(req.map(call));
  return stringify(call(req));
}

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/health") {
    res.writeHead(200, { "content-type": "text/plain" }).end("ok");
    return;
  }
  if (req.method !== "POST") {
    res.writeHead(405, { allow: "POST" }).end();
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = handleBody(Buffer.concat(chunks).toString("utf8"));
    res.writeHead(200, { "content-type": "application/json" }).end(body);
  });
});

// Websocket subscriptions. A subscription is registered and its baseline
// taken before the confirmation is sent, all in one turn of the event loop:
// every change committed after a client has read the confirmation is
// notified, and no notification ever precedes its confirmation. (solana-go's
// AccountSubscribe returns before the confirmation arrives: a client must
// wait for it — e.g. read the account once after subscribing — or it races.)
const wss = new WebSocketServer({ noServer: true, maxPayload: 1 << 20 });
let nextSubscription = 1;

wss.on("connection", (sock) => {
  const subs = new Map(); // id -> { kind, ... }
  const send = (obj) => sock.readyState === sock.OPEN && sock.send(stringify(obj));
  const notify = (method, id, result) => send({ jsonrpc: "2.0", method, params: { result, subscription: id } });

  const off = chain.on((ev) => {
    for (const [id, s] of subs) {
      if (s.kind === "account" && ev.kind === "commit") {
        const value = encodeAccount(chain.account(s.address), s.cfg);
        const text = stringify(value);
        if (text !== s.last) {
          s.last = text;
          notify("accountNotification", id, { context: context(), value });
        }
      } else if (s.kind === "signature" && ev.kind === "commit") {
        const st = chain.statuses.get(s.signature);
        if (st) {
          subs.delete(id); // signature subscriptions end with their notification
          notify("signatureNotification", id, { context: { slot: st.slot }, value: { err: st.err } });
        }
      } else if (s.kind === "slot" && ev.kind === "slot") {
        notify("slotNotification", id, { parent: ev.slot - 1n, root: ev.slot, slot: ev.slot });
      }
    }
  });
  sock.on("close", () => {
    off();
    subs.clear();
  });

  const subscribe = {
    accountSubscribe: ([addr, cfg]) => {
      cfg ??= {};
      const value = encodeAccount(chain.account(addr), { encoding: cfg.encoding ?? "binary" });
      const id = nextSubscription++;
      subs.set(id, { kind: "account", address: addr, cfg: { encoding: cfg.encoding ?? "binary" }, last: stringify(value) });
      return id;
    },
    signatureSubscribe: ([sig]) => {
      if (typeof sig !== "string") throw invalidParams("signature must be a string");
      const id = nextSubscription++;
      subs.set(id, { kind: "signature", signature: sig });
      const st = chain.statuses.get(sig);
      if (st) {
        // Already processed: notify right after the confirmation.
        subs.delete(id);
        queueMicrotask(() => notify("signatureNotification", id, { context: { slot: st.slot }, value: { err: st.err } }));
      }
      return id;
    },
    slotSubscribe: () => {
      const id = nextSubscription++;
      subs.set(id, { kind: "slot" });
      return id;
    },
  };
  const unsubscribe = ([id]) => subs.delete(Number(id));
  for (const name of ["accountUnsubscribe", "signatureUnsubscribe", "slotUnsubscribe"]) subscribe[name] = unsubscribe;

  sock.on("message", (raw) => {
    let req;
    try {
      req = parse(raw.toString("utf8"));
    } catch (e) {
      send({ jsonrpc: "2.0", error: { code: -32700, message: `Parse error: ${e.message}` }, id: null });
      return;
    }
    const fn = req && subscribe[req.method];
    if (!fn) {
      // Plain requests work over the socket as well.
      send(call(req));
      return;
    }
    try {
      send({ jsonrpc: "2.0", result: fn(Array.isArray(req.params) ? req.params : []), id: req.id ?? null });
    } catch (e) {
      const err = e instanceof RPCError ? { code: e.code, message: e.message } : { code: -32603, message: String(e) };
      send({ jsonrpc: "2.0", error: err, id: req.id ?? null });
    }
  });
});

server.on("upgrade", (req, socket, head) => {
  wss.handleUpgrade(req, socket, head, (ws) => wss.emit("connection", ws, req));
});

// Slots follow wall time: each tick catches up on every slot that is due, so
// a stalled event loop does not slow the chain's clock down.
const start = Date.now();
const ticker = setInterval(() => {
  const due = BigInt(Math.floor((Date.now() - start) / slotMs));
  while (chain.slot < due) chain.advance();
}, Math.max(1, Math.floor(slotMs / 4)));

function shutdown() {
  clearInterval(ticker);
  for (const c of wss.clients) c.terminate();
  server.close(() => process.exit(0));
  server.closeAllConnections?.();
}
process.on("SIGINT", shutdown);
process.on("SIGTERM", shutdown);
if (opts["exit-with-stdin"]) {
  process.stdin.on("end", shutdown);
  process.stdin.on("error", shutdown);
  process.stdin.resume();
}

server.listen(port, "127.0.0.1", () => {
  const p = server.address().port;
  process.stdout.write(
    stringify({
      rpc: `http://127.0.0.1:${p}`,
      websocket: `ws://127.0.0.1:${p}`,
      slot_ms: slotMs,
      manual_clock: manualMs !== null,
      programs,
      litesvm: LITESVM_VERSION,
    }) + "\n",
  );
});
