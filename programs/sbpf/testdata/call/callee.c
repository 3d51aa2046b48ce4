// The other half of the call test: a global function defined in a second
// object.
typedef unsigned long u64;

static u64 __attribute__((noinline)) times31(u64 x) {
	return x * 31;
}

u64 __attribute__((noinline)) mix(u64 a, u64 b) {
	return times31(a) + b;
}
