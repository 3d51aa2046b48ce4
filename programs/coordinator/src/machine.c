/*
 * The run's transitions (machine.go): warmup, rounds, witnessing,
 * cooldown, epochs, and tick, which advances the run when something is due.
 */
#include "core.h"

static int timed_out(const struct psy_account *s, uint64_t now, uint64_t d)
{
	return now > s->run_state_start && now - s->run_state_start >= d;
}

void set_state(struct psy_account *s, uint8_t st, uint64_t now)
{
	s->run_state = st;
	s->run_state_start = now;
}

void withdraw_all(struct psy_account *s)
{
	struct psy_epoch *e = &s->epoch;
	uint32_t h = cur_round(s)->height;
	for (uint16_t i = 0; i < e->clients_len; i++)
		if (e->clients[i].state == CL_HEALTHY) {
			e->clients[i].state = CL_WITHDRAWN;
			e->clients[i].exited_height = h;
		}
}

static void exit_unhealthy(struct psy_account *s)
{
	struct psy_epoch *e = &s->epoch;
	uint16_t kept = 0;
	for (uint16_t i = 0; i < e->clients_len; i++) {
		struct psy_client *c = &e->clients[i];
		if (c->state == CL_HEALTHY) {
			copy(&e->clients[kept], c, sizeof *c);
			kept++;
			continue;
		}
		if (e->exited_len < PSY_MAX_EXITED) {
			copy(&e->exited[e->exited_len], c, sizeof *c);
			e->exited_len++;
		}
	}
	clear(&e->clients[kept], (uint64_t)(e->clients_len - kept) * sizeof(struct psy_client));
	e->clients_len = kept;
}

/* Whether any of the epoch's clients is pending again. A 4096-bit filter of
 * the pending signers' first words keeps this linear instead of 256×256. */
static int previous_holder_pending(const struct psy_account *s)
{
	uint64_t seen[64];
	clear(seen, sizeof seen);
	for (uint16_t i = 0; i < s->pending_len; i++) {
		uint64_t h = *(const psy_word *)s->pending[i].signer % 4096;
		seen[h / 64] |= 1ULL << (h % 64);
	}
	for (uint16_t i = 0; i < s->epoch.clients_len; i++) {
		const uint8_t *signer = s->epoch.clients[i].id.signer;
		uint64_t h = *(const psy_word *)signer % 4096;
		if (((seen[h / 64] >> (h % 64)) & 1) && pending_index(s, signer) >= 0)
			return 1;
	}
	return 0;
}

/* Which pending joiners the epoch about to start admits (admitted in
 * machine.go): every one but those a health check dropped in the epoch that
 * ends, unless fewer than min_clients would be left without them. A 4096-bit
 * filter of the dropped signers' first words keeps this linear when none of
 * them joined again. */
static void admitted(const struct psy_account *s, uint8_t *keep)
{
	const struct psy_epoch *e = &s->epoch;
	uint64_t seen[64];
	clear(seen, sizeof seen);
	for (uint16_t i = 0; i < e->clients_len + e->exited_len; i++) {
		const struct psy_client *c = i < e->clients_len ? &e->clients[i] : &e->exited[i - e->clients_len];
		if (c->state != CL_DROPPED)
			continue;
		uint64_t h = *(const psy_word *)c->id.signer % 4096;
		seen[h / 64] |= 1ULL << (h % 64);
	}
	uint16_t kept = 0;
	for (uint16_t i = 0; i < s->pending_len; i++) {
		const uint8_t *signer = s->pending[i].signer;
		uint64_t h = *(const psy_word *)signer % 4096;
		keep[i] = !(((seen[h / 64] >> (h % 64)) & 1) && sitting_out(s, signer));
		kept += keep[i];
	}
	if (kept < s->pending_len && kept < s->config.min_clients)
		for (uint16_t i = 0; i < s->pending_len; i++)
			keep[i] = 1;
}

static void start_warmup(struct psy_account *s, uint64_t now, uint64_t seed)
{
	struct psy_epoch *e = &s->epoch;
	if (s->model.checkpoint_kind == CK_P2P && !previous_holder_pending(s))
		s->model.checkpoint_kind = CK_HUB;
	uint8_t keep[PSY_MAX_CLIENTS];
	admitted(s, keep); /* before the exited list, which says who sits out, starts afresh */
	uint16_t prev = e->clients_len;
	copy(e->exited, e->clients, (uint64_t)prev * sizeof(struct psy_client));
	if (e->exited_len > prev)
		clear(&e->exited[prev], (uint64_t)(e->exited_len - prev) * sizeof(struct psy_client));
	e->exited_len = prev;
	clear(e->rounds, sizeof e->rounds);
	uint16_t n = 0;
	for (uint16_t i = 0; i < s->pending_len; i++) {
		if (!keep[i])
			continue;
		clear(&e->clients[n], sizeof(struct psy_client));
		copy(&e->clients[n].id, &s->pending[i], sizeof(struct psy_client_id));
		n++;
	}
	if (prev > n)
		clear(&e->clients[n], (uint64_t)(prev - n) * sizeof(struct psy_client));
	e->clients_len = n;
	clear(s->pending, (uint64_t)s->pending_len * sizeof(struct psy_client_id));
	s->pending_len = 0;
	e->start_timestamp = now;
	e->start_step = s->progress.step;
	e->last_step = 0;
	e->current_round = 0;
	e->first_round = 1;
	e->checkpointed = 0;
	e->rounds[0].data_index = s->progress.epoch_start_data_index;
	e->rounds[0].random_seed = seed;
	e->rounds[0].clients_len = n;
	/* The first training round's seed: le64(shuffle_key(seed, "first-round")[0:8]). */
	uint8_t key[32];
	psy_shuffle_key(seed, "first-round", 11, key);
	s->next_round_seed = le64(key);
	set_state(s, ST_WARMUP, now);
}

