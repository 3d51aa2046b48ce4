package p2p

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// A joiner assembles a 20 MB checkpoint from three peers, one of which
// leaves after the joiner has received a quarter of the blocks.
func TestCheckpointFromPeersWhileOneLeaves(t *testing.T) {
	var tensors []Tensor
	for i := range 5 {
		tensors = append(tensors, Tensor{Name: fmt.Sprintf("layer.%d.weight", i), DType: "F32",
			Shape: []uint64{1000, 1000}, Data: randomBytes(uint64(100+i), 4_000_000)})
	}
	var (
		once    sync.Once
		joiner  *testNode
		sharers []*testNode
		left    coordinator.Pubkey
		killed  = make(chan struct{})
	)
	progress := func(done, total int) {
		if done < total/4 {
			return
		}
		once.Do(func() {
			// Take away the peer that has served the joiner most so far.
			from := joiner.Stats().BlocksFrom
			victim := sharers[0]
			for _, s := range sharers {
				if from[s.ID()] > from[victim.ID()] {
					victim = s
				}
			}
			left = victim.ID()
			victim.kill(t)
			close(killed)
		})
	}
	names := []string{"s0", "s1", "s2", "joiner"}
	var ids []coordinator.ClientID
	for _, n := range names {
		ids = append(ids, clientIDOf(n))
	}
	for _, n := range names[:3] {
		sharers = append(sharers, startNode(t, n))
	}
	joiner = startNode(t, "joiner", WithCheckpointConcurrency(4), WithCheckpointProgress(progress),
		WithFetchTimeout(3*time.Second), WithFetchRetries(3, 20*time.Millisecond))
	all := append(append([]*testNode{}, sharers...), joiner)
	for _, nd := range all {
		nd.SetClients(ids)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var id coordinator.Hash
	for i, s := range sharers {
		got, err := s.ShareCheckpoint(ctx, tensors)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && got != id {
			t.Fatal("the same tensors gave different manifest ids")
		}
		id = got
	}
	connectAll(t, all)
	var from []coordinator.Pubkey
	for _, s := range sharers {
		from = append(from, s.ID())
	}
	start := time.Now()
	got, err := joiner.FetchCheckpoint(ctx, id, from)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("20 MB checkpoint from 3 peers (one left) in %v; blocks by peer %v", time.Since(start), joiner.Stats().BlocksFrom)
	select {
	case <-killed:
	default:
		t.Fatal("no peer was taken away during the transfer")
	}
	if len(got) != len(tensors) {
		t.Fatalf("%d tensors, want %d", len(got), len(tensors))
	}
	for i := range got {
		w := tensors[i]
		if got[i].Name != w.Name || got[i].DType != w.DType || fmt.Sprint(got[i].Shape) != fmt.Sprint(w.Shape) ||
			!bytes.Equal(got[i].Data, w.Data) {
			t.Errorf("tensor %d (%s) differs", i, w.Name)
		}
	}
	servers := 0
	for _, n := range joiner.Stats().BlocksFrom {
		if n > 0 {
			servers++
		}
	}
	if servers < 2 {
		t.Errorf("blocks came from %d peer(s), want several", servers)
	}
	if joiner.Stats().BlocksFrom[left] == 0 {
		t.Error("the peer that left had served nothing")
	}
	// The joiner now serves the checkpoint itself.
	late := startNode(t, "late")
	late.SetClients(ids)
	joiner.SetClients(append(ids, clientIDOf("late")))
	if err := late.Connect(ctx, joiner.Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	again, err := late.FetchCheckpoint(ctx, id, []coordinator.Pubkey{joiner.ID()})
	if err != nil || len(again) != len(tensors) {
		t.Fatalf("fetch from the joiner: %v", err)
	}
}
