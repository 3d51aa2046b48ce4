#!/usr/bin/env node
// A local Solana validator for tests and for users without the Solana CLI:
// LiteSVM (the real Agave runtime and SBPF loader) behind Solana's JSON-RPC
// and websocket API, in the shapes Agave answers with, so that solana-go,
// @solana/web3.js and anchor work against it (docs/architecture.md §5; web3.test.mjs
// drives it with web3.js and anchor).
//
// RPC: getHealth getVersion getGenesisHash getSlot getBlockHeight
// getLatestBlockhash isBlockhashValid getMinimumBalanceForRentExemption
// getBalance getAccountInfo getMultipleAccounts getProgramAccounts (memcmp and
// dataSize filters, dataSlice, withContext) requestAirdrop (a signed transfer
// from a faucet) sendTransaction simulateTransaction getSignatureStatuses
// getTransaction getSignaturesForAddress getBlock getBlocks getBlocksWithLimit
// getBlockTime getEpochInfo getEpochSchedule getFeeForMessage
// getRecentPrioritizationFees getTransactionCount getIdentity getSlotLeader
// getSlotLeaders getClusterNodes getVoteAccounts getFirstAvailableBlock
// minimumLedgerSlot getMaxRetransmitSlot getMaxShredInsertSlot
// getHighestSnapshotSlot (there is none: error -32008, as Agave without one).
// Websocket: account, program, logs, signature and slot subscriptions.
// Every commitment is "finalized": one node, nothing to roll back. Versioned
// transactions run, but accounts they load from lookup tables are not listed
// in getTransaction's balances.
//
//   node validator.mjs [--port 0] [--slot-ms 400] [--program ID=path.so]... [--manual-clock] [--exit-with-stdin] [--verbose]
//
// It listens on 127.0.0.1 only and prints one JSON line on stdout when ready:
//   {"rpc":"http://127.0.0.1:PORT","websocket":"ws://127.0.0.1:PORT+1","slot_ms":400,...}
// The websocket is on the RPC port + 1, where web3.js and solana-test-validator
// put it, and also on the RPC port itself (older clients of this validator
// used that). With --port 0 it takes a free pair of ports. SIGINT/SIGTERM stop it; with
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
import { Chain, RENT_EPOCH_EXEMPT, RPCError, SLOTS_PER_EPOCH, invalidParams, isWritable, parseAddress } from "./chain.mjs";
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

// What Agave sends in an accountNotification when the account no longer
// exists (it was closed): a default account, never null — web3.js and
// others parse the value as an account and fail on null.
const DEFAULT_ACCOUNT = {
  lamports: 0n,
  data: new Uint8Array(),
  owner: "11111111111111111111111111111111",
  executable: false,
  rentEpoch: 0n,
  space: 0n,
};

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

// A u64 parameter: a non-negative safe integer or an exact BigInt.
function u64(v, what) {
  if ((typeof v === "number" && Number.isSafeInteger(v) && v >= 0) || (typeof v === "bigint" && v >= 0n && v < 1n << 64n)) {
    return BigInt(v);
  }
  throw invalidParams(`${what} must be a u64`);
}

function blockNotAvailable(slot) {
  return new RPCError(-32004, `Block not available for slot ${slot}`);
}

// checkVersion refuses, as Agave does, to hand a versioned transaction to a
// client that did not say it can read one; it returns the "version" field
// to add (undefined when the client did not ask for versions).
function checkVersion(msg, max) {
  if (max === undefined || max === null) {
    if (msg.version !== "legacy") {
      throw new RPCError(
        -32015,
        `Transaction version (${msg.version}) is not supported by the requesting client. Please try the request again with the following configuration parameter: "maxSupportedTransactionVersion": ${msg.version}`,
      );
    }
    return undefined;
  }
  if (msg.version !== "legacy" && msg.version > max) {
    throw new RPCError(-32015, `Transaction version (${msg.version}) is not supported by the requesting client`);
  }
  return msg.version;
}