static void start_round_train(struct psy_account *s, uint64_t now, uint64_t seed)
{
	struct psy_epoch *e = &s->epoch;
	exit_unhealthy(s);
	uint8_t slot = 0;
	uint32_t height = 0;
	uint64_t data_index = s->progress.epoch_start_data_index;
	if (!e->first_round) {
		struct psy_round *prev = cur_round(s);
		slot = (uint8_t)((e->current_round + 1) % PSY_NUM_ROUNDS);
		height = prev->height + 1;
		data_index = prev->data_index + (uint64_t)round_batch_size(s, prev);
	}
	struct psy_round *r = &e->rounds[slot];
	clear(r, sizeof *r);
	r->data_index = data_index;
	/* The seed drawn when the previous round began; this one's draw is the
	 * next round's, so a round's data assignment is known a round early. */
	r->random_seed = s->next_round_seed;
	s->next_round_seed = seed;
	r->height = height;
	r->clients_len = e->clients_len;
	e->current_round = slot;
	set_state(s, ST_ROUND_TRAIN, now);
}

int tick_warmup(struct psy_account *s, uint64_t now, uint64_t seed)
{
	if (healthy_clients(s) < s->config.min_clients) {
		withdraw_all(s);
		if (s->progress.step >= s->config.total_steps)
			set_state(s, ST_FINISHED, now);
		else
			set_state(s, ST_WAITING_FOR_MEMBERS, now);
		return 1;
	}
	struct psy_round *r = cur_round(s);
	if (timed_out(s, now, s->config.warmup_time) || r->witnesses_len >= witness_count(&s->config, r->clients_len)) {
		start_round_train(s, now, seed);
		return 1;
	}
	return 0;
}

static void end_round(struct psy_account *s, uint64_t now, uint64_t seed)
{
	struct psy_epoch *e = &s->epoch;
	e->first_round = 0;
	s->progress.step++;
	exit_unhealthy(s);
	struct psy_round *r = cur_round(s);
	if (r->witnesses_len == 0) {
		withdraw_all(s);
		set_state(s, ST_COOLDOWN, now);
		return;
	}
	if (e->last_step == 0 && now >= e->start_timestamp && now - e->start_timestamp >= s->config.epoch_time)
		e->last_step = s->progress.step + 2;
	if (s->progress.step == e->last_step || e->clients_len < s->config.min_clients ||
	    r->witnesses_len < quorum(witness_count(&s->config, r->clients_len)) ||
	    s->progress.step >= s->config.total_steps || s->pending_pause) {
		set_state(s, ST_COOLDOWN, now);
		return;
	}
	start_round_train(s, now, seed);
}

static void end_epoch(struct psy_account *s, uint64_t now)
{
	struct psy_round *r = cur_round(s);
	s->progress.epoch_start_data_index = r->data_index + (uint64_t)round_batch_size(s, r);
	s->progress.epoch++;
	if (s->model.checkpoint_kind == CK_HUB)
		s->model.checkpoint_kind = CK_P2P;
	if (s->progress.step >= s->config.total_steps) {
		s->pending_pause = 0;
		set_state(s, ST_FINISHED, now);
	} else if (s->pending_pause) {
		s->pending_pause = 0;
		s->epoch.cold_start = 1;
		set_state(s, ST_PAUSED, now);
	} else {
		set_state(s, ST_WAITING_FOR_MEMBERS, now);
	}
}

/* Tick: advances the run and bumps the nonce, or returns ERR_NOTHING_DUE and
 * changes nothing (see Tick in coordinator/machine.go for why a tick with
 * nothing due is refused rather than a successful no-op). */
uint64_t tick(struct psy_account *s, uint64_t now, uint64_t seed, int *changed)
{
	int ch = 0;
	struct psy_round *r;
	switch (s->run_state) {
	case ST_UNINITIALIZED:
	case ST_PAUSED:
	case ST_FINISHED:
		return ERR_HALTED;
	case ST_WAITING_FOR_MEMBERS:
		if (s->pending_len >= s->config.init_min_clients &&
		    timed_out(s, now, s->config.waiting_for_members_extra_time)) {
			start_warmup(s, now, seed);
			ch = 1;
		}
		break;
	case ST_WARMUP:
		ch = tick_warmup(s, now, seed);
		break;
	case ST_ROUND_TRAIN:
		r = cur_round(s);
		if (timed_out(s, now, s->config.max_round_train_time) || witnesses_in(s, r)) {
			set_state(s, ST_ROUND_WITNESS, now);
			ch = 1;
		}
		break;
	case ST_ROUND_WITNESS:
		/* The witness window is slack for late witnesses: with every
		 * witness in the round ends at this tick (see Tick and endRound
		 * in coordinator/machine.go for why the seed stays safe). */
		if (timed_out(s, now, s->config.round_witness_time) || witnesses_in(s, cur_round(s))) {
			end_round(s, now, seed);
			ch = 1;
		}
		break;
	case ST_COOLDOWN:
		if (timed_out(s, now, s->config.cooldown_time) || s->epoch.checkpointed) {
			end_epoch(s, now);
			ch = 1;
		}
		break;
	}
	*changed = ch;
	if (!ch)
		return ERR_NOTHING_DUE;
	s->nonce++;
	return 0;
}
