/*
 * The coordinator state machine's own header, shared by the files that port
 * the Go package coordinator one file each: codec.c (codec.go, instruction
 * decoding), account.c (account.go), config.c (config.go), committee.c
 * (committee.go), data.c (data.go), machine.c (machine.go, the transitions)
 * and instruction.c (instruction.go: psy_process and one function an
 * instruction). psy_process decodes one instruction, checks the account and
 * applies the instruction with the given context (sender, co-signer, now,
 * seed). It validates everything before it writes, so a rejected instruction
 * leaves the account as it was, like the Go Apply.
 *
 * The same files are compiled for SBPF (entrypoint.c derives the context
 * from the transaction and the sysvars) and for the host test harness
 * (host/harness.c), which runs them beside the Go coordinator. The small
 * helpers below are static inline, so each file has them without a call.
 */
#ifndef PSYCHE_CORE_H
#define PSYCHE_CORE_H

#include "psyche.h"

/* sha256("account:CoordinatorAccount")[0:8], little-endian. */
#define ACCOUNT_DISCRIMINATOR 0x2b569b2c37b121efULL

static inline uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* Keys are 32 bytes at 8-aligned addresses (account fields, the decoded
 * instruction and the context all are). */
static inline int eq32(const uint8_t *a, const uint8_t *b)
{
	const psy_word *x = (const psy_word *)a, *y = (const psy_word *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static inline int zero32(const uint8_t *a)
{
	const psy_word *x = (const psy_word *)a;
	return (x[0] | x[1] | x[2] | x[3]) == 0;
}

static inline void copy(void *dst, const void *src, uint64_t n)
{
	if (n && dst != src)
		sol_memcpy_(dst, src, n);
}

static inline void clear(void *dst, uint64_t n)
{
	if (n)
		sol_memset_(dst, 0, n);
}

/* canonicalFixed: text followed only by zeros. */
static inline int canonical(const uint8_t *b, uint64_t n)
{
	uint64_t i = 0;
	while (i < n && b[i] != 0)
		i++;
	for (; i < n; i++)
		if (b[i] != 0)
			return 0;
	return 1;
}

static inline int valid_run_id(const uint8_t *id)
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
static inline int finite32(uint32_t v) { return (v & 0x7f800000) != 0x7f800000; }
static inline int nonneg32(uint32_t v) { return finite32(v) && ((v >> 31) == 0 || v == 0x80000000); }
static inline int positive32(uint32_t v) { return nonneg32(v) && (v & 0x7fffffff) != 0; }
static inline int unit32(uint32_t v) { return nonneg32(v) && (v & 0x7fffffff) < 0x3f800000; }

static inline uint16_t min16(uint16_t a, uint16_t b) { return a < b ? a : b; }

static inline struct psy_round *cur_round(struct psy_account *s) { return &s->epoch.rounds[s->epoch.current_round]; }

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

/* codec.c: the instruction's discriminator (IX_* into *kind, IX_COUNT when
 * unknown) and arguments, or an error code. */
uint64_t decode_instruction(const uint8_t *data, uint64_t data_len, uint64_t *kind, struct psy_ix *ix);

/* account.c: the checks of a stored account (account.go's DecodeAccount). */
uint64_t check_account(const struct psy_account *s);

/* config.c (config.go). */
int config_valid(const struct psy_config *k);
int model_valid(const struct psy_model *m);

/* committee.c (committee.go): witnesses, quorum, the checkpointer, health. */
uint16_t witness_count(const struct psy_config *k, uint16_t clients_len);
uint16_t quorum(uint16_t w);
uint16_t witness_position(const struct psy_round *r, uint16_t index);
int witnesses_in(const struct psy_account *s, const struct psy_round *r);
uint16_t committee_position(const struct psy_round *r, uint16_t index);
int is_checkpointer(struct psy_account *s, uint16_t index);
uint16_t health_score(const struct psy_round *r, const uint8_t *signer);

/* data.c (data.go): batch sizes, rounds and client lookups. */
uint16_t round_batch_size(const struct psy_account *s, const struct psy_round *r);
struct psy_round *previous_round(struct psy_account *s);
int64_t client_index(const struct psy_account *s, const uint8_t *signer);
int64_t pending_index(const struct psy_account *s, const uint8_t *signer);
int sitting_out(const struct psy_account *s, const uint8_t *signer);
uint16_t healthy_clients(const struct psy_account *s);

/* machine.c (machine.go): the transitions. */
void set_state(struct psy_account *s, uint8_t st, uint64_t now);
void withdraw_all(struct psy_account *s);
int tick_warmup(struct psy_account *s, uint64_t now, uint64_t seed);
uint64_t tick(struct psy_account *s, uint64_t now, uint64_t seed, int *changed);

#endif
