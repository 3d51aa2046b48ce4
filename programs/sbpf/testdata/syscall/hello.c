// A call to an undefined function: the linker leaves a dynamic R_BPF_64_32
// relocation with imm -1 so the loader binds the sol_log_ syscall by name.
typedef unsigned long u64;

extern void sol_log_(const char *message, u64 len);

u64 entrypoint(const unsigned char *input) {
	(void)input;
	sol_log_("hello from sbpf", 15);
	return 0;
}
