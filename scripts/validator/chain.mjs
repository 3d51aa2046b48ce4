// The ledger behind the local validator: a LiteSVM instance plus what a
// validator has and LiteSVM does not — slots that advance with wall time, a
// window of recent blockhashes, blocks, transactions with their fees and
// balances, a faucet, and change notifications.

import { Clock, EpochSchedule, LiteSVM } from "litesvm";
import {
  address,
  getBase58Decoder,
  getBase58Encoder,
  getCompiledTransactionMessageDecoder,
  getTransactionDecoder,
  lamports,
} from "@solana/kit";
import crypto from "node:crypto";
import fs from "node:fs";
import { txErrorJSON } from "./errors.mjs";

// Every account is rent exempt now, and validators report rentEpoch
// u64::MAX for them. It does not fit a double: it goes out as a BigInt.
export const RENT_EPOCH_EXEMPT = 18446744073709551615n;

// A blockhash is accepted for this many slots after it was produced, as on
// a real cluster (MAX_PROCESSING_AGE).
export const BLOCKHASH_VALID_SLOTS = 150;

// Signature statuses, transactions and blocks are kept this many slots
// (about an hour at 400ms), so a long-running validator does not grow without
// bound; minimumLedgerSlot says where the kept ledger starts.
const STATUS_KEEP_SLOTS = 10_000n;

// The epoch schedule: mainnet's epoch length without its warmup, so that an
// epoch is simply slot / SLOTS_PER_EPOCH in the EpochSchedule sysvar, the
// Clock sysvar and getEpochInfo alike.
export const SLOTS_PER_EPOCH = 432_000n;

// What a signature costs (Agave's default fee structure, which LiteSVM
// charges), and the compute budget rules the prioritization fee is computed
// with: ceil(price in micro-lamports × limit / 10^6).
export const LAMPORTS_PER_SIGNATURE = 5000n;
const COMPUTE_BUDGET = "ComputeBudget111111111111111111111111111111";
const DEFAULT_IX_UNITS = 200_000n;
const MAX_UNITS = 1_400_000n;

// getRecentPrioritizationFees looks this many slots back, as Agave's cache.
const PRIORITIZATION_SLOTS = 150n;

// The faucet starts with this much (requestAirdrop draws on it).
const FAUCET_LAMPORTS = 500_000_000n * 1_000_000_000n;

// SlotHashes keeps the most recent 512 (slot, hash) pairs.
const SLOT_HASHES_LEN = 512;

