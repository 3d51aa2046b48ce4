package sbpf

// knownSyscalls are the functions the Solana runtime provides to SBPFv0
// programs, bound by name through R_BPF_64_32 relocations. A call to any
// other undefined function would only fail when the program is deployed
// (the loader refuses unresolved symbols), so Link refuses it: the usual
// cause is the compiler emitting memcpy/memset for a large copy, which
// sol_memcpy_/sol_memset_ replace.
var knownSyscalls = map[string]bool{
	"abort": true, "sol_panic_": true,
	"sol_log_": true, "sol_log_64_": true, "sol_log_pubkey": true, "sol_log_compute_units_": true, "sol_log_data": true,
	"sol_create_program_address": true, "sol_try_find_program_address": true,
	"sol_sha256": true, "sol_keccak256": true, "sol_blake3": true, "sol_poseidon": true,
	"sol_secp256k1_recover": true, "sol_big_mod_exp": true,
	"sol_curve_validate_point": true, "sol_curve_group_op": true, "sol_curve_multiscalar_mul": true,
	"sol_curve_decompress": true, "sol_curve_pairing_map": true,
	"sol_alt_bn128_group_op": true, "sol_alt_bn128_compression": true,
	"sol_get_clock_sysvar": true, "sol_get_epoch_schedule_sysvar": true, "sol_get_rent_sysvar": true,
	"sol_get_fees_sysvar": true, "sol_get_epoch_rewards_sysvar": true, "sol_get_last_restart_slot": true,
	"sol_get_sysvar": true, "sol_get_epoch_stake": true,
	"sol_memcpy_": true, "sol_memmove_": true, "sol_memset_": true, "sol_memcmp_": true,
	"sol_get_processed_sibling_instruction": true, "sol_get_stack_height": true,
	"sol_set_return_data": true, "sol_get_return_data": true,
	"sol_invoke_signed_c": true, "sol_invoke_signed_rust": true,
	"sol_alloc_free_": true, "sol_remaining_compute_units": true,
}
