// Read-only data reached through lddw (R_BPF_64_64 against .rodata and a
// mergeable string section), checked at run time and logged.
typedef unsigned long u64;

extern void sol_log_(const char *message, u64 len);
extern void sol_log_64_(u64 a, u64 b, u64 c, u64 d, u64 e);

static const u64 primes[8] = {2, 3, 5, 7, 11, 13, 17, 19};
static const char banner[] = "rodata: sum of primes";

u64 entrypoint(const unsigned char *input) {
	u64 sum = 0;
	for (int i = 0; i < 8; i++) {
		// Index through a volatile so the compiler cannot fold the table.
		volatile int j = i;
		sum += primes[j];
	}
	sol_log_(banner, sizeof banner - 1);
	sol_log_64_(sum, primes[7], (u64)input[0], 0, 0);
	return sum == 77 ? 0 : 1;
}
