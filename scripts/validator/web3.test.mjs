// node --test: the local validator as standard Solana clients see it. It
// starts validator.mjs with the committed coordinator program and drives it
// with @solana/web3.js and @coral-xyz/anchor from npm (the versions pinned in
// package.json), written only from the program's IDL: init, update, resume,
// join, ticks, reading and decoding the account, subscriptions (account,
// program, logs, signatures — on the RPC port + 1, where web3.js looks), the
// run's pause and close, and every RPC method a Solana tool calls that the
// validator serves. Nothing here waits on the wall clock: the validator runs a
// manual clock (psycheSetClock), and every wait is for an event.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import { createInterface } from "node:readline";
import test from "node:test";
import anchor from "@coral-xyz/anchor";
import {
  ComputeBudgetProgram,
  Connection,
  Keypair,
  LAMPORTS_PER_SOL,
  PublicKey,
  SendTransactionError,
  SystemProgram,
  SYSVAR_SLOT_HASHES_PUBKEY,
  Transaction,
  sendAndConfirmTransaction,
} from "@solana/web3.js";

const root = new URL("../../", import.meta.url);
const idl = JSON.parse(fs.readFileSync(new URL("programs/coordinator/idl.json", root), "utf8"));
const programPath = new URL("programs/coordinator/coordinator.so", root).pathname;
const programId = new PublicKey(idl.address);
const accountDef = idl.accounts.find((a) => a.name === "CoordinatorAccount");
const instanceDef = idl.accounts.find((a) => a.name === "CoordinatorInstance");
const errorCode = (name) => idl.errors.find((e) => e.name === name).code;

// startValidator runs validator.mjs until the test ends and returns the
// URLs it reports.
async function startValidator(t) {
  // 200 ms slots: a blockhash stays valid 150 slots, 30 s, which leaves a
  // loaded machine room between fetching one and the transaction landing.
  const child = spawn(
    process.execPath,
    [new URL("validator.mjs", import.meta.url).pathname, "--port", "0", "--slot-ms", "200", "--manual-clock", "--exit-with-stdin",
      "--program", `${idl.address}=${programPath}`],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const stop = async () => {
    child.stdin.end(); // --exit-with-stdin: it stops when its input closes
    if (child.exitCode === null) await once(child, "exit");
  };
  const lines = createInterface({ input: child.stdout });
  const [line] = await Promise.race([
    once(lines, "line"),
    once(child, "exit").then(([code]) => {
      throw new Error(`validator exited with ${code} before it was ready`);
    }),
  ]);
  return { ...JSON.parse(line), stop };
}

// closeSockets ends web3.js's websockets for good: with a normal closure
// and no reconnection (web3.js reconnects forever otherwise, which would
// keep the test process alive once the validator is gone).
function closeSockets(...connections) {
  for (const c of connections) {
    c._rpcWebSocket.setAutoReconnect(false);
    c._rpcWebSocket.close();
  }
}

// rpcCall calls a method web3.js has no wrapper for.
async function rpcCall(url, method, params = []) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }),
  });
  const body = await res.json();
  if (body.error) throw Object.assign(new Error(body.error.message), { code: body.error.code });
  return body.result;
}

// subscribed waits until web3.js has n subscriptions, all confirmed by the
// server.
async function subscribed(connection, n) {
  for (;;) {
    const subs = Object.values(connection._subscriptionsByHash);
    if (subs.length === n && subs.every((s) => s.state === "subscribed")) return;
    await new Promise((r) => setTimeout(r, 5));
  }
}

// waiter returns a callback to register and next(pick): a promise of the
// first call, past or future, for which pick returns something other than
// undefined. (Past calls count: a notification may arrive before the
// transaction's confirmation does.)
function waiter() {
  const seen = [];
  const pending = [];
  const callback = (...args) => {
    seen.push(args);
    for (let i = 0; i < pending.length; i++) {
      const v = pending[i].pick(...args);
      if (v !== undefined) {
        pending[i].resolve(v);
        pending.splice(i--, 1);
      }
    }
  };
  const next = (pick) => {
    for (const args of seen) {
      const v = pick(...args);
      if (v !== undefined) return Promise.resolve(v);
    }
    return new Promise((resolve) => pending.push({ pick, resolve }));
  };
  return { callback, next };
}

