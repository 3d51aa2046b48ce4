package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"testing"

	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
)

// A client of the events stream takes deltas: every snapshot it gets is
// the server's state at that change, and the stream carries a fraction of
// the whole accounts.
func TestEventDeltas(t *testing.T) {
	m := NewMetrics(nil)
	s, hs := serveHTTP(t, WithMetrics(m), WithManualTicks())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := backendtest.Key("admin")
	id, _ := coordinator.ParseRunID("deltas")
	g := newSigner(t, s)
	if _, f, _ := s.Execute(g.sign("deltas", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}, admin, nil)); f != nil {
		t.Fatal(f.Error)
	}
	stream, err := serverclient.New(hs.URL, nil).Subscribe(ctx, "deltas")
	if err != nil {
		t.Fatal(err)
	}
	first := <-stream
	const changes = 20
	for i := range changes {
		var md coordinator.Metadata
		copy(md.Name[:], "change ")
		md.NumParameters = uint64(i)
		if _, f, _ := s.Execute(g.sign("deltas", uint64(2+i), &coordinator.Update{Metadata: &md}, admin, nil)); f != nil {
			t.Fatal(f.Error)
		}
		// The stream keeps the newest pending change: wait for this one.
		for {
			snap := <-stream
			if snap.State.Metadata.NumParameters == uint64(i) && snap.State.Nonce > first.State.Nonce {
				want, _ := s.Account("deltas")
				if !bytes.Equal(snap.State.MarshalAccount(), want) {
					t.Fatalf("change %d: the snapshot is not the server's state", i)
				}
				break
			}
		}
	}
	whole := float64(base64.StdEncoding.EncodedLen(coordinator.AccountSize))
	if got := promread.Value(m.EventBytes); got > whole+changes*whole/20 {
		t.Errorf("the stream wrote %.0f bytes for a whole account and %d changes; whole accounts alone are %.0f bytes each", got, changes, whole)
	}
}
