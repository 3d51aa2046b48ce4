// Calls between functions: a static one in the same section (resolved by
// the assembler) and a global one defined in callee.c (an R_BPF_64_32 that
// the linker resolves across objects into a pc-relative call).
typedef unsigned long u64;

extern void sol_log_64_(u64 a, u64 b, u64 c, u64 d, u64 e);
u64 mix(u64 a, u64 b);

static u64 __attribute__((noinline)) square(u64 x) {
	return x * x;
}

u64 entrypoint(const unsigned char *input) {
	volatile u64 seven = 7;
	u64 s = square(seven);
	u64 m = mix(s, 5);
	sol_log_64_(s, m, (u64)input[0], 0, 0);
	return (s == 49 && m == 49 * 31 + 5) ? 0 : 1;
}
