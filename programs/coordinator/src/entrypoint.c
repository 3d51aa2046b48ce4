/*
 * The SBPF entrypoint: it checks the transaction's accounts, derives the two
 * inputs the state machine takes from the chain (now from the Clock sysvar,
 * the round seed from the SlotHashes sysvar) and calls psy_process, the same
 * core the host harness tests against the Go coordinator.
 *
 * Accounts (every instruction):
 *   0  instance   the PDA ["coordinator", run_id] (80 bytes, owned by the
 *                 program): discriminator sha256("account:CoordinatorInstance")[0:8],
 *                 bump, 7 zero bytes, run_id[32], coordinator account key[32]
 *   1  coordinator  writable, owned by the program, 162744 bytes
 *   2  sender     signer: the authority, the joining client, the witness...
 *   3… extra      init_coordinator: the system program. join_run: the join
 *                 authority as a second signer when the run has one. tick,
 *                 warmup_witness: the SlotHashes sysvar (required).
 *
 * init_coordinator must be signed by the main authority it names. It runs in
 * the transaction that created the coordinator account (system create_account
 * with the program as owner: the account is too large to create from inside a
 * program) and after a system transfer that funds the instance PDA for 80
 * bytes (rent-exempt; an instance with no lamports is refused with
 * InstanceNotFunded, one with less than the minimum by the runtime's
 * InsufficientFundsForRent); the program checks the
 * PDA and bump with sol_try_find_program_address, then allocates and assigns
 * it to itself through the system program (signed with the PDA's seeds) and
 * writes the instance record. Every later instruction checks that the instance
 * account is owned by the program, re-derives its address from the recorded
 * run id and bump with sol_create_program_address, and that it names the
 * coordinator account. free_coordinator zeroes and closes both accounts and
 * pays their lamports to the main authority (which must be writable).
 *
 * Round seed: le64(sha256(SlotHashes[0].slot ‖ SlotHashes[0].hash ‖ Clock ‖
 * coordinator key ‖ nonce)[0:8]). How grindable it is: nothing in it comes
 * from an instruction argument, but all of it is known before the slot in
 * which the transaction lands (the parent's slot hash, the slot number and
 * timestamp are predictable), so whoever submits the tick can compute the
 * seed each upcoming slot would give and choose the slot (about 2.5 chances
 * per second) for as long as the tick is due and nobody else has sent it. A
 * leader can in addition withhold other tickers' transactions from its own
 * slots. Anyone may tick, so an honest ticker that ticks as soon as a timeout
 * passes leaves an adversary a window of a few slots, not a free choice; the
 * seed only decides committee/witness positions, checkpointers and data
 * order, never custody of funds. The key and nonce make seeds of different
 * runs (and of several ticks in one slot) differ.
 *
 * The seed a round-starting instruction draws is the next round's
 * (next_round_seed); the round that starts takes the one drawn a round
 * earlier (an epoch's first round: derived from its warmup's seed). Trainers
 * thus know round h+1's data assignment and witnesses while round h runs and
 * train it in the meantime. The grinding window is the same (one tick
 * chooses one seed); what changes is that its outcome is public one round
 * before it is used, and the ticker chooses it before knowing which clients
 * round h's health checks will drop, which only blurs its aim. Knowing one's
 * batch or witness slot a round early gives nothing to use: witness reports
 * are accepted only for the current round, and a batch's result is checked
 * against the round that assigned it.
 *
 * Errors: the coordinator's codes (6000+) come from the core. Problems with
 * the accounts themselves are Solana's built-in program errors (below).
 */
#include "entry.h"

#define BUILTIN(n) ((uint64_t)(n) << 32)
#define E_INVALID_ARGUMENT BUILTIN(2)
#define E_INVALID_ACCOUNT_DATA BUILTIN(4)
#define E_INCORRECT_PROGRAM_ID BUILTIN(7)
#define E_MISSING_REQUIRED_SIGNATURES BUILTIN(8)
#define E_ACCOUNT_ALREADY_INITIALIZED BUILTIN(9)
#define E_NOT_ENOUGH_ACCOUNT_KEYS BUILTIN(11)
#define E_INVALID_SEEDS BUILTIN(14)

