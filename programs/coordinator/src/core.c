/*
 * The coordinator state machine: a line-by-line port of the Go package
 * coordinator (machine.go, committee.go, data.go, config.go, codec.go,
 * instruction.go). psy_process decodes one instruction, checks the account and
 * applies the instruction with the given context (sender, co-signer, now,
 * seed). It validates everything before it writes, so a rejected instruction
 * leaves the account as it was, like the Go Apply.
 *
 * The same file is compiled for SBPF (entrypoint.c derives the context from
 * the transaction and the sysvars) and for the host test harness
 * (host/harness.c), which runs it beside the Go coordinator.
 */
#include "psyche.h"

/* sha256("account:CoordinatorAccount")[0:8] and sha256("global:<name>")[0:8],
 * little-endian, in IX_* order. */
#define ACCOUNT_DISCRIMINATOR 0x2b569b2c37b121efULL
static const uint64_t ix_discriminators[IX_COUNT] = {
	0x197a85e849943914ULL, /* init_coordinator */
	0x7ffd3f9eb058c8dbULL, /* update */
	0xdaa6e1b0c07d3c5bULL, /* set_paused */
	0x4bf6866a667da048ULL, /* join_run */
	0x0f3f5065082c4f5cULL, /* tick */
	0x5e37163fe87ae8d3ULL, /* warmup_witness */
	0x2715df8e1995f4d5ULL, /* witness */
	0x839d128aa8635a73ULL, /* health_check */
	0xfcb88ff0cc13c8d5ULL, /* checkpoint */
	0x204af2dfe5d7d859ULL, /* free_coordinator */
};

/* ---- small helpers ---- */

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* Keys are 32 bytes at 8-aligned addresses (account fields, the decoded
 * instruction and the context all are). */
