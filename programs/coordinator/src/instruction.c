/*
 * The instructions (instruction.go and machine.go's handlers) and
 * psy_process, which decodes one, checks the account and applies it.
 */
#include "core.h"

static int halted(uint8_t st) { return st == ST_UNINITIALIZED || st == ST_FINISHED || st == ST_PAUSED; }

/* do_init: the main authority must sign its own run's creation (the checks in
 * the order of initCoordinator in coordinator/machine.go). */
static uint64_t do_init(struct psy_account *s, int fresh, const struct psy_ctx *ctx, const struct psy_ix *ix)
{
	if (!fresh && !zero32(s->main_authority))
		return ERR_ALREADY_INITIALIZED;
	if (!valid_run_id(ix->u.init.run_id))
		return ERR_INVALID_RUN_ID;
	if (zero32(ix->u.init.main_authority))
		return ERR_INVALID_AUTHORITY;
	if (!eq32(ctx->sender, ix->u.init.main_authority))
		return ERR_UNAUTHORIZED;
	clear(s, sizeof *s);
	*(psy_word *)s->discriminator = ACCOUNT_DISCRIMINATOR;
	s->version = PSY_ACCOUNT_VERSION;
	copy(s->run_id, ix->u.init.run_id, 32);
	copy(s->main_authority, ix->u.init.main_authority, 32);
	copy(s->join_authority, ix->u.init.join_authority, 32);
	return 0;
}

static uint64_t do_update(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_ix *ix)
{
	if (!eq32(ctx->sender, s->main_authority))
		return ERR_UNAUTHORIZED;
	if (s->run_state == ST_FINISHED)
		return ERR_FINISHED;
	if ((ix->u.update.has_config || ix->u.update.has_model || ix->u.update.has_progress) && !halted(s->run_state))
		return ERR_NOT_HALTED;
	if (ix->u.update.has_config && !config_valid(&ix->u.update.config))
		return ERR_INVALID_CONFIG;
	if (ix->u.update.has_model && !model_valid(&ix->u.update.model))
		return ERR_INVALID_MODEL;
	if (ix->u.update.has_metadata)
		copy(&s->metadata, &ix->u.update.metadata, sizeof s->metadata);
	if (ix->u.update.has_config)
		copy(&s->config, &ix->u.update.config, sizeof s->config);
	if (ix->u.update.has_model)
		copy(&s->model, &ix->u.update.model, sizeof s->model);
	if (ix->u.update.has_progress)
		copy(&s->progress, &ix->u.update.progress, sizeof s->progress);
	return 0;
}

static uint64_t do_set_paused(struct psy_account *s, const struct psy_ctx *ctx, uint8_t paused)
{
	if (!eq32(ctx->sender, s->main_authority))
		return ERR_UNAUTHORIZED;
	if (s->run_state == ST_FINISHED)
		return ERR_FINISHED;
	if (paused) {
		switch (s->run_state) {
		case ST_ROUND_TRAIN:
		case ST_ROUND_WITNESS:
		case ST_COOLDOWN:
			if (s->pending_pause)
				return ERR_ALREADY_PAUSED;
			s->pending_pause = 1;
			return 0;
		case ST_WAITING_FOR_MEMBERS:
		case ST_WARMUP:
			withdraw_all(s);
			s->epoch.cold_start = 1;
			set_state(s, ST_PAUSED, ctx->now);
			return 0;
		default:
			return ERR_ALREADY_PAUSED;
		}
	}
	if (s->run_state == ST_PAUSED || s->run_state == ST_UNINITIALIZED) {
		if (!config_valid(&s->config))
			return ERR_INVALID_CONFIG;
		if (!model_valid(&s->model))
			return ERR_INVALID_MODEL;
		uint32_t step = s->progress.step;
		if (step == 0)
			step = 1;
		if (step >= s->config.total_steps)
			return ERR_INVALID_PROGRESS;
		s->progress.step = step;
		set_state(s, ST_WAITING_FOR_MEMBERS, ctx->now);
		return 0;
	}
	if (s->pending_pause) {
		s->pending_pause = 0;
		return 0;
	}
	return ERR_NOT_PAUSED;
}

