// Solana's TransactionError in the JSON shape the RPC uses (what solana-go
// and web3.js decode): unit variants as strings, others as one-key objects,
// e.g. {"InstructionError":[0,{"Custom":6001}]}.
//
// LiteSVM hands back numbers for unit variants (its const enums exist only in
// its .d.ts, not at run time), so the names are listed here in enum order
// (litesvm 1.5.0 dist/internal.d.ts).

const TX_ERRORS = [
  "AccountInUse", "AccountLoadedTwice", "AccountNotFound", "ProgramAccountNotFound",
  "InsufficientFundsForFee", "InvalidAccountForFee", "AlreadyProcessed", "BlockhashNotFound",
  "CallChainTooDeep", "MissingSignatureForFee", "InvalidAccountIndex", "SignatureFailure",
  "InvalidProgramForExecution", "SanitizeFailure", "ClusterMaintenance", "AccountBorrowOutstanding",
  "WouldExceedMaxBlockCostLimit", "UnsupportedVersion", "InvalidWritableAccount",
  "WouldExceedMaxAccountCostLimit", "WouldExceedAccountDataBlockLimit", "TooManyAccountLocks",
  "AddressLookupTableNotFound", "InvalidAddressLookupTableOwner", "InvalidAddressLookupTableData",
  "InvalidAddressLookupTableIndex", "InvalidRentPayingAccount", "WouldExceedMaxVoteCostLimit",
  "WouldExceedAccountDataTotalLimit", "MaxLoadedAccountsDataSizeExceeded", "ResanitizationNeeded",
  "InvalidLoadedAccountsDataSizeLimit", "UnbalancedTransaction", "ProgramCacheHitMaxLimit",
  "CommitCancelled",
];

const IX_ERRORS = [
  "GenericError", "InvalidArgument", "InvalidInstructionData", "InvalidAccountData",
  "AccountDataTooSmall", "InsufficientFunds", "IncorrectProgramId", "MissingRequiredSignature",
  "AccountAlreadyInitialized", "UninitializedAccount", "UnbalancedInstruction", "ModifiedProgramId",
  "ExternalAccountLamportSpend", "ExternalAccountDataModified", "ReadonlyLamportChange",
  "ReadonlyDataModified", "DuplicateAccountIndex", "ExecutableModified", "RentEpochModified",
  "NotEnoughAccountKeys", "AccountDataSizeChanged", "AccountNotExecutable", "AccountBorrowFailed",
  "AccountBorrowOutstanding", "DuplicateAccountOutOfSync", "InvalidError", "ExecutableDataModified",
  "ExecutableLamportChange", "ExecutableAccountNotRentExempt", "UnsupportedProgramId", "CallDepth",
  "MissingAccount", "ReentrancyNotAllowed", "MaxSeedLengthExceeded", "InvalidSeeds", "InvalidRealloc",
  "ComputationalBudgetExceeded", "PrivilegeEscalation", "ProgramEnvironmentSetupFailure",
  "ProgramFailedToComplete", "ProgramFailedToCompile", "Immutable", "IncorrectAuthority",
  "AccountNotRentExempt", "InvalidAccountOwner", "ArithmeticOverflow", "UnsupportedSysvar",
  "IllegalOwner", "MaxAccountsDataAllocationsExceeded", "MaxAccountsExceeded",
  "MaxInstructionTraceLengthExceeded", "BuiltinProgramsMustConsumeComputeUnits", "BorshIoError",
];

function ixErrorJSON(e) {
  if (typeof e === "number") return IX_ERRORS[e] ?? `UnknownInstructionError(${e})`;
  if (e && typeof e.code === "number") return { Custom: e.code };
  if (e && typeof e.msg === "string") return "BorshIoError";
  return String(e);
}

// txErrorJSON converts a LiteSVM transaction error. The classes are told
// apart by their fields because LiteSVM does not export them all.
export function txErrorJSON(e) {
  if (typeof e === "number") return TX_ERRORS[e] ?? `UnknownTransactionError(${e})`;
  if (e && typeof e.err === "function" && typeof e.index === "number") {
    return { InstructionError: [e.index, ixErrorJSON(e.err())] };
  }
  if (e && typeof e.index === "number") return { DuplicateInstruction: e.index };
  if (e && typeof e.accountIndex === "number") {
    const name = e.constructor?.name?.includes("Restricted")
      ? "ProgramExecutionTemporarilyRestricted"
      : "InsufficientFundsForRent";
    return { [name]: { account_index: e.accountIndex } };
  }
  return String(e);
}

// describe renders an error the way the RPC's preflight message does, e.g.
// "Error processing Instruction 0: custom program error: 0x1771".
export function describe(err) {
  if (err && typeof err === "object" && "InstructionError" in err) {
    const [index, ix] = err.InstructionError;
    const what = typeof ix === "object" && "Custom" in ix ? `custom program error: 0x${ix.Custom.toString(16)}` : String(ix);
    return `Error processing Instruction ${index}: ${what}`;
  }
  return typeof err === "string" ? err : JSON.stringify(err);
}
