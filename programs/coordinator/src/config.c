/*
 * The config and model rules (config.go), rule for rule.
 */
#include "core.h"

int config_valid(const struct psy_config *k)
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

int model_valid(const struct psy_model *m)
{
	int ok = m->architecture >= 1 && m->architecture <= 3 && m->max_seq_len > 0 && m->vocab_size > 0 &&
		 m->d_model > 0 && m->n_layers > 0 && m->n_heads > 0 && m->d_model % m->n_heads == 0;
	if (m->architecture == 2) /* Llama: GQA, even head size (RoPE turns pairs), finite rope_theta > 1 */
		ok = ok && m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads == 0 && (m->d_model / m->n_heads) % 2 == 0 &&
		     m->intermediate_size > 0 && m->rope_theta > 0x3f800000 && m->rope_theta < 0x7f800000;
	else /* GPT, Transformers: the Llama fields are zero */
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
