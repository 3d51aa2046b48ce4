// Package trainer owns the model, its kernels, the data provider, checkpoints
// and the client node that drives a trainer through a run.
package trainer