const fixed = (s, n) => {
  const b = Array(n).fill(0);
  Buffer.from(s).forEach((c, i) => (b[i] = c));
  return b;
};
const zeros = (n) => Array(n).fill(0);

// The run's config and model, written against the IDL's field names (anchor
// camel-cases them) with the enums by variant name.
const config = {
  warmupTime: new anchor.BN(30),
  cooldownTime: new anchor.BN(10),
  maxRoundTrainTime: new anchor.BN(20),
  roundWitnessTime: new anchor.BN(5),
  epochTime: new anchor.BN(100),
  waitingForMembersExtraTime: new anchor.BN(1),
  globalBatchSizeWarmupTokens: new anchor.BN(128),
  totalSteps: 100,
  globalBatchSizeStart: 6,
  globalBatchSizeEnd: 12,
  initMinClients: 1,
  minClients: 1,
  witnessNodes: 1,
  verificationPercent: 0,
  padding: zeros(1),
};
const model = {
  architecture: { gpt: {} },
  dataKind: { local: {} },
  tokenSize: 2,
  padding: zeros(1),
  maxSeqLen: 8,
  vocabSize: 256,
  dModel: 32,
  nLayers: 2,
  nHeads: 4,
  checkpoint: { kind: { p2P: {} }, padding: zeros(7), source: { url: fixed("file:///models/tiny", 128), revision: zeros(32) } },
  dataLocation: fixed("data/tokens.bin", 128),
  lr: { kind: { constant: {} }, padding: zeros(3), baseLr: 0.001, finalLr: 0, warmupSteps: 0, decaySteps: 0, totalSteps: 0 },
  optimizer: {
    kind: { distro: {} },
    quantize1Bit: true,
    compressionTopk: 4,
    compressionChunk: 8,
    aggregation: { robust: {} },
    normalization: { rms: {} },
    clipGradNorm: 0,
    weightDecay: 0,
    compressionDecay: 0.999,
    beta1: 0,
    beta2: 0,
    epsilon: 0,
  },
};

// customError is the custom program error in a refused transaction.
function customError(e) {
  assert.ok(e instanceof SendTransactionError, `want a SendTransactionError, got ${e}`);
  const m = /custom program error: 0x([0-9a-f]+)/.exec(e.message);
  return m ? parseInt(m[1], 16) : null;
}

