/*
 * Parsing of the loader's serialized input (SBPFv0, aligned loaders):
 *
 *   u64 num_accounts
 *   per account: u8 dup (0xff: not a duplicate, else the index of the first
 *     occurrence, then 7 bytes of padding) | u8 is_signer, u8 is_writable,
 *     u8 executable, 4 bytes padding, key[32], owner[32], u64 lamports,
 *     u64 data_len, data, 10240 bytes of realloc room, padding to 8, u64 rent_epoch
 *   u64 instruction_data_len, instruction data, program_id[32]
 *
 * Every read is checked against in_len, so short or malformed input is
 * refused (ERR_TRUNCATED / ERR_MALFORMED) and never read past. The host
 * harness runs this parser on random and truncated inputs.
 */
#include "entry.h"

#define MAX_PERMITTED_DATA_INCREASE 10240
#define MAX_ACCOUNT_DATA (10ULL * 1024 * 1024)

struct cur {
	const uint8_t *p;
	uint64_t len;
	uint64_t off;
};

/* take returns the next n bytes, or 0 when fewer are left. */
static const uint8_t *take(struct cur *c, uint64_t n)
{
	if (n > c->len - c->off)
		return 0;
	const uint8_t *b = c->p + c->off;
	c->off += n;
	return b;
}

static int take_u64(struct cur *c, uint64_t *v)
{
	const uint8_t *b = take(c, 8);
	if (!b)
		return 0;
	uint64_t x = 0;
	for (int i = 7; i >= 0; i--)
		x = (x << 8) | b[i];
	*v = x;
	return 1;
}

uint64_t psy_parse_input(uint8_t *in, uint64_t in_len, struct psy_input *out)
{
	struct cur c = {in, in_len, 0};
	uint64_t n;
	if (!take_u64(&c, &n))
		return ERR_TRUNCATED;
	if (n > PSY_MAX_ACCOUNTS)
		return ERR_MALFORMED;
	out->num_accounts = n;
	for (uint64_t i = 0; i < n; i++) {
		struct psy_account_view *a = &out->accounts[i];
		const uint8_t *hdr = take(&c, 8);
		if (!hdr)
			return ERR_TRUNCATED;
		if (hdr[0] != 0xff) {
			if (hdr[0] >= i)
				return ERR_MALFORMED;
			*a = out->accounts[hdr[0]];
			continue;
		}
		a->is_signer = hdr[1];
		a->is_writable = hdr[2];
		a->executable = hdr[3];
		const uint8_t *key = take(&c, 32), *owner = take(&c, 32);
		uint8_t *lamports = (uint8_t *)take(&c, 8);
		uint64_t data_len;
		if (!key || !owner || !lamports || !take_u64(&c, &data_len))
			return ERR_TRUNCATED;
		if (data_len > MAX_ACCOUNT_DATA)
			return ERR_MALFORMED;
		a->key = key;
		a->owner = (uint8_t *)owner;
		a->lamports = (uint64_t *)lamports;
		a->data_len_ptr = (uint64_t *)(lamports + 8);
		a->data_len = data_len;
		a->data = (uint8_t *)c.p + c.off;
		uint64_t room = data_len + MAX_PERMITTED_DATA_INCREASE;
		room += (8 - room % 8) % 8;
		if (!take(&c, room) || !take_u64(&c, &a->rent_epoch))
			return ERR_TRUNCATED;
	}
	if (!take_u64(&c, &out->data_len))
		return ERR_TRUNCATED;
	out->data = take(&c, out->data_len);
	out->program_id = take(&c, 32);
	if (!out->data || !out->program_id)
		return ERR_TRUNCATED;
	return 0;
}
