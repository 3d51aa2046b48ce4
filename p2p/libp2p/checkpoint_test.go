package libp2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/p2ptest"
)

// A joiner assembles a 20 MB checkpoint from three peers, one of which
// leaves after the joiner has received a quarter of the blocks.
func TestCheckpointFromPeersWhileOneLeaves(t *testing.T) {
	var tensors []p2p.Tensor
	for i := range 5 {
		tensors = append(tensors, p2p.Tensor{Name: fmt.Sprintf("layer.%d.weight", i), DType: "F32",
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
		got, err := s.ShareCheckpoint(ctx, 1, p2p.TensorsSource(tensors))
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
	f, err := p2p.NewCheckpointFile(p2p.SpecsOf(tensors))
	if err != nil {
		t.Fatal(err)
	}
	if err := joiner.FetchCheckpoint(ctx, id, from, f); err != nil {
		f.Close()
		t.Fatal(err)
	}
	got, err := p2p.ReadTensors(f)
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
	// The joiner now serves the checkpoint itself, from the file it
	// fetched into: the same manifest, known without reading it again.
	if again, err := joiner.ShareCheckpoint(ctx, 1, f); err != nil || again != id {
		t.Fatalf("the joiner shares %x, %v; want %x", again, err, id)
	}
	late := startNode(t, "late")
	late.SetClients(ids)
	joiner.SetClients(append(ids, clientIDOf("late")))
	if err := late.Connect(ctx, joiner.Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	again, err := p2ptest.FetchTensors(ctx, late, id, []coordinator.Pubkey{joiner.ID()}, p2p.SpecsOf(tensors))
	if err != nil || len(again) != len(tensors) {
		t.Fatalf("fetch from the joiner: %v", err)
	}
}

// A joiner learns the manifest id from the peers' offers: the id most of
// them name, none for an epoch nobody serves, an error on a tie.
func TestCheckpointOffers(t *testing.T) {
	names := []string{"a", "b", "c", "joiner"}
	var ids []coordinator.ClientID
	var nodes []*testNode
	for _, n := range names {
		ids = append(ids, clientIDOf(n))
		nodes = append(nodes, startNode(t, n))
	}
	for _, nd := range nodes {
		nd.SetClients(ids)
	}
	connectAll(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	share := func(nd *testNode, epoch uint32, seed uint64) coordinator.Hash {
		id, err := nd.ShareCheckpoint(ctx, epoch, p2p.TensorsSource([]p2p.Tensor{{Name: "w", DType: "F32", Shape: []uint64{256}, Data: randomBytes(seed, 1024)}}))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	joiner := nodes[3]
	from := []coordinator.Pubkey{nodes[0].ID(), nodes[1].ID(), nodes[2].ID()}
	if _, err := joiner.FindCheckpoint(ctx, 1, from); !errors.Is(err, p2p.ErrNoCheckpoint) {
		t.Fatalf("nothing shared: %v", err)
	}
	good := share(nodes[0], 1, 7)
	other := share(nodes[1], 1, 8)
	if _, err := joiner.FindCheckpoint(ctx, 1, from); !errors.Is(err, p2p.ErrCheckpointDisputed) {
		t.Fatalf("one against one: %v", err)
	}
	if again := share(nodes[2], 1, 7); again != good {
		t.Fatal("the same tensors gave another id")
	}
	for _, tc := range []struct {
		epoch uint32
		want  coordinator.Hash
		err   error
	}{
		{1, good, nil},
		{2, coordinator.Hash{}, p2p.ErrNoCheckpoint}, // offers name their epoch
	} {
		got, err := joiner.FindCheckpoint(ctx, tc.epoch, from)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("epoch %d: %x, %v; want %x, %v", tc.epoch, got[:4], err, tc.want[:4], tc.err)
		}
	}
	// The majority's checkpoint is what the joiner then fetches.
	got, err := p2ptest.FetchTensors(ctx, joiner, good, from, []p2p.TensorSpec{{Name: "w", DType: "F32", Shape: []uint64{256}}})
	if err != nil || !bytes.Equal(got[0].Data, randomBytes(7, 1024)) {
		t.Fatalf("fetch: %v", err)
	}
	_ = other
}

// A checkpoint's blocks come over the blob stream from the peer that
// shares it, each distinct block once: a block that two tensors share is
// streamed once and filled into both, and a block the joiner holds already
// is not asked for at all.
func TestCheckpointStreamed(t *testing.T) {
	var (
		mu     sync.Mutex
		served = map[coordinator.Hash]int{}
	)
	hook := func(_ int, h coordinator.Hash) {
		mu.Lock()
		served[h]++
		mu.Unlock()
	}
	names := []string{"sharer", "joiner"}
	var ids []coordinator.ClientID
	for _, n := range names {
		ids = append(ids, clientIDOf(n))
	}
	sharer := startNode(t, "sharer", withServeHook(hook))
	joiner := startNode(t, "joiner")
	for _, nd := range []*testNode{sharer, joiner} {
		nd.SetClients(ids)
	}
	connectAll(t, []*testNode{sharer, joiner})
	// Blocks of 1 MiB: "a" has five and a half, "b" repeats "a"'s first
	// three, "c" is the joiner's own (a result it already holds).
	a := randomBytes(21, 5*p2p.BlockSize+p2p.BlockSize/2)
	c := randomBytes(22, p2p.BlockSize)
	tensors := []p2p.Tensor{
		{Name: "a", DType: "F32", Shape: []uint64{uint64(len(a) / 4)}, Data: a},
		{Name: "b", DType: "F32", Shape: []uint64{3 * p2p.BlockSize / 4}, Data: a[:3*p2p.BlockSize]},
		{Name: "c", DType: "F32", Shape: []uint64{p2p.BlockSize / 4}, Data: c},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := sharer.ShareCheckpoint(ctx, 1, p2p.TensorsSource(tensors))
	if err != nil {
		t.Fatal(err)
	}
	joiner.SetStep(1)
	if _, err := joiner.Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 1}, c); err != nil {
		t.Fatal(err)
	}
	got, err := p2ptest.FetchTensors(ctx, joiner, id, []coordinator.Pubkey{sharer.ID()}, p2p.SpecsOf(tensors))
	if err != nil {
		t.Fatal(err)
	}
	for i := range tensors {
		if got[i].Name != tensors[i].Name || !bytes.Equal(got[i].Data, tensors[i].Data) {
			t.Errorf("tensor %s differs", tensors[i].Name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, h := range p2p.BlockDigests(a) {
		if served[h] != 1 {
			t.Errorf("block %d of a streamed %d times, want once", i, served[h])
		}
	}
	if h := p2p.BlockDigest(c); served[h] != 0 {
		t.Errorf("the block the joiner held was streamed %d times", served[h])
	}
}

// A checkpoint block that does not match its digest is refused on arrival
// over the stream and counted against the peer that sent it; the joiner
// gets that block from another holder (over bitswap) and never assembles a
// wrong tensor.
func TestCheckpointWrongBlockIsRefused(t *testing.T) {
	sharer, helper, joiner := trio(t, nil, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a hang guard
	defer cancel()
	data := randomBytes(23, 4*p2p.BlockSize)
	tensors := []p2p.Tensor{{Name: "w", DType: "F32", Shape: []uint64{uint64(len(data) / 4)}, Data: data}}
	id, err := sharer.ShareCheckpoint(ctx, 1, p2p.TensorsSource(tensors))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := helper.ShareCheckpoint(ctx, 1, p2p.TensorsSource([]p2p.Tensor{{Name: "w", DType: "F32", Shape: tensors[0].Shape, Data: bytes.Clone(data)}})); err != nil || again != id {
		t.Fatalf("the helper's share: %v", err)
	}
	// Corrupt block 1 where the sharer serves it from, keeping its length.
	want := bytes.Clone(data)
	data[p2p.BlockSize+777] ^= 1
	// Streams go to the sharer alone; the helper serves through bitswap.
	got, err := p2ptest.FetchTensors(ctx, joiner, id, []coordinator.Pubkey{sharer.ID()}, p2p.SpecsOf(tensors))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[0].Data, want) {
		t.Fatal("tensor differs")
	}
	if joiner.Stats().PeerErrors[sharer.ID()] == 0 {
		t.Error("the wrong block was not counted against the sharer")
	}
}

// closeCounter is a checkpoint source that counts its Close calls.
type closeCounter struct {
	p2p.CheckpointSource
	closed *int
	mu     *sync.Mutex
}

func (c closeCounter) Close() error {
	c.mu.Lock()
	*c.closed++
	c.mu.Unlock()
	return c.CheckpointSource.Close()
}

// A shared checkpoint is served from its source, over the stream and over
// bitswap alike, without its blocks entering the sharer's store; the source
// is closed once, when the sharer shares another checkpoint, and the new
// one when the sharer closes.
func TestCheckpointServedFromItsSource(t *testing.T) {
	sharer, _, joiner := trio(t, nil, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a hang guard
	defer cancel()
	var mu sync.Mutex
	closed := [2]int{}
	source := func(seed uint64, k int) (p2p.CheckpointSource, []p2p.Tensor) {
		ts := []p2p.Tensor{
			{Name: "a", DType: "F32", Shape: []uint64{3, p2p.BlockSize / 4}, Data: randomBytes(seed, 3*p2p.BlockSize)},
			{Name: "b", DType: "F32", Shape: []uint64{1000}, Data: randomBytes(seed+1, 4000)},
			// The same block twice (a tensor of zeros): fetched once,
			// copied within the joiner's file.
			{Name: "c", DType: "F32", Shape: []uint64{2, p2p.BlockSize / 4}, Data: make([]byte, 2*p2p.BlockSize)},
		}
		return closeCounter{p2p.TensorsSource(ts), &closed[k], &mu}, ts
	}
	src, tensors := source(41, 0)
	id, err := sharer.ShareCheckpoint(ctx, 1, src)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sharer.bstore.Get(ctx, cidOf(id))
	if err != nil {
		t.Fatal(err)
	}
	m, err := p2p.DecodeCheckpointManifest(raw.RawData())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range m.Tensors {
		for _, h := range e.Blob.Blocks {
			if held, _ := sharer.bstore.Blockstore.Has(ctx, cidOf(h)); held {
				t.Fatalf("block %x of tensor %s was copied into the sharer's store", h[:4], e.Name)
			}
		}
	}
	for _, stream := range []bool{true, false} {
		joiner.cfg.noStream = !stream
		got, err := p2ptest.FetchTensors(ctx, joiner, id, []coordinator.Pubkey{sharer.ID()}, p2p.SpecsOf(tensors))
		if err != nil {
			t.Fatalf("streamed %v: %v", stream, err)
		}
		for i := range tensors {
			if !bytes.Equal(got[i].Data, tensors[i].Data) {
				t.Fatalf("streamed %v: tensor %s differs", stream, tensors[i].Name)
			}
		}
		// The blocks went into the joiner's file, not its memory: neither
		// the streamed ones nor those bitswap stored on their way.
		for _, e := range m.Tensors {
			for _, h := range e.Blob.Blocks {
				if held, _ := joiner.bstore.Blockstore.Has(ctx, cidOf(h)); held {
					t.Fatalf("streamed %v: block %x of tensor %s stayed in the joiner's store", stream, h[:4], e.Name)
				}
			}
		}
	}
	next, _ := source(43, 1)
	if _, err := sharer.ShareCheckpoint(ctx, 2, next); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if closed != [2]int{1, 0} {
		t.Errorf("after the next share, closes = %v, want [1 0]", closed)
	}
	mu.Unlock()
	sharer.Close()
	mu.Lock()
	defer mu.Unlock()
	if closed != [2]int{1, 1} {
		t.Errorf("after Close, closes = %v, want [1 1]", closed)
	}
}
