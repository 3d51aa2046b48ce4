/*
 * The psyche coordinator: the account layout, the error codes and the
 * interface between the state-machine core (the files core.h lists, and
 * hash.c) and its two drivers, the SBPF entrypoint (entrypoint.c) and the
 * host test harness (host/harness.c).
 *
 * Freestanding C for clang -target bpfel -mcpu=v2 (docs/architecture.md §5): no libc, no
 * mutable globals, at most five arguments per function, no struct returns,
 * sol_memcpy_/sol_memset_ for every copy or clear that is not a few words.
 *
 * The structs mirror the Go coordinator's account byte for byte (every field
 * naturally aligned, padding explicit): the _Static_asserts below are the
 * offsets of coordinator/testdata/account_layout.golden, and the Go test
 * checks that table against the same numbers.
 */
#ifndef PSYCHE_H
#define PSYCHE_H

#ifdef PSY_HOST /* the test harness: the host's own integer types */
#include <stdint.h>
#else
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed long long int64_t;
#endif
/* A word that may alias the bytes of keys and discriminators. */
typedef uint64_t __attribute__((may_alias)) psy_word;

_Static_assert(sizeof(uint16_t) == 2 && sizeof(uint32_t) == 4 && sizeof(uint64_t) == 8, "integer sizes");

#define PSY_MAX_CLIENTS 256
#define PSY_MAX_EXITED 512
#define PSY_MAX_WITNESSES 32
#define PSY_NUM_ROUNDS 4
#define PSY_BLOOM_WORDS 40
#define PSY_BLOOM_BITS 2560
#define PSY_BLOOM_HASHES 7
#define PSY_SHUFFLE_ROUNDS 90
#define PSY_ACCOUNT_VERSION 2
#define PSY_MAX_WARMUP_TOKENS (1ULL << 47)

/* Run states. */
enum {
	ST_UNINITIALIZED = 0,
	ST_WAITING_FOR_MEMBERS = 1,
	ST_WARMUP = 2,
	ST_ROUND_TRAIN = 3,
	ST_ROUND_WITNESS = 4,
	ST_COOLDOWN = 5,
	ST_FINISHED = 6,
	ST_PAUSED = 7,
	ST_COUNT = 8,
};

/* Client states. */
enum { CL_HEALTHY = 0, CL_DROPPED = 1, CL_WITHDRAWN = 2, CL_EJECTED = 3, CL_COUNT = 4 };

/* Checkpoint kinds. */
enum { CK_NONE = 0, CK_EPHEMERAL = 1, CK_HUB = 2, CK_P2P = 3 };

/* Error codes: coordinator/errors.go (custom program errors). */
enum {
	ERR_MALFORMED = 6000,
	ERR_TRUNCATED = 6001,
	ERR_WRONG_SIZE = 6002,
	ERR_WRONG_DISCRIMINATOR = 6003,
	ERR_WRONG_VERSION = 6004,
	ERR_UNKNOWN_INSTRUCTION = 6005,
	ERR_UNAUTHORIZED = 6010,
	ERR_JOIN_NOT_AUTHORIZED = 6011,
	ERR_SIGNER_MISMATCH = 6012,
	ERR_INVALID_RUN_ID = 6013,
	ERR_INVALID_AUTHORITY = 6014,
	ERR_ALREADY_INITIALIZED = 6015,
	ERR_INVALID_CLIENT_ID = 6016,
	ERR_DUPLICATE_P2P_IDENTITY = 6017,
	ERR_HALTED = 6020,
	ERR_WRONG_STATE = 6021,
	ERR_FINISHED = 6022,
	ERR_ALREADY_PAUSED = 6023,
	ERR_NOT_PAUSED = 6024,
	ERR_NOT_HALTED = 6025,
	ERR_NOTHING_DUE = 6026,
	ERR_INVALID_CONFIG = 6030,
	ERR_INVALID_MODEL = 6031,
	ERR_INVALID_PROGRESS = 6032,
	ERR_PENDING_FULL = 6040,
	ERR_NOT_A_CLIENT = 6041,
	ERR_INVALID_PROOF = 6050,
	ERR_NOT_A_WITNESS = 6051,
	ERR_DUPLICATE_WITNESS = 6052,
	ERR_WRONG_STEP = 6053,
	ERR_WITNESSES_FULL = 6054,
	ERR_UNSUPPORTED_COMMITTEE = 6055,
	ERR_CLIENT_HEALTHY = 6060,
	ERR_CLIENT_NOT_HEALTHY = 6061,
	ERR_NO_PREVIOUS_ROUND = 6062,
	ERR_NOT_CHECKPOINTER = 6070,
	ERR_ALREADY_CHECKPOINTED = 6071,
	ERR_INVALID_CHECKPOINT = 6072,
	ERR_INSTANCE_NOT_FUNDED = 6080,
};

