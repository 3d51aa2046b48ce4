// Package coordinator holds the on-chain coordinator program: freestanding C
// in src/ that reproduces the Go state machine of package
// github.com/psyche-go/psyche/coordinator byte for byte, compiled to SBPF by
// scripts/build-program (clang-22 -target bpfel -mcpu=v2 and the repository's
// linker) into coordinator.so, which Program embeds.
//
// The sources (in src/ because the go command refuses .c files in a package
// directory that does not use cgo):
//
//   - psyche.h: the account as a C struct (offsets asserted against
//     coordinator/testdata/account_layout.golden), error codes, instructions;
//   - the state machine, one file for each Go file it ports: codec.c
//     (instruction decoding), account.c (account checks), config.c,
//     committee.c, data.c, machine.c (the transitions) and instruction.c
//     (one function an instruction, and psy_process), with core.h, their
//     shared header. psy_process(account, data, context) is
//     coordinator.Apply: the context carries the sender, the co-signer, now
//     and the seed, so the core is deterministic and testable off chain;
//   - hash.c: sha256 (through the sol_sha256 syscall), the swap-or-not
//     shuffle, and the witness blooms (murmur3-128 bit positions identical to
//     bits-and-blooms/bloom/v3 for m = 2560, k = 7);
//   - input.c: a bounds-checked parser of the loader's serialized input;
//   - entrypoint.c: the SBPF entrypoint: account checks (owner, instance PDA
//     ["coordinator", run_id] and bump, signer), now from the Clock sysvar,
//     the round seed from the SlotHashes sysvar (its grindability is discussed
//     there), then psy_process; init_coordinator creates the instance PDA
//     (refusing one that holds no lamports with InstanceNotFunded: the runtime
//     would drop it and strand the coordinator account's rent) and
//     free_coordinator closes both accounts.
//   - host/: a host build of every file but entrypoint.c (sha256 and the memory
//     syscalls written out in shim.c) that the tests drive over a pipe.
//
// Tests: the differential tests (TestScenarioFullRun, TestRandomSequences,
// TestMalformedInstructions) apply the same instruction bytes with the same
// context to the Go coordinator and to the host build of the C core and
// require identical result codes and identical account bytes after every
// step; TestInputParser checks the input parser on truncated and corrupted
// inputs under the address sanitizer; TestLayoutMatchesGolden and
// TestErrorCodesMatchGo check the ABI tables; TestProgramIsReproducible
// rebuilds coordinator.so; TestOnChain and TestOnChainAt256 run the built
// program on the local validator through real transactions and compare the
// account with the Go coordinator given the time and seed the program used.
// TestProgramCosts does the same for every instruction in every state a tick
// can leave (health_check and checkpoint included) and reads the compute
// units each consumed; with -costs it prints the table of scripts/bench-program.
//
// idl.json is the program's Anchor-style IDL (IDL builds it from the Go
// definitions; regenerate with `go run ./programs/cmd/gen-idl`).
// TestIDLIsCurrent requires the committed file; TestIDLNamedEnums the model's
// kind bytes as enums with the Go constants' names; TestIDLDecodesInstructions
// and TestIDLDecodesAccount decode the Go encoder's bytes with a Borsh
// decoder that knows nothing but the IDL and require the same values;
// TestProgramCosts builds every instruction's accounts from it.
package coordinator
