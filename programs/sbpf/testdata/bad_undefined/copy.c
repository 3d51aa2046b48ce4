// A call to a function that is neither defined nor a syscall (here memcpy,
// which the runtime does not provide: programs call sol_memcpy_). The
// linker must refuse it instead of leaving it for the loader to reject.
typedef unsigned long u64;

extern void *memcpy(void *dst, const void *src, u64 n);

u64 entrypoint(const unsigned char *input) {
	unsigned char buf[64];
	memcpy(buf, input, input[0]);
	return buf[1];
}
