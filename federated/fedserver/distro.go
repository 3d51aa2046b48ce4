package fedserver

import (
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/federated"
)

// A run whose optimizer is DisTrO takes DisTrO-compressed updates: each
// client sends the top-k DCT coefficients of its update, with its own error
// feedback (what it did not send is kept for its next round), as a distro
// frame. The server turns each frame into a dense update the way a DisTrO
// peer applies a result, −lr·sign(IDCT(coefficients)) with the run's base
// learning rate, and buffers that: the buffer's aggregation rule, staleness
// and DP apply unchanged, and the frame is what crossed the network.

// decompress is a frame's dense update (callers hold the run's mutex).
func (fr *run) decompress(acct *coordinator.Coordinator, frame []byte) ([]float32, error) {
	if acct.Model.Optimizer.Kind != coordinator.OptimizerDistro {
		return nil, fmt.Errorf("%w: a DisTrO frame for a run whose optimizer is not distro (send dense updates)", federated.ErrEncoding)
	}
	if fr.demo == nil {
		d, sizes, err := federated.Distro(&acct.Model)
		if err != nil {
			return nil, err
		}
		fr.demo, fr.sizes = d, sizes
	}
	f, err := distro.DecodeFrame(frame, fr.demo.Limits())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", federated.ErrMalformed, err)
	}
	if err := fr.demo.Check(f); err != nil {
		return nil, fmt.Errorf("%w: %v", federated.ErrShape, err)
	}
	n := 0
	for _, s := range fr.sizes {
		n += s
	}
	dense := make([]float32, n)
	out := make([][]float32, len(fr.sizes))
	at := 0
	for i, s := range fr.sizes {
		out[i] = dense[at : at+s]
		at += s
	}
	if err := fr.demo.Aggregate(out, []*distro.Frame{f}); err != nil {
		return nil, fmt.Errorf("%w: %v", federated.ErrShape, err)
	}
	lr := acct.Model.LR.BaseLR
	for i, v := range dense {
		dense[i] = -lr * v
	}
	return dense, nil
}
