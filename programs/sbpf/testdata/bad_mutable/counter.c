// A mutable global: the SBPFv0 loader rejects writable data, so the linker
// must refuse this object and name the variable.
typedef unsigned long u64;

u64 counter = 1;

u64 entrypoint(const unsigned char *input) {
	counter += input[0];
	return counter == 0;
}
