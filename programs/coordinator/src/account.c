/*
 * The checks of a stored account (account.go's DecodeAccount): its
 * discriminator, version, enum values, lengths and zero padding.
 */
#include "core.h"

uint64_t check_account(const struct psy_account *s)
{
	if (le64(s->discriminator) != ACCOUNT_DISCRIMINATOR)
		return ERR_WRONG_DISCRIMINATOR;
	if (s->version != PSY_ACCOUNT_VERSION)
		return ERR_WRONG_VERSION;
	if (s->reserved != 0 || s->run_state >= ST_COUNT || s->pending_pause > 1)
		return ERR_MALFORMED;
	for (int i = 0; i < 6; i++)
		if (s->pad0[i] | s->pad1[i])
			return ERR_MALFORMED;
	const struct psy_model *m = &s->model;
	if (s->config.pad | m->pad0 | m->pad2[0] | m->pad2[1] | m->pad2[2] | (m->quantize_1bit > 1) |
	    m->pad4[0] | m->pad4[1] | m->pad4[2] | (m->tied_head > 1))
		return ERR_MALFORMED;
	for (int i = 0; i < 7; i++)
		if (m->pad1[i])
			return ERR_MALFORMED;
	const struct psy_epoch *e = &s->epoch;
	if (e->clients_len > PSY_MAX_CLIENTS || e->exited_len > PSY_MAX_EXITED || s->pending_len > PSY_MAX_CLIENTS ||
	    e->current_round >= PSY_NUM_ROUNDS || e->first_round > 1 || e->cold_start > 1 || e->checkpointed > 1)
		return ERR_MALFORMED;
	for (int i = 0; i < PSY_NUM_ROUNDS; i++) {
		const struct psy_round *r = &e->rounds[i];
		if (r->witnesses_len > PSY_MAX_WITNESSES || r->clients_len > PSY_MAX_CLIENTS || r->pad)
			return ERR_MALFORMED;
		for (int j = 0; j < PSY_MAX_WITNESSES; j++) {
			const struct psy_proof *p = &r->witnesses[j].proof;
			if (p->is_witness > 1 || p->pad[0] | p->pad[1] | p->pad[2])
				return ERR_MALFORMED;
		}
	}
	for (int i = 0; i < PSY_MAX_CLIENTS + PSY_MAX_EXITED; i++) {
		const struct psy_client *c = i < PSY_MAX_CLIENTS ? &e->clients[i] : &e->exited[i - PSY_MAX_CLIENTS];
		if (c->state >= CL_COUNT || c->pad[0] | c->pad[1] | c->pad[2])
			return ERR_MALFORMED;
	}
	return 0;
}