static uint64_t do_join(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_client_id *id)
{
	if (s->run_state == ST_FINISHED)
		return ERR_FINISHED;
	if (s->run_state == ST_UNINITIALIZED)
		return ERR_WRONG_STATE;
	if (zero32(id->signer) || zero32(id->p2p))
		return ERR_INVALID_CLIENT_ID;
	if (!eq32(id->signer, ctx->sender))
		return ERR_SIGNER_MISMATCH;
	if (!zero32(s->join_authority) && !eq32(ctx->co_signer, s->join_authority) &&
	    !eq32(ctx->sender, s->join_authority))
		return ERR_JOIN_NOT_AUTHORIZED;
	int64_t existing = pending_index(s, id->signer);
	for (uint16_t i = 0; i < s->pending_len; i++)
		if (eq32(s->pending[i].p2p, id->p2p) && !eq32(s->pending[i].signer, id->signer))
			return ERR_DUPLICATE_P2P_IDENTITY;
	if (existing >= 0) {
		copy(s->pending[existing].p2p, id->p2p, 32);
		return 0;
	}
	if (s->pending_len >= PSY_MAX_CLIENTS || s->pending_len >= s->config.global_batch_size_end)
		return ERR_PENDING_FULL;
	copy(&s->pending[s->pending_len], id, sizeof *id);
	s->pending_len++;
	return 0;
}

static uint64_t verify_proof(struct psy_account *s, const struct psy_round *r, const uint8_t *sender,
			     const struct psy_proof *p)
{
	if (p->index >= r->clients_len || p->index >= s->epoch.clients_len)
		return ERR_INVALID_PROOF;
	const struct psy_client *c = &s->epoch.clients[p->index];
	if (!eq32(c->id.signer, sender))
		return ERR_INVALID_PROOF;
	if (c->state != CL_HEALTHY)
		return ERR_CLIENT_NOT_HEALTHY;
	uint16_t pos = witness_position(r, p->index);
	uint8_t is_witness = pos < witness_count(&s->config, r->clients_len);
	if (p->position != pos || p->is_witness != is_witness)
		return ERR_INVALID_PROOF;
	if (!p->is_witness)
		return ERR_NOT_A_WITNESS;
	for (int i = 0; i < r->witnesses_len; i++)
		if (r->witnesses[i].proof.index == p->index)
			return ERR_DUPLICATE_WITNESS;
	if (r->witnesses_len >= PSY_MAX_WITNESSES)
		return ERR_WITNESSES_FULL;
	return 0;
}

static uint64_t do_warmup_witness(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_witness *w)
{
	if (s->run_state != ST_WARMUP)
		return ERR_WRONG_STATE;
	struct psy_round *r = cur_round(s);
	uint64_t err = verify_proof(s, r, ctx->sender, &w->proof);
	if (err)
		return err;
	copy(&r->witnesses[r->witnesses_len], w, sizeof *w);
	r->witnesses_len++;
	tick_warmup(s, ctx->now, ctx->seed);
	return 0;
}

static uint64_t do_witness(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_witness *w)
{
	if (s->run_state != ST_ROUND_TRAIN && s->run_state != ST_ROUND_WITNESS)
		return ERR_WRONG_STATE;
	struct psy_round *r = cur_round(s);
	uint64_t err = verify_proof(s, r, ctx->sender, &w->proof);
	if (err)
		return err;
	if (w->step != s->progress.step)
		return ERR_WRONG_STEP;
	copy(&r->witnesses[r->witnesses_len], w, sizeof *w);
	r->witnesses_len++;
	if (s->run_state == ST_ROUND_TRAIN && witnesses_in(s, r))
		set_state(s, ST_ROUND_WITNESS, ctx->now);
	return 0;
}