/* Instructions, in IDL order (the values are internal, the ABI is the
 * 8-byte discriminator). */
enum {
	IX_INIT_COORDINATOR = 0,
	IX_UPDATE = 1,
	IX_SET_PAUSED = 2,
	IX_JOIN_RUN = 3,
	IX_TICK = 4,
	IX_WARMUP_WITNESS = 5,
	IX_WITNESS = 6,
	IX_HEALTH_CHECK = 7,
	IX_CHECKPOINT = 8,
	IX_FREE_COORDINATOR = 9,
	IX_COUNT = 10,
};

struct psy_client_id {
	uint8_t signer[32];
	uint8_t p2p[32];
};

struct psy_client {
	struct psy_client_id id;
	uint8_t state;
	uint8_t pad[3];
	uint32_t exited_height;
};

struct psy_proof {
	uint16_t position;
	uint16_t index;
	uint8_t is_witness;
	uint8_t pad[3];
};

struct psy_witness {
	struct psy_proof proof;
	uint64_t key;
	uint64_t participants[PSY_BLOOM_WORDS];
	uint64_t broadcasts[PSY_BLOOM_WORDS];
	uint8_t merkle[32];
	uint32_t step;
	uint32_t tokens_per_sec; /* f32 bits */
	uint32_t bandwidth_per_sec;
	uint32_t loss;
};

struct psy_round {
	struct psy_witness witnesses[PSY_MAX_WITNESSES];
	uint64_t data_index;
	uint64_t random_seed;
	uint32_t height;
	uint16_t clients_len;
	uint8_t witnesses_len;
	uint8_t pad;
};

struct psy_epoch {
	struct psy_round rounds[PSY_NUM_ROUNDS];
	struct psy_client clients[PSY_MAX_CLIENTS];
	struct psy_client exited[PSY_MAX_EXITED];
	uint64_t start_timestamp;
	uint32_t start_step;
	uint32_t last_step;
	uint16_t clients_len;
	uint16_t exited_len;
	uint8_t current_round;
	uint8_t first_round;
	uint8_t cold_start;
	uint8_t checkpointed;
};

struct psy_metadata {
	uint8_t name[64];
	uint8_t description[128];
	uint64_t num_parameters;
	uint64_t vocab_size;
};

struct psy_config {
	uint64_t warmup_time;
	uint64_t cooldown_time;
	uint64_t max_round_train_time;
	uint64_t round_witness_time;
	uint64_t epoch_time;
	uint64_t waiting_for_members_extra_time;
	uint64_t global_batch_size_warmup_tokens;
	uint32_t total_steps;
	uint16_t global_batch_size_start;
	uint16_t global_batch_size_end;
	uint16_t init_min_clients;
	uint16_t min_clients;
	uint16_t witness_nodes;
	uint8_t verification_percent;
	uint8_t pad;
};

struct psy_checkpoint_source {
	uint8_t url[128];
	uint8_t revision[32];
};

struct psy_model {
	uint8_t architecture;
	uint8_t data_kind;
	uint8_t token_size;
	uint8_t pad0;
	uint32_t max_seq_len;
	uint32_t vocab_size;
	uint32_t d_model;
	uint32_t n_layers;
	uint32_t n_heads;
	/* Llama only (zero for GPT): key/value heads, MLP hidden size, rotary base, tied output head. */
	uint32_t n_kv_heads;
	uint32_t intermediate_size;
	uint32_t rope_theta; /* f32 bits */
	uint8_t tied_head;
	uint8_t pad4[3];
	uint8_t checkpoint_kind;
	uint8_t pad1[7];
	struct psy_checkpoint_source checkpoint;
	uint8_t data_location[128];
	uint8_t lr_kind;
	uint8_t pad2[3];
	uint32_t base_lr; /* f32 bits */
	uint32_t final_lr;
	uint32_t warmup_steps;
	uint32_t decay_steps;
	uint32_t lr_total_steps;
	uint8_t optimizer_kind;
	uint8_t quantize_1bit;
	uint16_t compression_topk;
	uint16_t compression_chunk;
	uint8_t aggregation; /* coordinator.Aggregation: 0 robust, 1 mean, 2 clipped-mean (was padding) */
	uint8_t normalization; /* coordinator.Normalization: 0 rms, 1 none (was padding) */
	uint32_t clip_grad_norm; /* f32 bits */
	uint32_t weight_decay;
	uint32_t compression_decay;
	uint32_t beta1;
	uint32_t beta2;
	uint32_t epsilon;
	/* coordinator.CheckpointStore: where elected checkpointers upload (all zero: none). */
	uint8_t store_url[64];
	uint8_t store_endpoint[128];
	uint8_t store_region[32];
};

struct psy_progress {
	uint32_t epoch;
	uint32_t step;
	uint64_t epoch_start_data_index;
};