test("web3.js and anchor drive the coordinator program on the local validator", async (t) => {
  // A StructError thrown inside web3.js's subscription handling surfaces
  // as an unhandled rejection (which kills a Node 20 client): fail on one.
  const unhandled = [];
  const onUnhandled = (e) => unhandled.push(e);
  process.on("unhandledRejection", onUnhandled);
  t.after(() => process.off("unhandledRejection", onUnhandled));

  const urls = await startValidator(t);
  // No wsEndpoint: web3.js derives it as the RPC port + 1.
  const connection = new Connection(urls.rpc, "confirmed");
  const samePort = new Connection(urls.rpc, { commitment: "confirmed", wsEndpoint: urls.rpc.replace("http", "ws") });
  assert.equal(urls.websocket, `ws://127.0.0.1:${Number(new URL(urls.rpc).port) + 1}`);
  const subs = [];
  t.after(async () => {
    for (const [remove, id] of subs) await remove(id).catch(() => {});
    closeSockets(connection, samePort);
    await urls.stop();
  });
  const program = new anchor.Program(idl, { connection });
  const setClock = async (delta) => {
    const { unixTimestamp } = await rpcCall(urls.rpc, "psycheSetClock", [Math.floor((await clockNow()) + delta)]);
    return unixTimestamp;
  };
  const clockNow = async () => {
    const info = await connection.getAccountInfo(new PublicKey("SysvarC1ock11111111111111111111111111111111"));
    return Number(info.data.readBigInt64LE(32));
  };

  const admin = Keypair.generate();
  const client = Keypair.generate();
  const coordinator = Keypair.generate();
  for (const k of [admin, client]) {
    const sig = await connection.requestAirdrop(k.publicKey, 10 * LAMPORTS_PER_SOL);
    const bh = await connection.getLatestBlockhash();
    await connection.confirmTransaction({ signature: sig, ...bh }); // signatureSubscribe on port + 1
  }
  assert.equal(await connection.getBalance(admin.publicKey), 10 * LAMPORTS_PER_SOL);

  const runId = fixed("web3-run", 32);
  const [instance, bump] = PublicKey.findProgramAddressSync([Buffer.from("coordinator"), Buffer.from("web3-run")], programId);
  const ixAccounts = (sender) => ({ instance, coordinator: coordinator.publicKey, ...sender });
  const send = (ixs, payer, ...signers) => sendAndConfirmTransaction(connection, new Transaction().add(...ixs), [payer, ...signers]);

  // Subscriptions first. web3.js returns from onAccountChange & co. before
  // the server has confirmed them, and a change made before the
  // confirmation would not be notified (as on any validator): wait for
  // web3.js to mark every one subscribed (internal state of the pinned
  // version; it moves when the confirmation arrives) before changing
  // anything.
  const accountEvents = waiter();
  subs.push([(id) => connection.removeAccountChangeListener(id), connection.onAccountChange(coordinator.publicKey, accountEvents.callback, "confirmed")]);
  const programEvents = waiter();
  subs.push([
    (id) => connection.removeProgramAccountChangeListener(id),
    connection.onProgramAccountChange(programId, programEvents.callback, { commitment: "confirmed", filters: [{ dataSize: accountDef.size }] }),
  ]);
  const logEvents = waiter();
  subs.push([(id) => connection.removeOnLogsListener(id), connection.onLogs(programId, logEvents.callback, "confirmed")]);

  await subscribed(connection, 3);

  // 1. create the account, fund the instance, init — in one transaction.
  const rent = await connection.getMinimumBalanceForRentExemption(accountDef.size);
  const instanceRent = await connection.getMinimumBalanceForRentExemption(instanceDef.size);
  const initIx = await program.methods
    .initCoordinator(admin.publicKey, PublicKey.default, runId)
    .accountsStrict(ixAccounts({ authority: admin.publicKey, systemProgram: SystemProgram.programId }))
    .instruction();
  const create = SystemProgram.createAccount({ fromPubkey: admin.publicKey, newAccountPubkey: coordinator.publicKey, lamports: rent, space: accountDef.size, programId });
  // Without funding the instance the program refuses the whole transaction.
  await assert.rejects(send([create, initIx], admin, coordinator), (e) => customError(e) === errorCode("InstanceNotFunded"));
  // Signed by someone other than the main authority it names: refused.
  const forged = await program.methods
    .initCoordinator(admin.publicKey, PublicKey.default, runId)
    .accountsStrict(ixAccounts({ authority: client.publicKey, systemProgram: SystemProgram.programId }))
    .instruction();
  const fund = SystemProgram.transfer({ fromPubkey: admin.publicKey, toPubkey: instance, lamports: instanceRent });
  await assert.rejects(send([create, fund, forged], admin, coordinator, client), (e) => customError(e) === errorCode("Unauthorized"));
  assert.equal(await connection.getAccountInfo(coordinator.publicKey), null, "a refused init created the account");
  const initSig = await send([create, fund, initIx], admin, coordinator);

  // decodeRun decodes a coordinator account's data with the IDL (null for
  // the empty data of a closed or not yet created account).
  const decodeRun = (data) => (data.length === accountDef.size ? program.coder.accounts.decode("coordinatorAccount", data) : null);
  const readRun = async () => program.coder.accounts.decode("coordinatorAccount", (await connection.getAccountInfo(coordinator.publicKey)).data);
  let run = await readRun();
  assert.ok(run.mainAuthority.equals(admin.publicKey));
  assert.deepEqual(run.runState, { uninitialized: {} });
  const inst = program.coder.accounts.decode("coordinatorInstance", (await connection.getAccountInfo(instance)).data);
  assert.equal(inst.bump, bump);
  assert.ok(inst.coordinator.equals(coordinator.publicKey));

  // 2. update (the model's kinds as named enums), 3. resume.
  const updateSig = await send(
    [await program.methods.update(null, config, model, null).accountsStrict(ixAccounts({ authority: admin.publicKey })).instruction()],
    admin,
  );
  run = await readRun();
  assert.deepEqual(run.model.architecture, { gpt: {} });
  assert.deepEqual(run.model.dataKind, { local: {} });
  assert.deepEqual(run.model.lr.kind, { constant: {} });
  assert.deepEqual(run.model.optimizer.kind, { distro: {} });
  const resumed = accountEvents.next((acct) => (decodeRun(acct.data)?.runState.waitingForMembers ? acct : undefined));
  await send([await program.methods.setPaused(false).accountsStrict(ixAccounts({ authority: admin.publicKey })).instruction()], admin);
  await resumed;

  // A tick with nothing due is refused with NothingDue, in preflight.
  const tickIx = () =>
    program.methods.tick().accountsStrict(ixAccounts({ sender: client.publicKey, slotHashes: SYSVAR_SLOT_HASHES_PUBKEY })).instruction();
  await assert.rejects(send([await tickIx()], client), (e) => customError(e) === errorCode("NothingDue"));
  // Sent without preflight it lands, fails and pays its fee, like on any
  // cluster: getTransaction shows both.
  const noPreflightBefore = await connection.getBalance(client.publicKey);
  const failedSig = await connection.sendTransaction(new Transaction().add(await tickIx()), [client], { skipPreflight: true });
  const failedStatus = await connection.confirmTransaction({ signature: failedSig, ...(await connection.getLatestBlockhash()) });
  assert.deepEqual(failedStatus.value.err, { InstructionError: [0, { Custom: errorCode("NothingDue") }] });
  const failedTx = await connection.getTransaction(failedSig, { maxSupportedTransactionVersion: 0 });
  assert.deepEqual(failedTx.meta.err, { InstructionError: [0, { Custom: errorCode("NothingDue") }] });
  assert.equal(failedTx.meta.fee, 5000);
  assert.equal(noPreflightBefore - (await connection.getBalance(client.publicKey)), 5000);

  // 4. join, then move the chain's clock past the wait and tick into warmup.
  // Anchor camel-cases the IDL's "p2p" as "p2P" (and would encode a
  // missing field as zeros, which the program refuses with InvalidClientID).
  const p2p = Keypair.generate().publicKey;
  await send([await program.methods.joinRun({ signer: client.publicKey, p2P: p2p }).accountsStrict(ixAccounts({ client: client.publicKey, joinAuthority: null })).instruction()], client);
  await setClock(2);
  const warmupSeen = accountEvents.next((acct, ctx) => {
    const s = decodeRun(acct.data);
    return s?.runState.warmup ? { s, ctx } : undefined;
  });
  const programSeen = programEvents.next((keyed) => {
    const s = decodeRun(keyed.accountInfo.data);
    return keyed.accountId.equals(coordinator.publicKey) && s?.runState.warmup ? s : undefined;
  });
  const tickBefore = await connection.getBalance(client.publicKey);
  const tickSig = await send([await tickIx()], client);
  const tickLogs = logEvents.next((logs) => (logs.signature === tickSig ? logs : undefined));
  const { s: warm } = await warmupSeen;
  assert.equal(warm.epoch.clientsLen, 1);
  assert.ok(warm.epoch.clients[0].id.signer.equals(client.publicKey));
  assert.equal((await programSeen).nonce.toString(), warm.nonce.toString());
  const logs = await tickLogs;
  assert.equal(logs.err, null);
  assert.ok(logs.logs.some((l) => l.startsWith(`Program ${programId.toBase58()} consumed`)), logs.logs.join("\n"));

  // getTransaction in the shape web3.js parses: fee, balances, the message.
  const tx = await connection.getTransaction(tickSig, { maxSupportedTransactionVersion: 0, commitment: "confirmed" });
  assert.equal(tx.meta.err, null);
  assert.equal(tx.meta.fee, 5000); // one signature, no priority fee
  assert.equal(tx.meta.preBalances[0] - tx.meta.postBalances[0], tx.meta.fee);
  assert.equal(tickBefore - (await connection.getBalance(client.publicKey)), tx.meta.fee);
  assert.equal(tx.version, "legacy");
  const keys = tx.transaction.message.staticAccountKeys.map((k) => k.toBase58());
  assert.deepEqual(keys.slice(0, 1), [client.publicKey.toBase58()]);
  assert.ok(keys.includes(programId.toBase58()) && keys.includes(coordinator.publicKey.toBase58()));
  assert.equal(tx.transaction.signatures[0], tickSig);
  assert.ok(tx.meta.logMessages.length > 0 && tx.meta.computeUnitsConsumed > 0);
  const parsed = await connection.getParsedTransaction(tickSig, { maxSupportedTransactionVersion: 0 });
  assert.ok(parsed.transaction.message.accountKeys[0].signer && parsed.transaction.message.accountKeys[0].pubkey.equals(client.publicKey));
  assert.ok(parsed.transaction.message.instructions[0].programId.equals(programId));
  // The init made inner instructions (allocate and assign of the instance).
  const initTx = await connection.getTransaction(initSig, { maxSupportedTransactionVersion: 0 });
  assert.ok(initTx.meta.innerInstructions.some((i) => i.instructions.length === 2), JSON.stringify(initTx.meta.innerInstructions));
  assert.equal(
    initTx.meta.preBalances[0] - initTx.meta.postBalances[0],
    initTx.meta.fee + rent + instanceRent,
    "the admin paid the fee and both accounts' rent",
  );
  assert.equal(initTx.meta.fee, 10000); // admin and the new account sign

  // getFeeForMessage agrees with what a transaction was charged.
  const bh = await connection.getLatestBlockhash();
  const tickMsg = new Transaction({ feePayer: client.publicKey, ...bh }).add(await tickIx()).compileMessage();
  assert.equal((await connection.getFeeForMessage(tickMsg)).value, 5000);

  // A priority fee: 5000 + ceil(1000 micro-lamports × 300,000 units / 10^6).
  const before = await connection.getBalance(admin.publicKey);
  const prioritySig = await send(
    [
      ComputeBudgetProgram.setComputeUnitLimit({ units: 300_000 }),
      ComputeBudgetProgram.setComputeUnitPrice({ microLamports: 1000 }),
      SystemProgram.transfer({ fromPubkey: admin.publicKey, toPubkey: client.publicKey, lamports: 1_000_000 }),
    ],
    admin,
  );
  const priority = await connection.getTransaction(prioritySig, { maxSupportedTransactionVersion: 0 });
  assert.equal(priority.meta.fee, 5300);
  assert.equal(before - (await connection.getBalance(admin.publicKey)), 1_000_000 + 5300, "the runtime charged another fee than meta.fee says");
  const priorityMsg = new Transaction({ feePayer: admin.publicKey, ...(await connection.getLatestBlockhash()) })
    .add(ComputeBudgetProgram.setComputeUnitLimit({ units: 300_000 }), ComputeBudgetProgram.setComputeUnitPrice({ microLamports: 1000 }))
    .compileMessage();
  assert.equal((await connection.getFeeForMessage(priorityMsg)).value, 5300);
  const fees = await connection.getRecentPrioritizationFees({ lockedWritableAccounts: [admin.publicKey] });
  assert.ok(fees.some((f) => f.slot === priority.slot && f.prioritizationFee === 1000), JSON.stringify(fees));
  assert.ok(fees.every((f) => f.slot !== tx.slot || f.prioritizationFee === 0 || f.slot === priority.slot));

  // getProgramAccounts with filters, as anchor's account.all() sends them
  // (memcmp on the discriminator) and by size.
  const all = await program.account.coordinatorAccount.all();
  assert.deepEqual(all.map((a) => a.publicKey.toBase58()), [coordinator.publicKey.toBase58()]);
  const mainAuthorityOffset = Buffer.from((await connection.getAccountInfo(coordinator.publicKey)).data).indexOf(admin.publicKey.toBuffer());
  const byAuthority = await program.account.coordinatorAccount.all([{ memcmp: { offset: mainAuthorityOffset, bytes: admin.publicKey.toBase58() } }]);
  assert.equal(byAuthority.length, 1);
  const byOther = await program.account.coordinatorAccount.all([{ memcmp: { offset: mainAuthorityOffset, bytes: client.publicKey.toBase58() } }]);
  assert.equal(byOther.length, 0);
  const instances = await connection.getProgramAccounts(programId, { filters: [{ dataSize: instanceDef.size }] });
  assert.deepEqual(instances.map((a) => a.pubkey.toBase58()), [instance.toBase58()]);
  const base64Memcmp = await connection.getProgramAccounts(programId, {
    filters: [{ memcmp: { offset: 0, bytes: Buffer.from(instanceDef.discriminator).toString("base64"), encoding: "base64" } }],
    dataSlice: { offset: 0, length: 8 },
  });
  assert.equal(base64Memcmp.length, 1);
  assert.equal(base64Memcmp[0].account.data.length, 8);
  await assert.rejects(rpcCall(urls.rpc, "getProgramAccounts", [programId.toBase58(), { filters: [{ dataSize: 1 }, { dataSize: 1 }, { dataSize: 1 }, { dataSize: 1 }, { dataSize: 1 }] }]), (e) => e.code === -32602);

  // getSignaturesForAddress: newest first, with before and limit.
  const history = await connection.getSignaturesForAddress(coordinator.publicKey);
  const order = history.map((h) => h.signature);
  for (const [a, b] of [[tickSig, updateSig], [updateSig, initSig]]) {
    assert.ok(order.indexOf(a) >= 0 && order.indexOf(a) < order.indexOf(b), `${a} before ${b} in ${order}`);
  }
  assert.equal(order.at(-1), initSig);
  assert.ok(history.every((h) => h.confirmationStatus === "finalized"));
  for (const h of history) {
    const want = h.signature === failedSig ? { InstructionError: [0, { Custom: errorCode("NothingDue") }] } : null;
    assert.deepEqual(h.err, want, h.signature);
  }
  assert.ok(order.includes(failedSig));
  const older = await connection.getSignaturesForAddress(coordinator.publicKey, { before: tickSig, limit: 1 });
  assert.deepEqual(older.map((h) => h.signature), [order[order.indexOf(tickSig) + 1]]);

  // Blocks, epochs and the cluster.
  assert.equal(await connection.getBlockTime(tx.slot), tx.blockTime);
  const block = await connection.getBlock(tx.slot, { maxSupportedTransactionVersion: 0 });
  assert.ok(block.transactions.some((b) => b.transaction.signatures[0] === tickSig));
  assert.equal(block.blockTime, tx.blockTime);
  const parent = await connection.getBlock(block.parentSlot, { maxSupportedTransactionVersion: 0, transactionDetails: "none" });
  assert.equal(block.previousBlockhash, parent.blockhash);
  const sigsOnly = await connection.getBlockSignatures(tx.slot);
  assert.ok(sigsOnly.signatures.includes(tickSig));
  await assert.rejects(connection.getBlock(Number.MAX_SAFE_INTEGER - 1, { maxSupportedTransactionVersion: 0 }));
  const slot = await connection.getSlot();
  const epochInfo = await connection.getEpochInfo();
  const schedule = await connection.getEpochSchedule();
  assert.ok(epochInfo.absoluteSlot >= slot && epochInfo.slotsInEpoch === schedule.slotsPerEpoch);
  assert.equal(epochInfo.epoch, schedule.getEpoch(epochInfo.absoluteSlot));
  // Two airdrops, init, update, resume, join, tick, the priority transfer.
  const count = await connection.getTransactionCount();
  assert.ok(count >= 8 && count >= epochInfo.transactionCount, `transaction count ${count}`);
  const first = await connection.getFirstAvailableBlock();
  assert.equal(await connection.getMinimumLedgerSlot(), first);
  // Every slot has a block here (nothing is skipped).
  const end = Math.min(first + 2, slot);
  const range = Array.from({ length: end - first + 1 }, (_, i) => first + i);
  assert.deepEqual(await connection.getBlocks(first, end), range);
  assert.deepEqual(await rpcCall(urls.rpc, "getBlocksWithLimit", [first, range.length]), range);
  assert.ok((await rpcCall(urls.rpc, "getMaxRetransmitSlot")) >= slot);
  assert.ok((await rpcCall(urls.rpc, "getMaxShredInsertSlot")) >= slot);
  await assert.rejects(rpcCall(urls.rpc, "getHighestSnapshotSlot"), (e) => e.code === -32008); // no snapshots, as Agave says
  assert.ok((await connection.getRecentPrioritizationFees()).length > 0);
  const { identity } = await rpcCall(urls.rpc, "getIdentity"); // web3.js has no wrapper
  assert.equal(new PublicKey(identity).toBase58(), identity);
  assert.equal(await connection.getSlotLeader(), identity);
  assert.deepEqual((await connection.getSlotLeaders(slot, 2)).map((k) => k.toBase58()), [identity, identity]);
  const nodes = await connection.getClusterNodes();
  assert.equal(nodes.length, 1);
  assert.equal(nodes[0].pubkey, identity);
  assert.deepEqual(await connection.getVoteAccounts(), { current: [], delinquent: [] });
  assert.ok((await connection.getVersion())["solana-core"]);
  assert.ok(await connection.getGenesisHash());
  assert.ok((await connection.getBlockHeight()) >= slot);

  // Pause (withdraws the client in warmup) and free: the account is closed,
  // and its subscriber gets the default account Agave sends, which web3.js
  // parses.
  await send([await program.methods.setPaused(true).accountsStrict(ixAccounts({ authority: admin.publicKey })).instruction()], admin);
  const closed = accountEvents.next((acct) => (acct.lamports === 0 ? acct : undefined));
  const adminBefore = await connection.getBalance(admin.publicKey);
  const freeSig = await send([await program.methods.freeCoordinator().accountsStrict(ixAccounts({ authority: admin.publicKey })).instruction()], admin);
  const gone = await closed;
  assert.ok(gone.owner.equals(SystemProgram.programId));
  assert.equal(gone.data.length, 0);
  assert.equal(gone.executable, false);
  assert.equal(await connection.getAccountInfo(coordinator.publicKey), null);
  assert.equal(await connection.getAccountInfo(instance), null);
  const freeTx = await connection.getTransaction(freeSig, { maxSupportedTransactionVersion: 0 });
  assert.equal((await connection.getBalance(admin.publicKey)) - adminBefore, rent + instanceRent - freeTx.meta.fee);

  // The RPC port itself still takes websockets (this validator's older
  // clients use it).
  const slotSeen = new Promise((resolve) => {
    const id = samePort.onSlotChange((s) => {
      samePort.removeSlotChangeListener(id);
      resolve(s.slot);
    });
  });
  assert.ok((await slotSeen) > 0);

  assert.deepEqual(unhandled, []);
});