static uint64_t do_health_check(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_client_id *id,
				const struct psy_proof *p)
{
	if (s->run_state != ST_ROUND_TRAIN && s->run_state != ST_ROUND_WITNESS)
		return ERR_WRONG_STATE;
	int64_t si = client_index(s, ctx->sender);
	if (si < 0 || s->epoch.clients[si].state != CL_HEALTHY)
		return ERR_NOT_A_CLIENT;
	struct psy_round *prev = previous_round(s);
	if (!prev)
		return ERR_NO_PREVIOUS_ROUND;
	struct psy_round *r = cur_round(s);
	if (p->index >= r->clients_len || p->index >= s->epoch.clients_len)
		return ERR_INVALID_PROOF;
	struct psy_client *target = &s->epoch.clients[p->index];
	if (!eq32(target->id.signer, id->signer) || !eq32(target->id.p2p, id->p2p))
		return ERR_INVALID_PROOF;
	uint16_t cpos = committee_position(r, p->index);
	uint8_t is_witness = witness_position(r, p->index) < witness_count(&s->config, r->clients_len);
	if (p->position != cpos || p->is_witness != is_witness)
		return ERR_INVALID_PROOF;
	if (target->state != CL_HEALTHY)
		return ERR_CLIENT_NOT_HEALTHY;
	if (health_score(prev, id->signer) >= quorum(witness_count(&s->config, prev->clients_len)))
		return ERR_CLIENT_HEALTHY;
	target->state = CL_DROPPED;
	target->exited_height = r->height;
	return 0;
}

static uint64_t do_checkpoint(struct psy_account *s, const struct psy_ctx *ctx, const struct psy_checkpoint_source *src)
{
	if (s->run_state != ST_COOLDOWN)
		return ERR_WRONG_STATE;
	if (s->epoch.checkpointed)
		return ERR_ALREADY_CHECKPOINTED;
	if (src->url[0] == 0 || !canonical(src->url, 128) || !canonical(src->revision, 32))
		return ERR_INVALID_CHECKPOINT;
	if (!eq32(ctx->sender, s->main_authority)) {
		int64_t i = client_index(s, ctx->sender);
		if (i < 0 || s->epoch.clients[i].state != CL_HEALTHY)
			return ERR_NOT_A_CLIENT;
		if (!is_checkpointer(s, (uint16_t)i))
			return ERR_NOT_CHECKPOINTER;
	}
	s->model.checkpoint_kind = CK_HUB;
	copy(&s->model.checkpoint, src, sizeof *src);
	s->epoch.checkpointed = 1;
	return 0;
}

static uint64_t do_free(const struct psy_account *s, const struct psy_ctx *ctx)
{
	if (!eq32(ctx->sender, s->main_authority))
		return ERR_UNAUTHORIZED;
	if (!halted(s->run_state))
		return ERR_NOT_HALTED;
	return 0;
}

uint64_t psy_process(uint8_t *acct, uint64_t acct_len, const uint8_t *data, uint64_t data_len, struct psy_ctx *ctx)
{
	uint64_t kind;
	struct psy_ix ix;
	uint64_t derr = decode_instruction(data, data_len, &kind, &ix);
	ctx->ix_kind = kind;
	if (derr)
		return derr;

	if (acct_len != sizeof(struct psy_account))
		return ERR_WRONG_SIZE;
	if ((uint64_t)acct & 7)
		return ERR_MALFORMED;
	struct psy_account *s = (struct psy_account *)acct;
	int fresh = kind == IX_INIT_COORDINATOR && le64(s->discriminator) == 0;
	if (!fresh) {
		uint64_t err = check_account(s);
		if (err)
			return err;
	}

	uint64_t err = 0;
	int changed = 1;
	switch (kind) {
	case IX_INIT_COORDINATOR:
		err = do_init(s, fresh, ctx, &ix);
		break;
	case IX_UPDATE:
		err = do_update(s, ctx, &ix);
		break;
	case IX_SET_PAUSED:
		err = do_set_paused(s, ctx, ix.u.paused);
		break;
	case IX_JOIN_RUN:
		err = do_join(s, ctx, &ix.u.join);
		break;
	case IX_TICK:
		return tick(s, ctx->now, ctx->seed, &changed);
	case IX_WARMUP_WITNESS:
		err = do_warmup_witness(s, ctx, &ix.u.witness);
		break;
	case IX_WITNESS:
		err = do_witness(s, ctx, &ix.u.witness);
		break;
	case IX_HEALTH_CHECK:
		err = do_health_check(s, ctx, &ix.u.health.id, &ix.u.health.proof);
		break;
	case IX_CHECKPOINT:
		err = do_checkpoint(s, ctx, &ix.u.checkpoint);
		break;
	case IX_FREE_COORDINATOR:
		err = do_free(s, ctx);
		changed = 0;
		break;
	}
	if (err)
		return err;
	if (changed)
		s->nonce++;
	return 0;
}
