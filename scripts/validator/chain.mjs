// The ledger behind the local validator: a LiteSVM instance plus what a
// validator has and LiteSVM does not — slots that advance with wall time, a
// window of recent blockhashes, signature statuses and change notifications.

import { Clock, LiteSVM } from "litesvm";
import {
  address,
  getBase58Decoder,
  getCompiledTransactionMessageDecoder,
  getTransactionDecoder,
  lamports,
} from "@solana/kit";
import fs from "node:fs";
import { txErrorJSON } from "./errors.mjs";

// Every account is rent exempt now, and validators report rentEpoch
// u64::MAX for them. It does not fit a double: it goes out as a BigInt.
export const RENT_EPOCH_EXEMPT = 18446744073709551615n;

// A blockhash is accepted for this many slots after it was produced, as on
// a real cluster (MAX_PROCESSING_AGE).
export const BLOCKHASH_VALID_SLOTS = 150;

// Signature statuses are kept this many slots (about an hour at 400ms), so
// a long-running validator does not grow without bound.
const STATUS_KEEP_SLOTS = 10_000n;

// SlotHashes keeps the most recent 512 (slot, hash) pairs.
const SLOT_HASHES_LEN = 512;

const b58 = getBase58Decoder(); // bytes -> base58 string

export class RPCError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

export function invalidParams(message) {
  return new RPCError(-32602, message);
}

export function parseAddress(s) {
  try {
    return address(s);
  } catch {
    throw invalidParams(`Invalid param: Invalid pubkey ${JSON.stringify(String(s))}`);
  }
}

export class Chain {
  constructor({ now = () => Date.now() } = {}) {
    this.now = now;
    // Recency is checked here against a window of blockhashes; LiteSVM alone
    // accepts only the very latest, which breaks any client that fetches a
    // blockhash in one slot and sends in the next.
    this.svm = new LiteSVM().withBlockhashCheck(false);
    this.slot = 0n;
    this.genesisUnix = BigInt(Math.floor(now() / 1000));
    this.recent = new Map(); // blockhash -> slot it was produced in
    this.slotHashes = [];
    this.statuses = new Map(); // base58 signature -> { slot, err, logs, unitsConsumed }
    this.listeners = new Set(); // ({kind: "commit"|"slot"}) => void
    this.genesisHash = this.svm.latestBlockhash();
    this.#produceBlockhash();
    this.#setClock();
  }

  on(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  #emit(event) {
    for (const l of this.listeners) l(event);
  }

