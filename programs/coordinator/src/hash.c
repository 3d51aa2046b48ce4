/*
 * Hashing for the coordinator: sha256 through the runtime, the swap-or-not
 * shuffle of committee/witness/checkpointer positions (coordinator/committee.go)
 * and the witness blooms, bit for bit those of bits-and-blooms/bloom/v3
 * (m = 2560, k = 7) over the 40-byte elements le64(key) ‖ member
 * (coordinator/bloom.go).
 */
#include "psyche.h"

void psy_sha256_2(const uint8_t *a, uint64_t alen, const uint8_t *b, uint64_t blen, uint8_t *out)
{
	SolBytes v[2];
	v[0].addr = a;
	v[0].len = alen;
	v[1].addr = b;
	v[1].len = blen;
	sol_sha256(v, blen ? 2 : 1, out);
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* ShuffleKey: sha256(sha256(le64(seed)) ‖ salt). */
void psy_shuffle_key(uint64_t seed, const char *salt, uint64_t salt_len, uint8_t *key)
{
	uint8_t le[8];
	uint8_t seed32[32];
	put_le64(le, seed);
	psy_sha256_2(le, 8, 0, 0, seed32);
	psy_sha256_2(seed32, 32, (const uint8_t *)salt, salt_len, key);
}

/* SwapOrNot: 90 rounds; round r: pivot = le64(sha256(key ‖ r)[0:8]) mod n,
 * flip = (pivot + n − i) mod n, p = max(i, flip), and i becomes flip when bit
 * p mod 256 of sha256(key ‖ r ‖ le32(p/256)) is set. */
uint64_t psy_swap_or_not(uint64_t index, uint64_t n, const uint8_t *key)
{
	if (n <= 1 || index >= n)
		return index;
	uint8_t buf[37];
	uint8_t h[32];
	for (int i = 0; i < 32; i++)
		buf[i] = key[i];
	for (int r = 0; r < PSY_SHUFFLE_ROUNDS; r++) {
		buf[32] = (uint8_t)r;
		psy_sha256_2(buf, 33, 0, 0, h);
		uint64_t pivot = get_le64(h) % n;
		uint64_t flip = (pivot + n - index) % n;
		uint64_t p = index > flip ? index : flip;
		uint32_t blk = (uint32_t)(p / 256);
		buf[33] = (uint8_t)blk;
		buf[34] = (uint8_t)(blk >> 8);
		buf[35] = (uint8_t)(blk >> 16);
		buf[36] = (uint8_t)(blk >> 24);
		psy_sha256_2(buf, 37, 0, 0, h);
		if ((h[(p % 256) / 8] >> (p % 8)) & 1)
			index = flip;
	}
	return index;
}

/* murmur3 x64 128, as bits-and-blooms/bloom/v3's digest128. */
#define C1 0x87c37b91114253d5ULL
#define C2 0x4cf5ad432745937fULL

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

static void bmix(uint64_t *h, uint64_t k1, uint64_t k2)
{
	uint64_t h1 = h[0], h2 = h[1];
	k1 *= C1;
	k1 = rotl(k1, 31);
	k1 *= C2;
	h1 ^= k1;
	h1 = rotl(h1, 27);
	h1 += h2;
	h1 = h1 * 5 + 0x52dce729;
	k2 *= C2;
	k2 = rotl(k2, 33);
	k2 *= C1;
	h2 ^= k2;
	h2 = rotl(h2, 31);
	h2 += h1;
	h2 = h2 * 5 + 0x38495ab5;
	h[0] = h1;
	h[1] = h2;
}

/* finish: the tail handling of digest128.sum128 for the only shape that
 * occurs here: an 8-byte tail word (k1), optionally followed by the virtual
 * byte 1 at tail position 8 (the second word k2 = 1), and the total length. */
static void finish(const uint64_t *h, uint64_t tail, int pad_one, uint64_t length, uint64_t *out)
{
	uint64_t h1 = h[0], h2 = h[1];
	if (pad_one) {
		uint64_t k2 = 1;
		k2 *= C2;
		k2 = rotl(k2, 33);
		k2 *= C1;
		h2 ^= k2;
	}
	uint64_t k1 = tail;
	k1 *= C1;
	k1 = rotl(k1, 31);
	k1 *= C2;
	h1 ^= k1;
	h1 ^= length;
	h2 ^= length;
	h1 += h2;
	h2 += h1;
	h1 = fmix64(h1);
	h2 = fmix64(h2);
	h1 += h2;
	h2 += h1;
	out[0] = h1;
	out[1] = h2;
}

/* baseHashes of the 40-byte element le64(key) ‖ member: two 16-byte blocks
 * and an 8-byte tail; sum256 hashes the data, then the data with a byte 1
 * appended (tail of 9 bytes). */
static void base_hashes(uint64_t key, const uint8_t *member, uint64_t *hs)
{
	uint64_t h[2] = {0, 0};
	bmix(h, key, get_le64(member));
	bmix(h, get_le64(member + 8), get_le64(member + 16));
	uint64_t tail = get_le64(member + 24);
	finish(h, tail, 0, 40, hs);
	finish(h, tail, 1, 41, hs + 2);
}

static uint64_t location(const uint64_t *h, uint64_t i)
{
	return (h[i % 2] + i * h[2 + (((i + (i % 2)) % 4) / 2)]) % PSY_BLOOM_BITS;
}

int psy_bloom_has(const uint64_t *words, uint64_t key, const uint8_t *member)
{
	uint64_t h[4];
	base_hashes(key, member, h);
	for (uint64_t i = 0; i < PSY_BLOOM_HASHES; i++) {
		uint64_t bit = location(h, i);
		if (!((words[bit / 64] >> (bit % 64)) & 1))
			return 0;
	}
	return 1;
}