// renderTx renders a landed transaction and its meta as getTransaction and
// getBlock return them (encodings json, jsonParsed, base64, base58).
function renderTx(rec, cfg) {
  const encoding = cfg.encoding ?? "json";
  const msg = rec.message;
  const version = checkVersion(msg, cfg.maxSupportedTransactionVersion);
  const keys = msg.staticAccounts;
  const parsed = encoding === "jsonParsed";
  const lookups = msg.addressTableLookups?.map((l) => ({
    accountKey: l.lookupTableAddress,
    writableIndexes: [...l.writableIndexes],
    readonlyIndexes: [...l.readonlyIndexes],
  }));
  let transaction;
  switch (encoding) {
    case "json":
      transaction = {
        signatures: rec.signatures,
        message: {
          accountKeys: keys,
          header: {
            numRequiredSignatures: msg.header.numSignerAccounts,
            numReadonlySignedAccounts: msg.header.numReadonlySignerAccounts,
            numReadonlyUnsignedAccounts: msg.header.numReadonlyNonSignerAccounts,
          },
          recentBlockhash: msg.lifetimeToken,
          instructions: msg.instructions.map((ix) => ({
            programIdIndex: ix.programAddressIndex,
            accounts: [...(ix.accountIndices ?? [])],
            data: b58dec.decode(ix.data ?? new Uint8Array()),
            stackHeight: null,
          })),
          addressTableLookups: lookups,
        },
      };
      break;
    case "jsonParsed":
      // Nothing here has a parser (Agave parses the system, token and a few
      // other programs): every instruction is "partially decoded", which is
      // what Agave sends for programs it cannot parse.
      transaction = {
        signatures: rec.signatures,
        message: {
          accountKeys: keys.map((k, i) => ({
            pubkey: k,
            signer: i < msg.header.numSignerAccounts,
            writable: isWritable(msg, i),
            source: "transaction",
          })),
          recentBlockhash: msg.lifetimeToken,
          instructions: msg.instructions.map((ix) => ({
            programId: keys[ix.programAddressIndex],
            accounts: [...(ix.accountIndices ?? [])].map((i) => keys[i]),
            data: b58dec.decode(ix.data ?? new Uint8Array()),
            stackHeight: null,
          })),
          addressTableLookups: lookups,
        },
      };
      break;
    case "base64":
      transaction = [b64dec.decode(rec.wire), "base64"];
      break;
    case "base58":
      transaction = [b58dec.decode(rec.wire), "base58"];
      break;
    default:
      throw invalidParams(`unsupported encoding: ${encoding}`);
  }
  const inner = parsed
    ? rec.innerInstructions.map(({ index, instructions }) => ({
        index,
        instructions: instructions.map((ix) => ({
          programId: keys[ix.programIdIndex],
          accounts: ix.accounts.map((i) => keys[i]),
          data: ix.data,
          stackHeight: ix.stackHeight,
        })),
      }))
    : rec.innerInstructions;
  return {
    transaction,
    meta: {
      err: rec.err,
      status: rec.err === null ? { Ok: null } : { Err: rec.err },
      fee: rec.fee,
      preBalances: rec.preBalances,
      postBalances: rec.postBalances,
      innerInstructions: inner,
      logMessages: rec.logs,
      preTokenBalances: [],
      postTokenBalances: [],
      rewards: [],
      loadedAddresses: { writable: [], readonly: [] },
      computeUnitsConsumed: rec.unitsConsumed,
    },
    version,
  };
}

// checkFilters validates getProgramAccounts/programSubscribe filters:
// memcmp and dataSize, at most 4, memcmp bytes at most 128 (Agave's limits).
function checkFilters(filters) {
  if (filters === undefined || filters === null) return [];
  if (!Array.isArray(filters)) throw invalidParams("filters must be an array");
  if (filters.length > 4) throw invalidParams(`Too many filters provided; max 4`);
  return filters.map((f) => {
    if (f && typeof f === "object" && "dataSize" in f) {
      return { dataSize: Number(u64(f.dataSize, "dataSize")) };
    }
    if (f && typeof f === "object" && f.memcmp && typeof f.memcmp === "object") {
      const { offset, bytes, encoding = "base58" } = f.memcmp;
      if (typeof bytes !== "string") throw invalidParams("memcmp bytes must be a string");
      let raw;
      try {
        if (encoding === "base58") {
          if (bytes.length > 175) throw new Error("encoded binary (base 58) data should be less than 129 bytes");
          raw = new Uint8Array(b58enc.encode(bytes));
        } else if (encoding === "base64") {
          raw = new Uint8Array(b64enc.encode(bytes));
        } else {
          throw new Error(`unsupported encoding ${encoding}`);
        }
      } catch (e) {
        throw invalidParams(`Invalid param: memcmp: ${e.message}`);
      }
      if (raw.length > 128) throw invalidParams("Invalid param: memcmp bytes longer than 128");
      return { offset: Number(u64(offset ?? 0, "memcmp offset")), bytes: raw };
    }
    throw invalidParams(`unsupported filter: ${stringify(f)}`);
  });
}