  #produceBlockhash() {
    const bh = this.svm.latestBlockhash();
    this.recent.set(bh, this.slot);
    for (const [h, s] of this.recent) {
      if (this.slot - s > BigInt(BLOCKHASH_VALID_SLOTS)) this.recent.delete(h);
    }
    return bh;
  }

  // refreshClock writes the Clock sysvar from now() without a new slot (a
  // manual clock that was moved).
  refreshClock() {
    this.#setClock();
  }

  #setClock() {
    const unix = BigInt(Math.floor(this.now() / 1000));
    this.svm.setClock(new Clock(this.slot, this.genesisUnix, 0n, 1n, unix));
  }

  // advance moves to the next slot: new blockhash, Clock at the wall time,
  // the slot's hash at the front of SlotHashes.
  advance() {
    this.slot += 1n;
    this.svm.expireBlockhash();
    const bh = this.#produceBlockhash();
    this.#setClock();
    this.slotHashes.unshift({ slot: this.slot, hash: bh });
    if (this.slotHashes.length > SLOT_HASHES_LEN) this.slotHashes.length = SLOT_HASHES_LEN;
    this.svm.setSlotHashes(this.slotHashes);
    // Statuses are in insertion order, hence in slot order: drop from the front.
    for (const [sig, st] of this.statuses) {
      if (this.slot - st.slot <= STATUS_KEEP_SLOTS) break;
      this.statuses.delete(sig);
    }
    this.#emit({ kind: "slot", slot: this.slot });
  }

  latestBlockhash() {
    return {
      blockhash: this.svm.latestBlockhash(),
      lastValidBlockHeight: this.slot + BigInt(BLOCKHASH_VALID_SLOTS),
    };
  }

  isBlockhashValid(bh) {
    const s = this.recent.get(bh);
    return s !== undefined && this.slot - s <= BigInt(BLOCKHASH_VALID_SLOTS);
  }

  // account returns the account at a base58 address, or null.
  account(addr) {
    const a = this.svm.getAccount(parseAddress(addr));
    if (!a.exists) return null;
    return {
      lamports: a.lamports,
      data: a.data,
      owner: a.programAddress,
      executable: a.executable,
      rentEpoch: RENT_EPOCH_EXEMPT,
      space: BigInt(a.data.length),
    };
  }

  balance(addr) {
    return this.svm.getBalance(parseAddress(addr)) ?? 0n;
  }

  minimumBalanceForRentExemption(len) {
    return this.svm.minimumBalanceForRentExemption(BigInt(len));
  }

  // addProgram preloads a program (loader-v3 owned, executable) at id.
  addProgram(id, path) {
    this.svm.addProgram(parseAddress(id), fs.readFileSync(path));
    this.#emit({ kind: "commit" });
  }

  airdrop(addr, amount) {
    const to = parseAddress(addr);
    let res = this.svm.airdrop(to, lamports(BigInt(amount)));
    // LiteSVM signs airdrops itself with the latest blockhash: a second
    // identical airdrop in the same slot is a duplicate transaction. A fresh
    // blockhash makes it a new one.
    if (res && typeof res.err === "function" && txErrorJSON(res.err()) === "AlreadyProcessed") {
      this.svm.expireBlockhash();
      this.#produceBlockhash();
      res = this.svm.airdrop(to, lamports(BigInt(amount)));
    }
    if (!res) throw new RPCError(-32603, "airdrop failed");
    if (typeof res.err === "function") {
      throw new RPCError(-32603, `airdrop failed: ${JSON.stringify(txErrorJSON(res.err()))}`);
    }
    const sig = b58.decode(res.signature());
    this.statuses.set(sig, { slot: this.slot, err: null, logs: res.logs(), unitsConsumed: res.computeUnitsConsumed() });
    this.#emit({ kind: "commit" });
    return sig;
  }

  // decode splits wire bytes into LiteSVM's transaction and what the RPC
  // layer needs: the first signature and the blockhash.
  decode(bytes) {
    let tx, msg;
    try {
      tx = getTransactionDecoder().decode(bytes);
      msg = getCompiledTransactionMessageDecoder().decode(tx.messageBytes);
    } catch (e) {
      throw invalidParams(`invalid transaction: ${e.message}`);
    }
    const first = Object.values(tx.signatures)[0];
    const signature = first ? b58.decode(first) : "1111111111111111111111111111111111111111111111111111111111111111";
    return { tx, msg, signature, accounts: msg.staticAccounts ?? [] };
  }

  // send executes a transaction. It returns { signature, err, logs,
  // unitsConsumed }; err is null on success or the RPC's JSON form of the
  // TransactionError. Successful transactions and those that failed while
  // executing (they land on a real chain too) get a signature status.
  //
  // With preflight (the RPC default) the transaction is simulated first and
  // not executed at all if that fails, as a validator's preflight check
  // does: a rejected transaction then costs no fee.
  send(bytes, { preflight = true } = {}) {
    const { tx, msg, signature } = this.decode(bytes);
    if (!this.isBlockhashValid(msg.lifetimeToken)) {
      return { signature, err: "BlockhashNotFound", logs: [], unitsConsumed: 0n, landed: false };
    }
    if (preflight) {
      const sim = outcome(this.svm.simulateTransaction(tx), signature);
      if (sim.err !== null) return { ...sim, landed: false };
    }
    const res = this.svm.sendTransaction(tx);
    const out = outcome(res, signature);
    out.landed = out.err === null || (typeof out.err === "object" && "InstructionError" in out.err);
    if (out.landed) {
      this.statuses.set(signature, { slot: this.slot, err: out.err, logs: out.logs, unitsConsumed: out.unitsConsumed });
    }
    if (out.err === null) this.#emit({ kind: "commit" });
    return out;
  }

  // simulate runs a transaction without committing it.
  simulate(bytes, { sigVerify = false, replaceRecentBlockhash = false } = {}) {
    const { tx, msg, signature } = this.decode(bytes);
    if (!replaceRecentBlockhash && !this.isBlockhashValid(msg.lifetimeToken)) {
      return { signature, err: "BlockhashNotFound", logs: [], unitsConsumed: 0n, postAccounts: [] };
    }
    this.svm.withSigverify(sigVerify);
    let res;
    try {
      res = this.svm.simulateTransaction(tx);
    } finally {
      this.svm.withSigverify(true);
    }
    const out = outcome(res, signature);
    out.postAccounts = typeof res.postAccounts === "function" ? res.postAccounts() : [];
    return out;
  }
}

// outcome flattens LiteSVM's success and failure results.
function outcome(res, signature) {
  if (typeof res.err === "function") {
    const meta = res.meta();
    return { signature, err: txErrorJSON(res.err()), logs: meta.logs(), unitsConsumed: meta.computeUnitsConsumed() };
  }
  const meta = typeof res.meta === "function" ? res.meta() : res;
  return { signature, err: null, logs: meta.logs(), unitsConsumed: meta.computeUnitsConsumed() };
}