static int eq32(const uint8_t *a, const uint8_t *b)
{
	const psy_word *x = (const psy_word *)a, *y = (const psy_word *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static int zero32(const uint8_t *a)
{
	const psy_word *x = (const psy_word *)a;
	return (x[0] | x[1] | x[2] | x[3]) == 0;
}

static void copy(void *dst, const void *src, uint64_t n)
{
	if (n && dst != src)
		sol_memcpy_(dst, src, n);
}

static void clear(void *dst, uint64_t n)
{
	if (n)
		sol_memset_(dst, 0, n);
}

/* canonicalFixed: text followed only by zeros. */
static int canonical(const uint8_t *b, uint64_t n)
{
	uint64_t i = 0;
	while (i < n && b[i] != 0)
		i++;
	for (; i < n; i++)
		if (b[i] != 0)
			return 0;
	return 1;
}

static int valid_run_id(const uint8_t *id)
{
	if (!canonical(id, 32) || id[0] == 0)
		return 0;
	for (int i = 0; i < 32 && id[i]; i++) {
		uint8_t c = id[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
			 c == '-';
		if (!ok)
			return 0;
	}
	return 1;
}

/* f32 rules on bit patterns (config.go). */
static int finite32(uint32_t v) { return (v & 0x7f800000) != 0x7f800000; }
static int nonneg32(uint32_t v) { return finite32(v) && ((v >> 31) == 0 || v == 0x80000000); }
static int positive32(uint32_t v) { return nonneg32(v) && (v & 0x7fffffff) != 0; }
static int unit32(uint32_t v) { return nonneg32(v) && (v & 0x7fffffff) < 0x3f800000; }

static uint16_t min16(uint16_t a, uint16_t b) { return a < b ? a : b; }

/* ---- instruction decoding (codec.go's cursor) ---- */

struct rd {
	const uint8_t *p;
	uint64_t len;
	uint64_t off;
	uint64_t err;
};

static const uint8_t *take(struct rd *r, uint64_t n)
{
	if (r->err)
		return 0;
	if (n > r->len - r->off) {
		r->err = ERR_TRUNCATED;
		return 0;
	}
	const uint8_t *b = r->p + r->off;
	r->off += n;
	return b;
}

static void rd_bytes(struct rd *r, void *dst, uint64_t n)
{
	const uint8_t *b = take(r, n);
	if (!b)
		return;
	if (n > 8) {
		copy(dst, b, n);
		return;
	}
	uint8_t *o = dst;
	for (uint64_t i = 0; i < n; i++)
		o[i] = b[i];
}

static void rd_u8(struct rd *r, uint8_t *v) { rd_bytes(r, v, 1); }
static void rd_u16(struct rd *r, uint16_t *v) { rd_bytes(r, v, 2); }
static void rd_u32(struct rd *r, uint32_t *v) { rd_bytes(r, v, 4); }
static void rd_u64(struct rd *r, uint64_t *v) { rd_bytes(r, v, 8); }

static void rd_bool(struct rd *r, uint8_t *v)
{
	const uint8_t *b = take(r, 1);
	if (!b)
		return;
	if (b[0] > 1) {
		r->err = ERR_MALFORMED;
		return;
	}
	*v = b[0];
}

static void rd_pad(struct rd *r, uint64_t n)
{
	const uint8_t *b = take(r, n);
	if (!b)
		return;
	for (uint64_t i = 0; i < n; i++)
		if (b[i]) {
			r->err = ERR_MALFORMED;
			return;
		}
}

/* option tag: returns 1 when the value follows. */
static int rd_option(struct rd *r)
{
	uint8_t tag = 0;
	rd_u8(r, &tag);
	if (r->err)
		return 0;
	if (tag > 1) {
		r->err = ERR_MALFORMED;
		return 0;
	}
	return tag;
}

static void rd_client_id(struct rd *r, struct psy_client_id *id)
{
	rd_bytes(r, id->signer, 32);
	rd_bytes(r, id->p2p, 32);
}

static void rd_proof(struct rd *r, struct psy_proof *p)
{
	rd_u16(r, &p->position);
	rd_u16(r, &p->index);
	rd_bool(r, &p->is_witness);
	rd_pad(r, 3);
}

static void rd_witness(struct rd *r, struct psy_witness *w)
{
	rd_proof(r, &w->proof);
	rd_u64(r, &w->key);
	rd_bytes(r, w->participants, 8 * PSY_BLOOM_WORDS);
	rd_bytes(r, w->broadcasts, 8 * PSY_BLOOM_WORDS);
	rd_bytes(r, w->merkle, 32);
	rd_u32(r, &w->step);
	rd_u32(r, &w->tokens_per_sec);
	rd_u32(r, &w->bandwidth_per_sec);
	rd_u32(r, &w->loss);
}

static void rd_metadata(struct rd *r, struct psy_metadata *m)
{
	rd_bytes(r, m->name, 64);
	rd_bytes(r, m->description, 128);
	rd_u64(r, &m->num_parameters);
	rd_u64(r, &m->vocab_size);
}

static void rd_config(struct rd *r, struct psy_config *k)
{
	rd_u64(r, &k->warmup_time);
	rd_u64(r, &k->cooldown_time);
	rd_u64(r, &k->max_round_train_time);
	rd_u64(r, &k->round_witness_time);
	rd_u64(r, &k->epoch_time);
	rd_u64(r, &k->waiting_for_members_extra_time);
	rd_u64(r, &k->global_batch_size_warmup_tokens);
	rd_u32(r, &k->total_steps);
	rd_u16(r, &k->global_batch_size_start);
	rd_u16(r, &k->global_batch_size_end);
	rd_u16(r, &k->init_min_clients);
	rd_u16(r, &k->min_clients);
	rd_u16(r, &k->witness_nodes);
	rd_u8(r, &k->verification_percent);
	rd_pad(r, 1);
}

static void rd_source(struct rd *r, struct psy_checkpoint_source *s)
{
	rd_bytes(r, s->url, 128);
	rd_bytes(r, s->revision, 32);
}

static void rd_model(struct rd *r, struct psy_model *m)
{
	rd_u8(r, &m->architecture);
	rd_u8(r, &m->data_kind);
	rd_u8(r, &m->token_size);
	rd_pad(r, 1);
	rd_u32(r, &m->max_seq_len);
	rd_u32(r, &m->vocab_size);
	rd_u32(r, &m->d_model);
	rd_u32(r, &m->n_layers);
	rd_u32(r, &m->n_heads);
	rd_u32(r, &m->n_kv_heads);
	rd_u32(r, &m->intermediate_size);
	rd_u32(r, &m->rope_theta);
	rd_bool(r, &m->tied_head);
	rd_pad(r, 3);
	rd_u8(r, &m->checkpoint_kind);
	rd_pad(r, 7);
	rd_source(r, &m->checkpoint);
	rd_bytes(r, m->data_location, 128);
	rd_u8(r, &m->lr_kind);
	rd_pad(r, 3);
	rd_u32(r, &m->base_lr);
	rd_u32(r, &m->final_lr);
	rd_u32(r, &m->warmup_steps);
	rd_u32(r, &m->decay_steps);
	rd_u32(r, &m->lr_total_steps);
	rd_u8(r, &m->optimizer_kind);
	rd_bool(r, &m->quantize_1bit);
	rd_u16(r, &m->compression_topk);
	rd_u16(r, &m->compression_chunk);
	rd_u8(r, &m->aggregation);
	rd_u8(r, &m->normalization);
	rd_u32(r, &m->clip_grad_norm);
	rd_u32(r, &m->weight_decay);
	rd_u32(r, &m->compression_decay);
	rd_u32(r, &m->beta1);
	rd_u32(r, &m->beta2);
	rd_u32(r, &m->epsilon);
	rd_bytes(r, m->store_url, 64);
	rd_bytes(r, m->store_endpoint, 128);
	rd_bytes(r, m->store_region, 32);
}

static void rd_progress(struct rd *r, struct psy_progress *p)
{
	rd_u32(r, &p->epoch);
	rd_u32(r, &p->step);
	rd_u64(r, &p->epoch_start_data_index);
}

/* A decoded instruction. */
struct psy_ix {
	union {
		struct {
			uint8_t main_authority[32];
			uint8_t join_authority[32];
			uint8_t run_id[32];
		} init;
		struct {
			struct psy_metadata metadata;
			struct psy_config config;
			struct psy_model model;
			struct psy_progress progress;
			uint8_t has_metadata, has_config, has_model, has_progress;
		} update;
		struct psy_client_id join;
		struct psy_witness witness;
		struct {
			struct psy_client_id id;
			struct psy_proof proof;
		} health;
		struct psy_checkpoint_source checkpoint;
		uint8_t paused;
	} u;
};

static void decode_args(struct rd *r, uint64_t kind, struct psy_ix *ix)
{
	switch (kind) {
	case IX_INIT_COORDINATOR:
		rd_bytes(r, ix->u.init.main_authority, 32);
		rd_bytes(r, ix->u.init.join_authority, 32);
		rd_bytes(r, ix->u.init.run_id, 32);
		break;
	case IX_UPDATE:
		if ((ix->u.update.has_metadata = (uint8_t)rd_option(r)))
			rd_metadata(r, &ix->u.update.metadata);
		if ((ix->u.update.has_config = (uint8_t)rd_option(r)))
			rd_config(r, &ix->u.update.config);
		if ((ix->u.update.has_model = (uint8_t)rd_option(r)))
			rd_model(r, &ix->u.update.model);
		if ((ix->u.update.has_progress = (uint8_t)rd_option(r)))
			rd_progress(r, &ix->u.update.progress);
		break;
	case IX_SET_PAUSED:
		rd_bool(r, &ix->u.paused);
		break;
	case IX_JOIN_RUN:
		rd_client_id(r, &ix->u.join);
		break;
	case IX_WARMUP_WITNESS:
	case IX_WITNESS:
		rd_witness(r, &ix->u.witness);
		break;
	case IX_HEALTH_CHECK:
		rd_client_id(r, &ix->u.health.id);
		rd_proof(r, &ix->u.health.proof);
		break;
	case IX_CHECKPOINT:
		rd_source(r, &ix->u.checkpoint);
		break;
	default: /* tick, free_coordinator: no arguments */
		break;
	}
}

/* ---- account checks (account.go: DecodeAccount) ---- */

static uint64_t check_account(const struct psy_account *s)
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

/* ---- config, committee, data (config.go, committee.go, data.go) ---- */

static int config_valid(const struct psy_config *k)
{
	uint16_t wmax = min16(k->min_clients, PSY_MAX_WITNESSES);
	return k->epoch_time > 0 && k->warmup_time < k->epoch_time && k->max_round_train_time > 0 &&
	       k->max_round_train_time < k->epoch_time && k->round_witness_time > 0 && k->cooldown_time > 0 &&
	       k->waiting_for_members_extra_time > 0 && k->min_clients > 0 && k->min_clients <= k->init_min_clients &&
	       k->init_min_clients <= PSY_MAX_CLIENTS && k->global_batch_size_start > 0 &&
	       k->global_batch_size_start <= k->global_batch_size_end &&
	       k->init_min_clients <= k->global_batch_size_end &&
	       k->global_batch_size_warmup_tokens <= PSY_MAX_WARMUP_TOKENS && k->total_steps > 0 &&
	       k->witness_nodes <= wmax && k->verification_percent <= 100;
}

/* fixed_len: the text length of a zero-padded field. */
static uint64_t fixed_len(const uint8_t *b, uint64_t n)
{
	uint64_t i = 0;
	while (i < n && b[i] != 0)
		i++;
	return i;
}

static int has_prefix(const uint8_t *b, uint64_t len, const char *p, uint64_t plen)
{
	if (len < plen)
		return 0;
	for (uint64_t i = 0; i < plen; i++)
		if (b[i] != (uint8_t)p[i])
			return 0;
	return 1;
}

static int visible(uint8_t c) { return c >= 0x21 && c <= 0x7e; }

/* store_valid: CheckpointStore.validate (config.go), rule for rule. */
static int store_valid(const struct psy_model *m)
{
	if (!canonical(m->store_url, 64) || !canonical(m->store_endpoint, 128) || !canonical(m->store_region, 32))
		return 0;
	uint64_t ul = fixed_len(m->store_url, 64), el = fixed_len(m->store_endpoint, 128),
		 rl = fixed_len(m->store_region, 32);
	if (ul == 0)
		return el == 0 && rl == 0;
	if (!has_prefix(m->store_url, ul, "s3://", 5))
		return 0;
	/* The bucket: 3..63 of a-z 0-9 . -, a letter or digit at each end. */
	uint64_t b = 5, e = 5;
	while (e < ul && m->store_url[e] != '/')
		e++;
	if (e - b < 3 || e - b > 63)
		return 0;
	for (uint64_t i = b; i < e; i++) {
		uint8_t c = m->store_url[i];
		int alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
		if (!alnum && ((c != '.' && c != '-') || i == b || i == e - 1))
			return 0;
	}
	/* The prefix: visible ASCII, no empty part, no trailing slash. */
	if (e < ul) {
		if (e + 1 == ul || m->store_url[ul - 1] == '/')
			return 0;
		for (uint64_t i = e + 1; i < ul; i++)
			if (!visible(m->store_url[i]) || (m->store_url[i] == '/' && m->store_url[i - 1] == '/'))
				return 0;
	}
	if (el != 0) {
		uint64_t h;
		if (has_prefix(m->store_endpoint, el, "https://", 8))
			h = 8;
		else if (has_prefix(m->store_endpoint, el, "http://", 7))
			h = 7;
		else
			return 0;
		if (h == el)
			return 0;
		for (uint64_t i = h; i < el; i++)
			if (!visible(m->store_endpoint[i]))
				return 0;
	}
	for (uint64_t i = 0; i < rl; i++) {
		uint8_t c = m->store_region[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
			return 0;
	}
	return 1;
}

static int model_valid(const struct psy_model *m)
{
	int ok = (m->architecture == 1 || m->architecture == 2) && m->max_seq_len > 0 && m->vocab_size > 0 &&
		 m->d_model > 0 && m->n_layers > 0 && m->n_heads > 0 && m->d_model % m->n_heads == 0;
	if (m->architecture == 2) /* Llama: GQA, even head size (RoPE turns pairs), finite rope_theta > 1 */
		ok = ok && m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads == 0 && (m->d_model / m->n_heads) % 2 == 0 &&
		     m->intermediate_size > 0 && m->rope_theta > 0x3f800000 && m->rope_theta < 0x7f800000;
	else
		ok = ok && m->n_kv_heads == 0 && m->intermediate_size == 0 && m->rope_theta == 0 && m->tied_head == 0;
	if (m->checkpoint_kind == CK_HUB || m->checkpoint_kind == CK_P2P)
		ok = ok && m->checkpoint.url[0] != 0;
	else
		ok = 0;
	ok = ok && canonical(m->checkpoint.url, 128) && canonical(m->checkpoint.revision, 32);
	ok = ok && (m->data_kind == 1 || m->data_kind == 2);
	ok = ok && m->data_location[0] != 0 && canonical(m->data_location, 128);
	ok = ok && (m->token_size == 2 || m->token_size == 4);
	ok = ok && (m->token_size != 2 || m->vocab_size <= (1u << 16));
	ok = ok && store_valid(m);
	ok = ok && m->lr_kind > 0 && m->lr_kind < 5 && positive32(m->base_lr) && nonneg32(m->final_lr);
	if (m->lr_kind == 4)
		ok = ok && (uint64_t)m->warmup_steps + (uint64_t)m->decay_steps <= (uint64_t)m->lr_total_steps;
	ok = ok && nonneg32(m->clip_grad_norm) && nonneg32(m->weight_decay);
	if (m->optimizer_kind == 1)
		ok = ok && unit32(m->beta1) && unit32(m->beta2) && positive32(m->epsilon);
	else if (m->optimizer_kind == 2)
		ok = ok && unit32(m->compression_decay) && m->compression_chunk > 0 && m->compression_topk > 0 &&
		     (uint32_t)m->compression_topk <= (uint32_t)m->compression_chunk * (uint32_t)m->compression_chunk &&
		     m->aggregation < 3 /* robust, mean, clipped-mean */ && m->normalization < 2; /* rms, none */
	else
		ok = 0;
	return ok;
}

static uint16_t witness_count(const struct psy_config *k, uint16_t clients_len)
{
	uint16_t w = k->witness_nodes;
	if (w == 0)
		w = PSY_MAX_WITNESSES;
	return min16(min16(w, clients_len), PSY_MAX_WITNESSES);
}

static uint16_t quorum(uint16_t w)
{
	if (w <= 1)
		return 1;
	if (w <= 3)
		return 2;
	uint16_t q = (uint16_t)(2 * w / 3);
	return q < 1 ? 1 : q;
}

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

static uint16_t round_batch_size(const struct psy_account *s, const struct psy_round *r)
{
	return batch_size(&s->config, s->model.max_seq_len, r->data_index);
}

static struct psy_round *cur_round(struct psy_account *s) { return &s->epoch.rounds[s->epoch.current_round]; }

static struct psy_round *previous_round(struct psy_account *s)
{
	if (s->epoch.first_round)
		return 0;
	if (cur_round(s)->height == 0)
		return 0;
	return &s->epoch.rounds[(s->epoch.current_round + PSY_NUM_ROUNDS - 1) % PSY_NUM_ROUNDS];
}

static uint16_t witness_position(const struct psy_round *r, uint16_t index)
{
	uint8_t key[32];
	psy_shuffle_key(r->random_seed, "witness", 7, key);
	return (uint16_t)psy_swap_or_not(index, r->clients_len, key);
}

/* Whether every elected witness of r that can still report has: one that is
 * no longer healthy (dropped by a health check) cannot, so the round does
 * not wait for it (the Go coordinator's witnessesIn). */
static int witnesses_in(const struct psy_account *s, const struct psy_round *r)
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

static uint16_t committee_position(const struct psy_round *r, uint16_t index)
{
	uint8_t key[32];
	psy_shuffle_key(r->random_seed, "committee", 9, key);
	return (uint16_t)psy_swap_or_not(index, r->clients_len, key);
}

/* ClientIndex: returns the index, or -1. */
static int64_t client_index(const struct psy_account *s, const uint8_t *signer)
{
	for (uint16_t i = 0; i < s->epoch.clients_len; i++)
		if (eq32(s->epoch.clients[i].id.signer, signer))
			return i;
	return -1;
}

static int64_t pending_index(const struct psy_account *s, const uint8_t *signer)
{
	for (uint16_t i = 0; i < s->pending_len; i++)
		if (eq32(s->pending[i].signer, signer))
			return i;
	return -1;
}

/* SittingOut: a health check dropped signer in this epoch (or, between
 * epochs, in the one that just ended). */
static int sitting_out(const struct psy_account *s, const uint8_t *signer)
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

static uint16_t healthy_clients(const struct psy_account *s)
{
	uint16_t n = 0;
	for (uint16_t i = 0; i < s->epoch.clients_len; i++)
		if (s->epoch.clients[i].state == CL_HEALTHY)
			n++;
	return n;
}

static int is_checkpointer(struct psy_account *s, uint16_t index)
{
	uint16_t n = s->epoch.clients_len;
	if (index >= n)
		return 0;
	uint8_t key[32];
	psy_shuffle_key(cur_round(s)->random_seed, "checkpoint", 10, key);
	return psy_swap_or_not(index, n, key) < (uint64_t)((n + 2) / 3);
}

static uint16_t health_score(const struct psy_round *r, const uint8_t *signer)
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

/* ---- transitions (machine.go) ---- */

static int timed_out(const struct psy_account *s, uint64_t now, uint64_t d)
{
	return now > s->run_state_start && now - s->run_state_start >= d;
}

static void set_state(struct psy_account *s, uint8_t st, uint64_t now)
{
	s->run_state = st;
	s->run_state_start = now;
}

static void withdraw_all(struct psy_account *s)
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

static int tick_warmup(struct psy_account *s, uint64_t now, uint64_t seed)
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
static uint64_t tick(struct psy_account *s, uint64_t now, uint64_t seed, int *changed)
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

/* ---- instructions ---- */

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
	ctx->ix_kind = IX_COUNT;
	if (data_len < 8)
		return ERR_TRUNCATED;
	uint64_t d = le64(data), kind = IX_COUNT;
	for (uint64_t i = 0; i < IX_COUNT; i++)
		if (ix_discriminators[i] == d)
			kind = i;
	if (kind == IX_COUNT)
		return ERR_UNKNOWN_INSTRUCTION;
	ctx->ix_kind = kind;

	struct psy_ix ix;
	clear(&ix, sizeof ix);
	struct rd r = {data, data_len, 8, 0};
	decode_args(&r, kind, &ix);
	if (r.err)
		return r.err;
	if (r.off != data_len)
		return ERR_MALFORMED;

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