#define INSTANCE_DISCRIMINATOR 0xfc1f18af1099099cULL
#define INSTANCE_SIZE 80

/* The bound on the input region handed to the parser: the runtime maps at
 * most this much (8 accounts of at most 10 MiB + realloc room). */
#define INPUT_BOUND (PSY_MAX_ACCOUNTS * (10ULL * 1024 * 1024 + 10240 + 256) + 2048)

typedef struct {
	const uint8_t *addr;
	uint64_t len;
} SolSignerSeed;
typedef struct {
	const SolSignerSeed *addr;
	uint64_t len;
} SolSignerSeeds;
typedef struct {
	const uint8_t *key;
	uint64_t *lamports;
	uint64_t data_len;
	uint8_t *data;
	const uint8_t *owner;
	uint64_t rent_epoch;
	uint8_t is_signer;
	uint8_t is_writable;
	uint8_t executable;
} SolAccountInfo;
typedef struct {
	const uint8_t *pubkey;
	uint8_t is_writable;
	uint8_t is_signer;
} SolAccountMeta;
typedef struct {
	const uint8_t *program_id;
	SolAccountMeta *accounts;
	uint64_t account_len;
	const uint8_t *data;
	uint64_t data_len;
} SolInstruction;
struct clock {
	uint64_t slot;
	int64_t epoch_start_timestamp;
	uint64_t epoch;
	uint64_t leader_schedule_epoch;
	int64_t unix_timestamp;
};

uint64_t sol_get_clock_sysvar(void *clock);
uint64_t sol_create_program_address(const SolSignerSeed *seeds, int seeds_len, const uint8_t *program_id,
				    uint8_t *address);
uint64_t sol_try_find_program_address(const SolSignerSeed *seeds, int seeds_len, const uint8_t *program_id,
				      uint8_t *address, uint8_t *bump);
uint64_t sol_invoke_signed_c(const SolInstruction *ix, const SolAccountInfo *infos, int infos_len,
			     const SolSignerSeeds *seeds, int seeds_len);

static const uint8_t slot_hashes_id[32] = {0x06, 0xa7, 0xd5, 0x17, 0x19, 0x2f, 0x0a, 0xaf, 0xc6, 0xf2, 0x65,
					   0xe3, 0xfb, 0x77, 0xcc, 0x7a, 0xda, 0x82, 0xc5, 0x29, 0xd0, 0xbe,
					   0x3b, 0x13, 0x6e, 0x2d, 0x00, 0x55, 0x20, 0x00, 0x00, 0x00};
static const uint8_t system_program_id[32] = {0};