const b58 = getBase58Decoder(); // bytes -> base58 string
const b58enc = getBase58Encoder(); // base58 string -> bytes

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
    this.svm = new LiteSVM().withBlockhashCheck(false).withLamports(2n * FAUCET_LAMPORTS);
    this.svm.setEpochSchedule(new EpochSchedule(SLOTS_PER_EPOCH, SLOTS_PER_EPOCH, false, 0n, 0n));
    this.slot = 0n;
    this.genesisUnix = BigInt(Math.floor(now() / 1000));
    this.recent = new Map(); // blockhash -> slot it was produced in
    this.slotHashes = [];
    // base58 signature -> the landed transaction (see #record); insertion
    // order is slot order.
    this.statuses = new Map();
    this.blocks = new Map(); // slot -> { blockhash, previousBlockhash, parentSlot, unix, signatures }
    this.transactionCount = 0n;
    this.listeners = new Set(); // ({kind: "commit", tx?} | {kind: "slot", slot}) => void
    this.genesisHash = this.svm.latestBlockhash();
    this.#produceBlockhash();
    this.#setClock();
    this.#openBlock();
    // The validator's identity (getIdentity, the slot leader): it signs
    // nothing, so a fresh key is as good as any.
    this.identity = b58.decode(crypto.randomBytes(32));
    // The faucet: requestAirdrop sends real system transfers from it, which
    // get a signature, a fee and balances like every other transaction
    // (LiteSVM's own airdrop would leave getTransaction with nothing to show).
    const { publicKey, privateKey } = crypto.generateKeyPairSync("ed25519");
    this.faucetKey = privateKey;
    this.faucet = b58.decode(Buffer.from(publicKey.export({ format: "jwk" }).x, "base64url"));
    this.svm.airdrop(parseAddress(this.faucet), lamports(FAUCET_LAMPORTS));
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

  // #openBlock starts the current slot's block: every slot has one (this
  // validator never skips), holding the transactions that land in it.
  #openBlock() {
    const prev = this.blocks.get(this.slot - 1n);
    this.blocks.set(this.slot, {
      blockhash: this.svm.latestBlockhash(),
      previousBlockhash: prev ? prev.blockhash : this.genesisHash,
      parentSlot: this.slot === 0n ? 0n : this.slot - 1n,
      unix: BigInt(Math.floor(this.now() / 1000)),
      signatures: [],
    });
  }

  // refreshClock writes the Clock sysvar from now() without a new slot (a
  // manual clock that was moved).
  refreshClock() {
    this.#setClock();
  }

  #setClock() {
    const unix = BigInt(Math.floor(this.now() / 1000));
    const epoch = this.slot / SLOTS_PER_EPOCH;
    this.svm.setClock(new Clock(this.slot, this.genesisUnix, epoch, epoch + 1n, unix));
  }

  // advance moves to the next slot: new blockhash, Clock at the wall time,
  // the slot's hash at the front of SlotHashes, a new block.
  advance() {
    this.slot += 1n;
    this.svm.expireBlockhash();
    const bh = this.#produceBlockhash();
    this.#setClock();
    this.slotHashes.unshift({ slot: this.slot, hash: bh });
    if (this.slotHashes.length > SLOT_HASHES_LEN) this.slotHashes.length = SLOT_HASHES_LEN;
    this.svm.setSlotHashes(this.slotHashes);
    this.#openBlock();
    // Statuses are in insertion order, hence in slot order: drop from the front.
    for (const [sig, st] of this.statuses) {
      if (this.slot - st.slot <= STATUS_KEEP_SLOTS) break;
      this.statuses.delete(sig);
    }
    for (const s of this.blocks.keys()) {
      if (this.slot - s <= STATUS_KEEP_SLOTS) break;
      this.blocks.delete(s);
    }
    this.#emit({ kind: "slot", slot: this.slot });
  }

  // firstSlot is the oldest slot whose block is still kept.
  firstSlot() {
    for (const s of this.blocks.keys()) return s;
    return this.slot;
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
    return accountOf(this.svm.getAccount(parseAddress(addr)));
  }

  // programAccounts returns [address, account] for every account the
  // program owns.
  programAccounts(program) {
    return this.svm.getProgramAccounts(parseAddress(program)).map((a) => [a.address, accountOf({ ...a, exists: true })]);
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

  // airdrop sends amount lamports from the faucet and returns the
  // signature.
  airdrop(addr, amount) {
    const to = parseAddress(addr);
    amount = BigInt(amount);
    if (amount <= 0n || amount >= 1n << 64n) throw invalidParams("lamports must be a positive u64");
    let out = this.send(this.#faucetTransfer(to, amount), { preflight: true });
    // Two identical airdrops in one slot are one transaction (the same
    // blockhash gives the same signature): a fresh blockhash makes the
    // second a new one.
    if (out.err === "AlreadyProcessed") {
      this.svm.expireBlockhash();
      this.#produceBlockhash();
      out = this.send(this.#faucetTransfer(to, amount), { preflight: true });
    }
    if (out.err !== null) throw new RPCError(-32603, `airdrop failed: ${JSON.stringify(out.err)}`);
    return out.signature;
  }

  // #faucetTransfer builds the faucet's signed system transfer: a legacy
  // transaction written byte by byte (one signature, header 1/0/1, keys
  // [faucet, to, system program], transfer = u32 2 then u64 lamports).
  #faucetTransfer(to, amount) {
    const keys = [this.faucet, to, "11111111111111111111111111111111"].map((k) => b58enc.encode(k));
    const data = Buffer.alloc(12);
    data.writeUInt32LE(2, 0);
    data.writeBigUInt64LE(amount, 4);
    const message = Buffer.concat([
      Buffer.from([1, 0, 1, keys.length]),
      ...keys.map((k) => Buffer.from(k)),
      Buffer.from(b58enc.encode(this.svm.latestBlockhash())),
      Buffer.from([1, 2, 2, 0, 1, data.length]),
      data,
    ]);
    const sig = crypto.sign(null, message, this.faucetKey);
    return new Uint8Array(Buffer.concat([Buffer.from([1]), sig, message]));
  }

  // decode splits wire bytes into LiteSVM's transaction and what the RPC
  // layer needs: the signatures and the compiled message.
  decode(bytes) {
    let tx, msg;
    try {
      tx = getTransactionDecoder().decode(bytes);
      msg = getCompiledTransactionMessageDecoder().decode(tx.messageBytes);
    } catch (e) {
      throw invalidParams(`invalid transaction: ${e.message}`);
    }
    const signatures = Object.values(tx.signatures).map((s) => (s ? b58.decode(s) : "1111111111111111111111111111111111111111111111111111111111111111"));
    const signature = signatures[0] ?? "1111111111111111111111111111111111111111111111111111111111111111";
    return { tx, msg, signature, signatures, accounts: msg.staticAccounts ?? [] };
  }

  // send executes a transaction. It returns { signature, err, logs,
  // unitsConsumed, landed }; err is null on success or the RPC's JSON form
  // of the TransactionError. Successful transactions and those that failed
  // while executing (they land on a real chain too, and pay their fee) are
  // recorded: status, block, fee, balances.
  //
  // With preflight (the RPC default) the transaction is simulated first and
  // not executed at all if that fails, as a validator's preflight check
  // does: a rejected transaction then costs no fee.
  send(bytes, { preflight = true } = {}) {
    const { tx, msg, signature, signatures } = this.decode(bytes);
    if (!this.isBlockhashValid(msg.lifetimeToken)) {
      return { signature, err: "BlockhashNotFound", logs: [], unitsConsumed: 0n, landed: false };
    }
    if (preflight) {
      const sim = outcome(this.svm.simulateTransaction(tx), signature);
      if (sim.err !== null) return { ...sim, landed: false };
    }
    const keys = msg.staticAccounts ?? [];
    const preBalances = keys.map((k) => this.svm.getBalance(k) ?? 0n);
    const res = this.svm.sendTransaction(tx);
    const out = outcome(res, signature);
    out.landed = out.err === null || (typeof out.err === "object" && "InstructionError" in out.err);
    if (out.landed) {
      const rec = {
        slot: this.slot,
        err: out.err,
        logs: out.logs,
        unitsConsumed: out.unitsConsumed,
        signatures,
        message: msg,
        wire: bytes,
        fee: feeOf(msg).fee,
        unitPrice: feeOf(msg).unitPrice,
        preBalances,
        postBalances: keys.map((k) => this.svm.getBalance(k) ?? 0n),
        innerInstructions: out.innerInstructions,
      };
      this.statuses.set(signature, rec);
      const block = this.blocks.get(this.slot);
      block.signatures.push(signature);
      rec.blockTime = block.unix;
      this.transactionCount++;
      this.#emit({ kind: "commit", signature, tx: rec });
    }
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

  // feeForMessage is what a message would pay, or null when its blockhash
  // is no longer valid (getFeeForMessage's answer then).
  feeForMessage(bytes) {
    let msg;
    try {
      msg = getCompiledTransactionMessageDecoder().decode(bytes);
    } catch (e) {
      throw invalidParams(`invalid message: ${e.message}`);
    }
    return this.isBlockhashValid(msg.lifetimeToken) ? feeOf(msg).fee : null;
  }

  // prioritizationFees answers getRecentPrioritizationFees: for each kept
  // slot of the last 150, the lowest compute-unit price a landed
  // transaction paid in it, raised (as Agave does) to the lowest price paid
  // by transactions that write each of the given accounts.
  prioritizationFees(addresses) {
    const out = [];
    for (let s = this.slot > PRIORITIZATION_SLOTS ? this.slot - PRIORITIZATION_SLOTS + 1n : 0n; s <= this.slot; s++) {
      const block = this.blocks.get(s);
      if (!block) continue;
      const txs = block.signatures.map((sig) => this.statuses.get(sig)).filter(Boolean);
      const min = (list) => (list.length ? list.reduce((a, b) => (b < a ? b : a)) : 0n);
      let fee = min(txs.map((t) => t.unitPrice));
      for (const a of addresses) {
        fee = [fee, min(txs.filter((t) => writes(t.message, a)).map((t) => t.unitPrice))].reduce((x, y) => (y > x ? y : x));
      }
      out.push({ slot: s, prioritizationFee: fee });
    }
    return out;
  }
}

// accountOf renders LiteSVM's account, or null for one that does not exist.
function accountOf(a) {
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

// isWritable says whether the message locks its i-th static account for
// writing (the header's rule: signers first, then non-signers, each with
// their read-only ones last).
export function isWritable(msg, i) {
  const h = msg.header;
  const n = msg.staticAccounts.length;
  if (i < h.numSignerAccounts) return i < h.numSignerAccounts - h.numReadonlySignerAccounts;
  return i < n - h.numReadonlyNonSignerAccounts;
}

function writes(msg, addr) {
  return msg.staticAccounts.some((k, i) => k === addr && isWritable(msg, i));
}

// feeOf is the fee a message pays: LAMPORTS_PER_SIGNATURE per signature
// plus the prioritization fee its compute budget instructions ask for. The
// default unit limit is 200,000 per instruction that is not a compute budget
// one (capped at 1.4M); Agave gives built-in programs less, which only
// matters for a price without an explicit limit. Signatures checked by the
// ed25519/secp256k1 precompiles are not counted.
export function feeOf(msg) {
  let price = 0n;
  let limit = null;
  let others = 0n;
  for (const ix of msg.instructions) {
    const d = ix.data ?? new Uint8Array();
    if (msg.staticAccounts[ix.programAddressIndex] !== COMPUTE_BUDGET) {
      others++;
      continue;
    }
    const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
    if (d[0] === 2 && d.length >= 5) limit = BigInt(v.getUint32(1, true));
    if (d[0] === 3 && d.length >= 9) price = v.getBigUint64(1, true);
  }
  if (limit === null) limit = others * DEFAULT_IX_UNITS;
  if (limit > MAX_UNITS) limit = MAX_UNITS;
  const priority = (price * limit + 999_999n) / 1_000_000n;
  return { fee: BigInt(msg.header.numSignerAccounts) * LAMPORTS_PER_SIGNATURE + priority, unitPrice: price };
}

// outcome flattens LiteSVM's success and failure results.
function outcome(res, signature) {
  const failed = typeof res.err === "function";
  const meta = failed ? res.meta() : typeof res.meta === "function" ? res.meta() : res;
  return {
    signature,
    err: failed ? txErrorJSON(res.err()) : null,
    logs: meta.logs(),
    unitsConsumed: meta.computeUnitsConsumed(),
    innerInstructions: innerOf(meta),
  };
}

// innerOf renders the cross-program invocations each instruction made, in
// the RPC's shape (only instructions that made some are listed).
function innerOf(meta) {
  if (typeof meta.innerInstructions !== "function") return [];
  const out = [];
  meta.innerInstructions().forEach((list, index) => {
    if (list.length === 0) return;
    out.push({
      index,
      instructions: list.map((inner) => {
        const ix = inner.instruction();
        return {
          programIdIndex: ix.programIdIndex(),
          accounts: [...ix.accounts()],
          data: b58.decode(ix.data()),
          stackHeight: inner.stackHeight(),
        };
      }),
    });
  });
  return out;
}
