// Calls through function pointers: a const table (.data.rel.ro with
// R_BPF_64_ABS64 relocations against .text) and an address taken with lddw
// (R_BPF_64_64 against .text), both ending in callx, whose register the
// linker moves from dst to imm.
typedef unsigned long u64;

extern void sol_log_64_(u64 a, u64 b, u64 c, u64 d, u64 e);

typedef u64 (*op_fn)(u64, u64);

static u64 __attribute__((noinline)) add(u64 a, u64 b) { return a + b; }
static u64 __attribute__((noinline)) sub(u64 a, u64 b) { return a - b; }
static u64 __attribute__((noinline)) mul(u64 a, u64 b) { return a * b; }

static const op_fn ops[3] = {add, sub, mul};

u64 entrypoint(const unsigned char *input) {
	(void)input;
	u64 acc = 10;
	for (int i = 0; i < 3; i++) {
		volatile int j = i;
		acc = ops[j](acc, 3);
	}
	volatile op_fn f = add;
	acc = f(acc, 1);
	sol_log_64_(acc, 0, 0, 0, 0);
	return acc == 31 ? 0 : 1; // ((10+3)-3)*3+1
}