struct psy_account {
	uint8_t discriminator[8];
	uint32_t version;
	uint32_t reserved;
	uint64_t nonce;
	uint8_t run_id[32];
	uint8_t main_authority[32];
	uint8_t join_authority[32];
	uint8_t run_state;
	uint8_t pending_pause;
	uint8_t pad0[6];
	uint64_t run_state_start;
	struct psy_metadata metadata;
	struct psy_config config;
	struct psy_model model;
	struct psy_progress progress;
	struct psy_epoch epoch;
	struct psy_client_id pending[PSY_MAX_CLIENTS];
	uint16_t pending_len;
	uint8_t pad1[6];
	uint64_t next_round_seed; /* the next training round's seed, drawn one round early */
};

#define PSY_OFF(f) __builtin_offsetof(struct psy_account, f)
/* Rows of coordinator/testdata/account_layout.golden. */
_Static_assert(sizeof(struct psy_account) == 162976, "account size");
_Static_assert(PSY_OFF(nonce) == 16 && PSY_OFF(run_state) == 120 && PSY_OFF(run_state_start) == 128, "header");
_Static_assert(PSY_OFF(metadata) == 136 && PSY_OFF(config) == 344 && PSY_OFF(config.verification_percent) == 414, "config");
_Static_assert(PSY_OFF(model) == 416 && PSY_OFF(model.n_kv_heads) == 440 && PSY_OFF(model.tied_head) == 452 &&
	       PSY_OFF(model.checkpoint_kind) == 456 && PSY_OFF(model.checkpoint.url) == 464, "model");
_Static_assert(PSY_OFF(model.data_location) == 624 && PSY_OFF(model.lr_kind) == 752 && PSY_OFF(model.optimizer_kind) == 776, "model");
_Static_assert(PSY_OFF(model.aggregation) == 782 && PSY_OFF(model.normalization) == 783 && PSY_OFF(model.clip_grad_norm) == 784, "optimizer");
_Static_assert(PSY_OFF(model.epsilon) == 804 && PSY_OFF(model.store_url) == 808 && PSY_OFF(model.store_endpoint) == 872 &&
	       PSY_OFF(model.store_region) == 1000 && PSY_OFF(progress) == 1032, "store, progress");
_Static_assert(PSY_OFF(epoch.rounds) == 1048 && sizeof(struct psy_witness) == 704 && sizeof(struct psy_round) == 22552, "rounds");
_Static_assert(PSY_OFF(epoch.rounds[0].data_index) == 23576 && PSY_OFF(epoch.rounds[0].witnesses_len) == 23598, "round");
_Static_assert(PSY_OFF(epoch.clients) == 91256 && sizeof(struct psy_client) == 72 && PSY_OFF(epoch.exited) == 109688, "clients");
_Static_assert(PSY_OFF(epoch.start_timestamp) == 146552 && PSY_OFF(epoch.checkpointed) == 146575, "epoch");
_Static_assert(PSY_OFF(pending) == 146576 && PSY_OFF(pending_len) == 162960, "pending");
_Static_assert(PSY_OFF(next_round_seed) == 162968, "next round seed");

/* What an instruction is applied with (coordinator.Context). */
struct psy_ctx {
	uint8_t sender[32];
	uint8_t co_signer[32]; /* zero if none */
	uint64_t now;          /* unix seconds */
	uint64_t seed;         /* randomness for a round this instruction may start */
	uint64_t ix_kind;      /* out: the instruction (IX_*), IX_COUNT if unknown */
};

/* psy_process applies one instruction (its complete data, discriminator
 * first) to the account bytes, exactly like the Go coordinator: it returns 0
 * and mutates the account (bumping the nonce when anything changed), or
 * returns an error code and leaves the account untouched. ctx->ix_kind
 * receives the instruction (IX_*) once its discriminator is known, else
 * IX_COUNT. It never reads or writes outside the given lengths. */
uint64_t psy_process(uint8_t *acct, uint64_t acct_len, const uint8_t *data, uint64_t data_len, struct psy_ctx *ctx);

/* Hashing (hash.c). */
void psy_sha256_2(const uint8_t *a, uint64_t alen, const uint8_t *b, uint64_t blen, uint8_t *out);
void psy_shuffle_key(uint64_t seed, const char *salt, uint64_t salt_len, uint8_t *key);
uint64_t psy_swap_or_not(uint64_t index, uint64_t n, const uint8_t *key);
int psy_bloom_has(const uint64_t *words, uint64_t key, const uint8_t *member);

/* Runtime services: Solana syscalls on chain, host/shim.c in tests. */
typedef struct {
	const uint8_t *addr;
	uint64_t len;
} SolBytes;
uint64_t sol_sha256(const SolBytes *bytes, int bytes_len, uint8_t *result);
void sol_memcpy_(void *dst, const void *src, uint64_t n);
void sol_memset_(void *dst, int c, uint64_t n);
void sol_log_(const char *msg, uint64_t len);

#endif
