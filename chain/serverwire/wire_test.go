package serverwire

import (
	"testing"

	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/coordinator"
)

func FuzzDecodeRequest(f *testing.F) {
	admin := backendtest.Key("admin")
	id, _ := coordinator.ParseRunID("fuzz")
	bind := Binding{Server: [32]byte{1, 2, 3}, Incarnation: 2}
	for _, ix := range []coordinator.Instruction{&coordinator.Tick{}, &coordinator.SetPaused{Paused: true}} {
		b, _ := EncodeRequest(bind, id, 7, coordinator.EncodeInstruction(ix), admin, nil)
		f.Add(b)
		b2, _ := EncodeRequest(bind, id, 8, coordinator.EncodeInstruction(ix), admin, backendtest.Key("gate"))
		f.Add(b2)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			return
		}
		sigs := int(data[5]) // DecodeRequest accepted it, so it is 1 or 2
		if len(r.Data) > MaxInstruction || len(data) != HeaderSize+len(r.Data)+sigs*sigSize {
			t.Fatalf("accepted %d bytes carrying %d instruction bytes and %d signatures", len(data), len(r.Data), sigs)
		}
	})
}
