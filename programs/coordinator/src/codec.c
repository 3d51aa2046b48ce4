/*
 * Instruction decoding (codec.go's cursor): the discriminator, then each
 * instruction's arguments in the Borsh layout the Go encoder writes.
 */
#include "core.h"

/* sha256("global:<name>")[0:8], little-endian, in IX_* order. */
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

uint64_t decode_instruction(const uint8_t *data, uint64_t data_len, uint64_t *kind, struct psy_ix *ix)
{
	*kind = IX_COUNT;
	if (data_len < 8)
		return ERR_TRUNCATED;
	uint64_t d = le64(data);
	for (uint64_t i = 0; i < IX_COUNT; i++)
		if (ix_discriminators[i] == d)
			*kind = i;
	if (*kind == IX_COUNT)
		return ERR_UNKNOWN_INSTRUCTION;
	clear(ix, sizeof *ix);
	struct rd r = {data, data_len, 8, 0};
	decode_args(&r, *kind, ix);
	if (r.err)
		return r.err;
	if (r.off != data_len)
		return ERR_MALFORMED;
	return 0;
}
