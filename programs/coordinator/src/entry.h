/*
 * The SBPF driver's view of a transaction (input.c parses it, entrypoint.c
 * checks it and calls the core).
 */
#ifndef PSYCHE_ENTRY_H
#define PSYCHE_ENTRY_H

#include "psyche.h"

#define PSY_MAX_ACCOUNTS 8

struct psy_account_view {
	const uint8_t *key;
	uint8_t *owner;
	uint64_t *lamports;
	uint64_t *data_len_ptr;
	uint8_t *data;
	uint64_t data_len;
	uint64_t rent_epoch;
	uint8_t is_signer;
	uint8_t is_writable;
	uint8_t executable;
};

struct psy_input {
	uint64_t num_accounts;
	struct psy_account_view accounts[PSY_MAX_ACCOUNTS];
	const uint8_t *data;
	uint64_t data_len;
	const uint8_t *program_id;
};

/* psy_parse_input reads the loader's serialized input without reading past
 * in_len. It returns 0 or ERR_TRUNCATED / ERR_MALFORMED. */
uint64_t psy_parse_input(uint8_t *in, uint64_t in_len, struct psy_input *out);

#endif
