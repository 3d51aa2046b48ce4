// Package sbpf links BPF relocatable objects into SBPFv0 shared objects that
// the Solana runtime loads as programs.
//
// Debian's clang has only the upstream bpfel target (no Solana "sbf"), and
// neither ld.lld (it refuses e_machine 247) nor GNU bpf-ld (no shared objects)
// can produce what the runtime's loader wants, so this package is the linker.
// It reads one or more objects compiled with ClangArgs and writes the small
// ELF that solana-sbpf's lenient (v0) loader accepts:
//
//   - ET_DYN, e_machine EM_BPF (247), e_flags 0 (which selects SBPFv0);
//   - one .text (every executable input section, concatenated) and one
//     .rodata (every read-only input section, .data.rel.ro included), each
//     with sh_addr == sh_offset, because the loader maps the file bytes at
//     0x1_0000_0000 + offset;
//   - no .bss and no writable .data: programs have no mutable globals, and
//     the loader rejects such sections, so Link refuses them with
//     ErrMutableGlobal and names the symbols;
//   - e_entry at the "entrypoint" function;
//   - a .dynamic table with DT_SYMTAB/DT_STRTAB (.dynsym, .dynstr) and, only
//     when there are relocations, DT_REL/DT_RELSZ/DT_RELENT (the loader
//     rejects DT_RELSZ 0).
//
// Relocations are resolved here wherever the result is known at link time:
//
//   - R_BPF_64_64 on lddw and R_BPF_64_ABS64 in read-only data become the
//     absolute address 0x1_0000_0000 + vaddr + addend;
//   - R_BPF_64_32 on a call to a defined function becomes a pc-relative call
//     (src=1, imm = target/8 - pc - 1; the object's implicit addend is
//     (imm+1) instructions past the symbol);
//   - R_BPF_64_32 on a call to an undefined symbol stays a dynamic R_BPF_64_32
//     relocation with imm -1: the loader replaces it with the murmur3 hash of
//     the name and so binds the syscall (sol_log_, sol_sha256, ...).
//
// Upstream LLVM encodes callx's register in dst, SBPFv0 reads it from imm:
// Link moves it. JMP32 instructions (emitted by -mcpu=v3) are rejected because
// the v0 verifier refuses them.
//
// The output is a pure function of the inputs, so a committed .so can be
// checked against a rebuild byte for byte.
package sbpf
