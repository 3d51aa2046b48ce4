/*
 * A round's batch size, the previous round, and the client lookups
 * (data.go and config.go's BatchSize).
 */
#include "core.h"

static uint16_t batch_size(const struct psy_config *k, uint32_t max_seq_len, uint64_t data_index)
{
	uint64_t start = k->global_batch_size_start, end = k->global_batch_size_end;
	if (end <= start || k->global_batch_size_warmup_tokens == 0)
		return k->global_batch_size_end;
	/* bits.Mul64's high word, from two 32×32 products (a 128-bit multiply
	 * would be a libcall, which SBPF does not have). */
	uint64_t lo = (data_index & 0xffffffffULL) * max_seq_len;
	uint64_t hi = (data_index >> 32) * max_seq_len + (lo >> 32);
	if (hi >> 32)
		return k->global_batch_size_end;
	uint64_t tokens = data_index * max_seq_len;
	if (tokens >= k->global_batch_size_warmup_tokens)
		return k->global_batch_size_end;
	return (uint16_t)(start + (end - start) * tokens / k->global_batch_size_warmup_tokens);
}

uint16_t round_batch_size(const struct psy_account *s, const struct psy_round *r)
{
	return batch_size(&s->config, s->model.max_seq_len, r->data_index);
}

struct psy_round *previous_round(struct psy_account *s)
{
	if (s->epoch.first_round)
		return 0;
	if (cur_round(s)->height == 0)
		return 0;
	return &s->epoch.rounds[(s->epoch.current_round + PSY_NUM_ROUNDS - 1) % PSY_NUM_ROUNDS];
}

/* ClientIndex: returns the index, or -1. */
int64_t client_index(const struct psy_account *s, const uint8_t *signer)
{
	for (uint16_t i = 0; i < s->epoch.clients_len; i++)
		if (eq32(s->epoch.clients[i].id.signer, signer))
			return i;
	return -1;
}

int64_t pending_index(const struct psy_account *s, const uint8_t *signer)
{
	for (uint16_t i = 0; i < s->pending_len; i++)
		if (eq32(s->pending[i].signer, signer))
			return i;
	return -1;
}

/* SittingOut: a health check dropped signer in this epoch (or, between
 * epochs, in the one that just ended). */
int sitting_out(const struct psy_account *s, const uint8_t *signer)
{
	const struct psy_epoch *e = &s->epoch;
	for (uint16_t i = 0; i < e->clients_len; i++)
		if (e->clients[i].state == CL_DROPPED && eq32(e->clients[i].id.signer, signer))
			return 1;
	for (uint16_t i = 0; i < e->exited_len; i++)
		if (e->exited[i].state == CL_DROPPED && eq32(e->exited[i].id.signer, signer))
			return 1;
	return 0;
}

uint16_t healthy_clients(const struct psy_account *s)
{
	uint16_t n = 0;
	for (uint16_t i = 0; i < s->epoch.clients_len; i++)
		if (s->epoch.clients[i].state == CL_HEALTHY)
			n++;
	return n;
}
