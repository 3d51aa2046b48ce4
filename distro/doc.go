// Package distro owns DisTrO/DeMo gradient compression: the DCT over tiles,
// top-k selection, sign quantization, the wire frame of one trainer's result,
// aggregation of many results and the optimizer state. It is pure: no clock,
// randomness, I/O or logging.
package distro
