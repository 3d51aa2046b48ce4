package solana

import (
	"context"
	"fmt"

	sol "github.com/gagliardetto/solana-go"
	"github.com/gagliardetto/solana-go/rpc"
	"github.com/gagliardetto/solana-go/rpc/ws"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// Subscribe implements chain.Backend: an accountSubscribe on the coordinator
// account, re-established after any failure with an immediate fetch of the
// account so that nothing is missed in between.
func (b *Backend) Subscribe(ctx context.Context, runID string) (<-chan chain.Snapshot, error) {
	_, account, err := b.coordinatorAccount(ctx, runID)
	if err != nil {
		return nil, err
	}
	return chain.Resubscribe(ctx, b.cfg.log, runID, func(ctx context.Context, attempt int, out chan<- chain.Snapshot) error {
		return b.stream(ctx, b.cfg.wss[attempt%len(b.cfg.wss)], account, out)
	}), nil
}

func (b *Backend) stream(ctx context.Context, url string, account sol.PublicKey, out chan<- chain.Snapshot) error {
	client, err := ws.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer client.Close()
	sub, err := client.AccountSubscribeWithOpts(account, rpc.CommitmentConfirmed, sol.EncodingBase64)
	if err != nil {
		return err
	}
	// No sub.Unsubscribe: in solana-go v1.14.0 it closes the subscription's
	// channels from this goroutine while the client's reader may still send
	// on them (a data race, and a possible send on a closed channel). The
	// connection is this stream's alone, so closing the client ends the
	// subscription, and the reader closes it from its own goroutine.
	// The subscription may not be live yet; the fetch covers what lands meanwhile.
	snap, err := b.snapshotOf(ctx, account)
	if err != nil {
		return err
	}
	select {
	case out <- snap:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		res, err := sub.Recv(ctx)
		if err != nil {
			return err
		}
		// Agave notifies a closed account as a default one (no lamports,
		// no data, owned by the system program); some validators send null.
		if res == nil || res.Value == nil || res.Value.Lamports == 0 || !res.Value.Owner.Equals(b.cfg.program) {
			return fmt.Errorf("%w: coordinator account %s closed", chain.ErrRunNotFound, account)
		}
		state, err := coordinator.DecodeAccount(res.Value.Data.GetBinary())
		if err != nil {
			return err
		}
		select {
		case out <- chain.Snapshot{State: state}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
