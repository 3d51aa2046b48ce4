/*
 * The coordinator core on the host, for the Go differential tests
 * (programs/coordinator). It reads requests from stdin until EOF and answers
 * each on stdout; all integers are little-endian u64:
 *
 *   request:  acct_len, acct, data_len, data, sender[32], co_signer[32], now, seed
 *   response: code, ix_kind, acct_len, acct (after the instruction)
 *
 * A request whose first word is PARSE_REQUEST runs the SBPF input parser
 * (input.c) on the bytes that follow instead:
 *
 *   request:  PARSE_REQUEST, len, bytes
 *   response: code, num_accounts, then per account: key offset, data offset,
 *             data_len, is_signer, is_writable; instruction data offset and
 *             length, program id offset (offsets from the start of the bytes)
 */
#define PARSE_REQUEST 0xffffffffffffffffULL
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../entry.h"

static int read_full(void *p, size_t n) { return fread(p, 1, n, stdin) == n; }

static uint64_t read_u64(int *ok)
{
	uint8_t b[8];
	if (!read_full(b, 8)) {
		*ok = 0;
		return 0;
	}
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static void write_u64(uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	fwrite(b, 1, 8, stdout);
}

int main(void)
{
	for (;;) {
		int ok = 1;
		uint64_t acct_len = read_u64(&ok);
		if (!ok)
			return 0; /* EOF: done */
		if (acct_len == PARSE_REQUEST) {
			uint64_t n = read_u64(&ok);
			if (!ok || n > (1u << 24))
				return 2;
			uint8_t *in = malloc(n ? n : 1);
			if (!in || !read_full(in, n))
				return 2;
			struct psy_input parsed;
			memset(&parsed, 0, sizeof parsed);
			uint64_t code = psy_parse_input(in, n, &parsed);
			write_u64(code);
			write_u64(code ? 0 : parsed.num_accounts);
			for (uint64_t i = 0; !code && i < parsed.num_accounts; i++) {
				struct psy_account_view *a = &parsed.accounts[i];
				write_u64((uint64_t)(a->key - in));
				write_u64((uint64_t)(a->data - in));
				write_u64(a->data_len);
				write_u64(a->is_signer);
				write_u64(a->is_writable);
			}
			if (!code) {
				write_u64((uint64_t)(parsed.data - in));
				write_u64(parsed.data_len);
				write_u64((uint64_t)(parsed.program_id - in));
			}
			fflush(stdout);
			free(in);
			continue;
		}
		if (acct_len > (1u << 20))
			return 2;
		/* Exact-size allocations, so that the sanitizer catches any read
		 * past either buffer. */
		uint8_t *acct = malloc(acct_len ? acct_len : 1);
		if (!acct || !read_full(acct, acct_len))
			return 2;
		uint64_t data_len = read_u64(&ok);
		if (!ok || data_len > (1u << 20))
			return 2;
		uint8_t *data = malloc(data_len ? data_len : 1);
		if (!data || !read_full(data, data_len))
			return 2;
		struct psy_ctx ctx;
		if (!read_full(ctx.sender, 32) || !read_full(ctx.co_signer, 32))
			return 2;
		ctx.now = read_u64(&ok);
		ctx.seed = read_u64(&ok);
		if (!ok)
			return 2;
		uint64_t code = psy_process(acct, acct_len, data, data_len, &ctx);
		write_u64(code);
		write_u64(ctx.ix_kind);
		write_u64(acct_len);
		fwrite(acct, 1, acct_len, stdout);
		fflush(stdout);
		free(acct);
		free(data);
	}
}
