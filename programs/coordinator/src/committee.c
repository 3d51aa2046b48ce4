/*
 * Committees (committee.go): how many witnesses a round has, their quorum,
 * each client's witness and committee positions, the checkpointers and the
 * health score a client's witnesses give it.
 */
#include "core.h"

uint16_t witness_count(const struct psy_config *k, uint16_t clients_len)
{
	uint16_t w = k->witness_nodes;
	if (w == 0)
		w = PSY_MAX_WITNESSES;
	return min16(min16(w, clients_len), PSY_MAX_WITNESSES);
}

uint16_t quorum(uint16_t w)
{
	if (w <= 1)
		return 1;
	if (w <= 3)
		return 2;
	uint16_t q = (uint16_t)(2 * w / 3);
	return q < 1 ? 1 : q;
}

uint16_t witness_position(const struct psy_round *r, uint16_t index)
{
	uint8_t key[32];
	psy_shuffle_key(r->random_seed, "witness", 7, key);
	return (uint16_t)psy_swap_or_not(index, r->clients_len, key);
}

/* Whether every elected witness of r that can still report has: one that is
 * no longer healthy (dropped by a health check) cannot, so the round does
 * not wait for it (the Go coordinator's witnessesIn). */
int witnesses_in(const struct psy_account *s, const struct psy_round *r)
{
	uint16_t want = witness_count(&s->config, r->clients_len);
	uint16_t got = r->witnesses_len;
	uint16_t n = min16(r->clients_len, s->epoch.clients_len);
	for (uint16_t i = 0; i < n && got < want; i++) {
		if (s->epoch.clients[i].state == CL_HEALTHY || witness_position(r, i) >= want)
			continue;
		int reported = 0;
		for (uint8_t j = 0; j < r->witnesses_len; j++)
			reported = reported || r->witnesses[j].proof.index == i;
		if (!reported)
			got++;
	}
	return got >= want;
}

uint16_t committee_position(const struct psy_round *r, uint16_t index)
{
	uint8_t key[32];
	psy_shuffle_key(r->random_seed, "committee", 9, key);
	return (uint16_t)psy_swap_or_not(index, r->clients_len, key);
}

int is_checkpointer(struct psy_account *s, uint16_t index)
{
	uint16_t n = s->epoch.clients_len;
	if (index >= n)
		return 0;
	uint8_t key[32];
	psy_shuffle_key(cur_round(s)->random_seed, "checkpoint", 10, key);
	return psy_swap_or_not(index, n, key) < (uint64_t)((n + 2) / 3);
}

uint16_t health_score(const struct psy_round *r, const uint8_t *signer)
{
	uint8_t member[32];
	psy_sha256_2(signer, 32, 0, 0, member);
	uint16_t score = 0;
	for (int i = 0; i < r->witnesses_len; i++) {
		const struct psy_witness *w = &r->witnesses[i];
		if (psy_bloom_has(w->participants, w->key, member))
			score++;
	}
	return score;
}