// filterMatches applies checked filters to an account's data.
function filterMatches(filters, data) {
  for (const f of filters) {
    if ("dataSize" in f) {
      if (data.length !== f.dataSize) return false;
    } else {
      if (f.offset + f.bytes.length > data.length) return false;
      for (let i = 0; i < f.bytes.length; i++) if (data[f.offset + i] !== f.bytes[i]) return false;
    }
  }
  return true;
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
  requestAirdrop: ([addr, amount]) => chain.airdrop(addr, u64(amount, "lamports")),
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
  getTransaction: ([sig, cfg]) => {
    if (typeof sig !== "string") throw invalidParams("signature must be a string");
    cfg ??= {};
    if (typeof cfg === "string") cfg = { encoding: cfg }; // the legacy form
    const rec = chain.statuses.get(sig);
    if (!rec) return null;
    return { slot: rec.slot, blockTime: rec.blockTime, ...renderTx(rec, cfg) };
  },
  getSignaturesForAddress: ([addr, cfg]) => {
    parseAddress(addr);
    cfg ??= {};
    const limit = cfg.limit === undefined ? 1000 : Number(u64(cfg.limit, "limit"));
    if (limit < 1 || limit > 1000) throw invalidParams("Invalid limit; max 1000");
    const recs = [...chain.statuses.entries()].reverse();
    let i = 0;
    if (cfg.before !== undefined) {
      i = recs.findIndex(([s]) => s === cfg.before);
      if (i < 0) return []; // an unknown "before" has nothing older that we keep
      i++;
    }
    const out = [];
    for (; i < recs.length && out.length < limit; i++) {
      const [sig, rec] = recs[i];
      if (sig === cfg.until) break;
      if (!rec.message.staticAccounts.includes(addr)) continue;
      out.push({ signature: sig, slot: rec.slot, err: rec.err, memo: null, blockTime: rec.blockTime, confirmationStatus: "finalized" });
    }
    return out;
  },
  getProgramAccounts: ([program, cfg]) => {
    cfg ??= {};
    const filters = checkFilters(cfg.filters);
    const value = chain
      .programAccounts(program)
      .filter(([, a]) => filterMatches(filters, a.data))
      .map(([pubkey, a]) => ({ pubkey, account: encodeAccount(a, cfg) }));
    return cfg.withContext ? { context: context(), value } : value;
  },
  getEpochSchedule: () => ({
    slotsPerEpoch: SLOTS_PER_EPOCH,
    leaderScheduleSlotOffset: SLOTS_PER_EPOCH,
    warmup: false,
    firstNormalEpoch: 0,
    firstNormalSlot: 0,
  }),
  getEpochInfo: () => ({
    absoluteSlot: chain.slot,
    blockHeight: chain.slot,
    epoch: chain.slot / SLOTS_PER_EPOCH,
    slotIndex: chain.slot % SLOTS_PER_EPOCH,
    slotsInEpoch: SLOTS_PER_EPOCH,
    transactionCount: chain.transactionCount,
  }),
  getFeeForMessage: ([msg, cfg]) => {
    if (typeof msg !== "string") throw invalidParams("message must be a base64 string");
    return { context: context(), value: chain.feeForMessage(decodeTx(msg, "base64")) };
  },
  getRecentPrioritizationFees: ([addrs]) => {
    addrs ??= [];
    if (!Array.isArray(addrs)) throw invalidParams("expected an array of pubkeys");
    if (addrs.length > 128) throw invalidParams("Too many inputs provided; max 128");
    for (const a of addrs) parseAddress(a);
    return chain.prioritizationFees(addrs);
  },
  getBlockTime: ([slot]) => {
    const block = chain.blocks.get(u64(slot, "slot"));
    if (!block) throw blockNotAvailable(slot);
    return block.unix;
  },
  getBlock: ([slot, cfg]) => {
    slot = u64(slot, "slot");
    cfg ??= {};
    if (typeof cfg === "string") cfg = { encoding: cfg };
    const block = chain.blocks.get(slot);
    if (!block) throw blockNotAvailable(slot);
    const out = {
      blockhash: block.blockhash,
      previousBlockhash: block.previousBlockhash,
      parentSlot: block.parentSlot,
      blockHeight: slot,
      blockTime: block.unix,
    };
    const recs = block.signatures.map((sig) => chain.statuses.get(sig)).filter(Boolean);
    switch (cfg.transactionDetails ?? "full") {
      case "full":
        out.transactions = recs.map((rec) => renderTx(rec, cfg));
        break;
      case "signatures":
        out.signatures = recs.map((rec) => rec.signatures[0]);
        break;
      case "none":
        break;
      default:
        throw invalidParams(`unsupported transactionDetails: ${cfg.transactionDetails}`);
    }
    if (cfg.rewards !== false) out.rewards = [];
    return out;
  },
  getBlocks: ([start, end]) => {
    start = u64(start, "start slot");
    end = end === undefined || end === null ? chain.slot : u64(end, "end slot");
    if (end - start > 500_000n) throw invalidParams("Slot range too large; max 500000");
    const out = [];
    for (let s = start > chain.firstSlot() ? start : chain.firstSlot(); s <= end && s <= chain.slot; s++) out.push(s);
    return out;
  },
  getBlocksWithLimit: ([start, limit]) => {
    start = u64(start, "start slot");
    limit = u64(limit, "limit");
    if (limit > 500_000n) throw invalidParams("Limit too large; max 500000");
    const out = [];
    for (let s = start > chain.firstSlot() ? start : chain.firstSlot(); BigInt(out.length) < limit && s <= chain.slot; s++) out.push(s);
    return out;
  },
  getFirstAvailableBlock: () => chain.firstSlot(),
  minimumLedgerSlot: () => chain.firstSlot(),
  getTransactionCount: () => chain.transactionCount,
  getIdentity: () => ({ identity: chain.identity }),
  getSlotLeader: () => chain.identity,
  getSlotLeaders: ([start, limit]) => {
    u64(start, "start slot");
    limit = u64(limit, "limit");
    if (limit > 5000n) throw invalidParams("Invalid limit; max 5000");
    return Array.from({ length: Number(limit) }, () => chain.identity);
  },
  getClusterNodes: () => [
    {
      pubkey: chain.identity,
      gossip: null,
      tpu: null,
      tpuQuic: null,
      rpc: `127.0.0.1:${rpcPort}`,
      pubsub: `127.0.0.1:${rpcPort + 1}`,
      version: SOLANA_CORE,
      featureSet: null,
      shredVersion: null,
    },
  ],
  // A validator that votes on nothing: there are no vote accounts.
  getVoteAccounts: () => ({ current: [], delinquent: [] }),
  getMaxRetransmitSlot: () => chain.slot,
  getMaxShredInsertSlot: () => chain.slot,
  getHighestSnapshotSlot: () => {
    throw new RPCError(-32008, "No snapshot");
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

// An account's rendering as a commit left it, shared by every subscription
// that asks for it in the same encoding: a coordinator account is ~160 KB,
// ~213 KB in base64, and rendering it once per subscriber per commit was
// most of this process's time in a training run (four trainers and a
// ticker each subscribe). Keyed by the commit event, so a new commit starts
// afresh.
let renderedEvent = null;
let rendered = new Map();
function renderedAccount(ev, address, account, cfg) {
  if (renderedEvent !== ev) {
    renderedEvent = ev;
    rendered = new Map();
  }
  const k = `${address} ${cfg.encoding}`;
  let r = rendered.get(k);
  if (!r) {
    const text = stringify(encodeAccount(account() ?? DEFAULT_ACCOUNT, cfg));
    // The UTF-8 bytes too: sending a string makes the websocket measure
    // and encode it again for every subscriber.
    r = { text, bytes: Buffer.from(text, "utf8") };
    rendered.set(k, r);
  }
  return r;
}

wss.on("connection", (sock) => {
  const subs = new Map(); // id -> { kind, ... }
  const send = (obj) => sock.readyState === sock.OPEN && sock.send(stringify(obj));
  const notify = (method, id, result) => send({ jsonrpc: "2.0", method, params: { result, subscription: id } });
  // notifyRendered is notify with a value already rendered (renderedAccount),
  // wrapped in before and after (JSON text) when it is part of one.
  const notifyRendered = (method, id, value, before = "", after = "") =>
    sock.readyState === sock.OPEN &&
    sock.send(
      Buffer.concat([
        Buffer.from(`{"jsonrpc":"2.0","method":${stringify(method)},"params":{"result":{"context":${stringify(context())},"value":${before}`),
        value.bytes,
        Buffer.from(`${after}},"subscription":${stringify(id)}}}`),
      ]),
      { binary: false },
    );

  const off = chain.on((ev) => {
    for (const [id, s] of subs) {
      if (s.kind === "account" && ev.kind === "commit") {
        const r = renderedAccount(ev, s.address, () => chain.account(s.address), s.cfg);
        if (r.text !== s.last) {
          s.last = r.text;
          notifyRendered("accountNotification", id, r);
        }
      } else if (s.kind === "program" && ev.kind === "commit") {
        for (const [pubkey, a] of chain.programAccounts(s.program)) {
          if (!filterMatches(s.filters, a.data)) continue;
          const r = renderedAccount(ev, pubkey, () => a, s.cfg);
          if (s.last.get(pubkey) !== r.text) {
            s.last.set(pubkey, r.text);
            notifyRendered("programNotification", id, r, `{"pubkey":${stringify(pubkey)},"account":`, "}");
          }
        }
      } else if (s.kind === "logs" && ev.kind === "commit" && ev.tx) {
        if (s.mentions === null || ev.tx.message.staticAccounts.includes(s.mentions)) {
          notify("logsNotification", id, { context: context(), value: { signature: ev.signature, err: ev.tx.err, logs: ev.tx.logs } });
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
      const enc = { encoding: cfg.encoding ?? "binary" };
      const value = encodeAccount(chain.account(addr) ?? DEFAULT_ACCOUNT, enc);
      const id = nextSubscription++;
      subs.set(id, { kind: "account", address: addr, cfg: enc, last: stringify(value) });
      return id;
    },
    programSubscribe: ([program, cfg]) => {
      cfg ??= {};
      const filters = checkFilters(cfg.filters);
      const enc = { encoding: cfg.encoding ?? "binary" };
      // The baseline: accounts as they are now are not notified.
      const last = new Map();
      for (const [pubkey, a] of chain.programAccounts(program)) {
        if (filterMatches(filters, a.data)) last.set(pubkey, stringify(encodeAccount(a, enc)));
      }
      const id = nextSubscription++;
      subs.set(id, { kind: "program", program, filters, cfg: enc, last });
      return id;
    },
    logsSubscribe: ([filter]) => {
      let mentions = null;
      if (filter && typeof filter === "object" && Array.isArray(filter.mentions)) {
        if (filter.mentions.length !== 1) throw invalidParams("Invalid Request: Only 1 address supported");
        mentions = parseAddress(filter.mentions[0]);
      } else if (filter !== "all" && filter !== "allWithVotes") {
        throw invalidParams('logs filter must be "all", "allWithVotes" or {"mentions": [address]}');
      }
      const id = nextSubscription++;
      subs.set(id, { kind: "logs", mentions });
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
  for (const name of ["accountUnsubscribe", "programUnsubscribe", "logsUnsubscribe", "signatureUnsubscribe", "slotUnsubscribe"]) {
    subscribe[name] = unsubscribe;
  }

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

const upgrade = (req, socket, head) => {
  wss.handleUpgrade(req, socket, head, (ws) => wss.emit("connection", ws, req));
};
server.on("upgrade", upgrade);
// The websocket's own port (RPC port + 1), as on solana-test-validator: it
// serves only subscriptions.
const pubsub = http.createServer((req, res) => res.writeHead(426, { upgrade: "websocket" }).end());
pubsub.on("upgrade", upgrade);

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
  pubsub.close();
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

const listen = (srv, p) =>
  new Promise((resolve, reject) => {
    const onError = (e) => reject(e);
    srv.once("error", onError);
    srv.listen(p, "127.0.0.1", () => {
      srv.off("error", onError);
      resolve(srv.address().port);
    });
  });

// listenPair binds the RPC port and the one after it. With --port 0 the
// kernel picks the RPC port, and the next one may be taken: then both are
// released and another pair is tried.
async function listenPair() {
  for (let attempt = 0; ; attempt++) {
    const p = await listen(server, port);
    try {
      await listen(pubsub, p + 1);
      return p;
    } catch (e) {
      await new Promise((r) => server.close(r));
      if (port !== 0 || attempt >= 50 || p + 1 > 65535) {
        fatal(`cannot listen for websockets on port ${p + 1} (RPC port + 1): ${e.message}`);
      }
    }
  }
}

let rpcPort = 0;
listenPair().then(
  (p) => {
    rpcPort = p;
    process.stdout.write(
      stringify({
        rpc: `http://127.0.0.1:${p}`,
        websocket: `ws://127.0.0.1:${p + 1}`,
        slot_ms: slotMs,
        manual_clock: manualMs !== null,
        programs,
        litesvm: LITESVM_VERSION,
      }) + "\n",
    );
  },
  (e) => fatal(`cannot listen on port ${port}: ${e.message}`),
);
