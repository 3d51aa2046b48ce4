// Package checkpoint reads and writes model checkpoints in the safetensors
// format (docs/architecture.md §8), implemented here from the format's definition rather
// than through a library:
//
//	8 bytes   N, the header length, a little-endian uint64
//	N bytes   UTF-8 JSON: {"<name>": {"dtype": "F32", "shape": [..],
//	          "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//	rest      the tensor bytes, little-endian; offsets are relative to the
//	          first byte after the header
//
// Checkpoints travel between untrusted peers (a new trainer fetches the model
// from the previous epoch's clients), so the reader treats every file as
// hostile: it never panics, bounds every allocation by the input size and a
// header cap (Limits), and accepts a file only if it is unambiguous. Each
// tensor's byte range must match its shape and dtype exactly, the ranges may
// not overlap, and together they must cover the data section with no gap or
// trailing bytes, so no byte of a file can mean two things or be hidden
// (the format's own rule against polyglot files). Errors wrap ErrMalformed,
// and also ErrTruncated, ErrTooLarge or ErrUnsupportedDType where a
// caller may want to react differently (fetch again, raise a limit, convert).
//
// Tensors are float32 in memory. Files may hold F32, F16 or BF16 tensors; the
// 16-bit ones are widened exactly to float32 on load. Save always writes F32.
//
// The writer is canonical: tensors sorted by name and packed back to back,
// the metadata keys sorted, the header padded with spaces so the data section
// starts at a multiple of 8 bytes (every F32 tensor is then 4-byte aligned;
// padding between tensors would break the no-gap rule). Identical inputs
// therefore give identical bytes, which lets peers compare checkpoints by
// hash. Save replaces a file atomically, so a crash leaves either the old
// checkpoint or the new one, never a mix.
//
// The run's model architecture is stored as JSON under the metadata key
// ModelKey, so a trainer can refuse a checkpoint that does not fit the model
// the coordinator describes (ModelConfig).
package checkpoint