static int same(const uint8_t *a, const uint8_t *b, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

static uint64_t text_len(const uint8_t *s, uint64_t max)
{
	uint64_t n = 0;
	while (n < max && s[n])
		n++;
	return n;
}

static void fill_info(SolAccountInfo *info, const struct psy_account_view *a)
{
	info->key = a->key;
	info->lamports = a->lamports;
	info->data_len = *a->data_len_ptr; /* current: a previous call may have resized it */
	info->data = a->data;
	info->owner = a->owner;
	info->rent_epoch = a->rent_epoch;
	info->is_signer = a->is_signer;
	info->is_writable = a->is_writable;
	info->executable = a->executable;
}

/* system_call invokes the system program on the instance account, signed
 * with the instance PDA's seeds. */
static uint64_t system_call(const struct psy_input *in, const uint8_t *data, uint64_t data_len,
			    const SolSignerSeeds *signer)
{
	SolAccountMeta meta = {in->accounts[0].key, 1, 1};
	SolInstruction ix = {system_program_id, &meta, 1, data, data_len};
	SolAccountInfo infos[2];
	fill_info(&infos[0], &in->accounts[0]);
	fill_info(&infos[1], &in->accounts[3]);
	return sol_invoke_signed_c(&ix, infos, 2, signer, 1);
}

/* create_instance makes account 0 the instance record of a new run. */
static uint64_t create_instance(struct psy_input *in, const struct psy_account *s)
{
	if (in->num_accounts < 4)
		return E_NOT_ENOUGH_ACCOUNT_KEYS;
	struct psy_account_view *inst = &in->accounts[0];
	if (!same(in->accounts[3].key, system_program_id, 32))
		return E_INCORRECT_PROGRAM_ID;
	if (!inst->is_writable || !same(inst->owner, system_program_id, 32) || inst->data_len != 0)
		return E_ACCOUNT_ALREADY_INITIALIZED;
	/* An instance with no lamports would end the transaction empty and be
	 * dropped by the runtime: the run would then have a coordinator account
	 * whose rent nobody can ever free (free_coordinator needs the instance).
	 * A balance above zero but below the rent-exempt minimum is refused by
	 * the runtime itself (InsufficientFundsForRent: an account may not go
	 * from empty to rent-paying), so zero is the one case to catch here. */
	if (*inst->lamports == 0)
		return ERR_INSTANCE_NOT_FUNDED;
	uint8_t bump = 0;
	uint8_t address[32];
	SolSignerSeed seeds[3] = {{(const uint8_t *)"coordinator", 11}, {s->run_id, text_len(s->run_id, 32)}, {&bump, 1}};
	if (sol_try_find_program_address(seeds, 2, in->program_id, address, &bump) || !same(address, inst->key, 32))
		return E_INVALID_SEEDS;
	SolSignerSeeds signer = {seeds, 3};
	uint8_t allocate[12] = {8, 0, 0, 0, INSTANCE_SIZE, 0, 0, 0, 0, 0, 0, 0};
	uint64_t err = system_call(in, allocate, sizeof allocate, &signer);
	if (err)
		return err;
	uint8_t assign[36] = {1, 0, 0, 0};
	for (int i = 0; i < 32; i++)
		assign[4 + i] = in->program_id[i];
	err = system_call(in, assign, sizeof assign, &signer);
	if (err)
		return err;
	/* The runtime updated the serialized length after the calls. */
	if (*inst->data_len_ptr != INSTANCE_SIZE)
		return E_INVALID_ACCOUNT_DATA;
	uint8_t *d = inst->data;
	sol_memset_(d, 0, INSTANCE_SIZE);
	*(psy_word *)d = INSTANCE_DISCRIMINATOR;
	d[8] = bump;
	sol_memcpy_(d + 16, s->run_id, 32);
	sol_memcpy_(d + 48, in->accounts[1].key, 32);
	return 0;
}

/* check_instance verifies accounts 0 and 1 of an instruction on a live run. */
static uint64_t check_instance(const struct psy_input *in)
{
	const struct psy_account_view *inst = &in->accounts[0];
	if (!same(inst->owner, in->program_id, 32))
		return E_INCORRECT_PROGRAM_ID;
	if (inst->data_len != INSTANCE_SIZE || *(const psy_word *)inst->data != INSTANCE_DISCRIMINATOR)
		return E_INVALID_ACCOUNT_DATA;
	const uint8_t *d = inst->data;
	uint8_t address[32];
	SolSignerSeed seeds[3] = {{(const uint8_t *)"coordinator", 11}, {d + 16, text_len(d + 16, 32)}, {d + 8, 1}};
	if (sol_create_program_address(seeds, 3, in->program_id, address) || !same(address, inst->key, 32))
		return E_INVALID_SEEDS;
	if (!same(d + 48, in->accounts[1].key, 32))
		return E_INVALID_ACCOUNT_DATA;
	return 0;
}

/* derive_seed: see the comment at the top. */
static uint64_t derive_seed(const struct psy_input *in, const struct clock *clk, const struct psy_account *s,
			    uint64_t *seed)
{
	const struct psy_account_view *sh = 0;
	for (uint64_t i = 3; i < in->num_accounts; i++)
		if (same(in->accounts[i].key, slot_hashes_id, 32))
			sh = &in->accounts[i];
	if (!sh)
		return E_NOT_ENOUGH_ACCOUNT_KEYS;
	uint8_t buf[40 + sizeof(struct clock) + 32 + 8];
	sol_memset_(buf, 0, sizeof buf);
	/* SlotHashes: u64 count, then (u64 slot, hash[32]) newest first. */
	if (sh->data_len >= 48 && *(const psy_word *)sh->data > 0)
		sol_memcpy_(buf, sh->data + 8, 40);
	sol_memcpy_(buf + 40, clk, sizeof *clk);
	sol_memcpy_(buf + 40 + sizeof *clk, in->accounts[1].key, 32);
	sol_memcpy_(buf + 72 + sizeof *clk, &s->nonce, 8);
	uint8_t h[32];
	psy_sha256_2(buf, sizeof buf, 0, 0, h);
	*seed = *(const psy_word *)h;
	return 0;
}

static void close_account(struct psy_account_view *a, struct psy_account_view *to)
{
	*to->lamports += *a->lamports;
	*a->lamports = 0;
	sol_memset_(a->data, 0, a->data_len);
	*a->data_len_ptr = 0;
}

uint64_t entrypoint(uint8_t *input)
{
	struct psy_input in;
	uint64_t err = psy_parse_input(input, INPUT_BOUND, &in);
	if (err)
		return err;
	if (in.num_accounts < 3)
		return E_NOT_ENOUGH_ACCOUNT_KEYS;
	struct psy_account_view *coordinator = &in.accounts[1], *sender = &in.accounts[2];
	if (!same(coordinator->owner, in.program_id, 32))
		return E_INCORRECT_PROGRAM_ID;
	if (!coordinator->is_writable)
		return E_INVALID_ARGUMENT;
	if (!sender->is_signer)
		return E_MISSING_REQUIRED_SIGNATURES;
	if (same(coordinator->key, in.accounts[0].key, 32) || same(coordinator->key, sender->key, 32))
		return E_INVALID_ARGUMENT;

	/* The instruction's kind, for the checks around the core (the core
	 * decodes and checks the data itself). */
	uint64_t kind = IX_COUNT;
	int init = 0;
	if (in.data_len >= 8) {
		uint64_t d = 0;
		for (int i = 7; i >= 0; i--)
			d = (d << 8) | in.data[i];
		init = d == 0x197a85e849943914ULL; /* init_coordinator */
	}
	if (!init) {
		err = check_instance(&in);
		if (err)
			return err;
	}

	struct clock clk;
	sol_get_clock_sysvar(&clk);
	struct psy_ctx ctx;
	sol_memset_(&ctx, 0, sizeof ctx);
	sol_memcpy_(ctx.sender, sender->key, 32);
	for (uint64_t i = 3; i < in.num_accounts; i++)
		if (in.accounts[i].is_signer && !same(in.accounts[i].key, sender->key, 32)) {
			sol_memcpy_(ctx.co_signer, in.accounts[i].key, 32);
			break;
		}
	ctx.now = clk.unix_timestamp < 0 ? 0 : (uint64_t)clk.unix_timestamp;
	const struct psy_account *s = (const struct psy_account *)coordinator->data;
	/* The seed is only used by instructions that can start a round. */
	if (in.data_len >= 8 && coordinator->data_len == sizeof(struct psy_account)) {
		uint64_t d = 0;
		for (int i = 7; i >= 0; i--)
			d = (d << 8) | in.data[i];
		if (d == 0x0f3f5065082c4f5cULL /* tick */ || d == 0x5e37163fe87ae8d3ULL /* warmup_witness */) {
			err = derive_seed(&in, &clk, s, &ctx.seed);
			if (err)
				return err;
		}
	}

	err = psy_process(coordinator->data, coordinator->data_len, in.data, in.data_len, &ctx);
	if (err)
		return err;
	kind = ctx.ix_kind;
	if (kind == IX_INIT_COORDINATOR)
		return create_instance(&in, s);
	if (kind == IX_FREE_COORDINATOR) {
		if (!sender->is_writable || !in.accounts[0].is_writable)
			return E_INVALID_ARGUMENT;
		close_account(&in.accounts[0], sender);
		close_account(coordinator, sender);
	}
	return 0;
}
