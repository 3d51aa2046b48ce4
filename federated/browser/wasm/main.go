//go:build js && wasm

// Command wasm is the browser trainer's WebAssembly module (GOOS=js
// GOARCH=wasm; psyche server builds it from the checkout at start, and go
// generate ./federated/browser/web builds it into the
// page's files). It runs in the page's worker, which defines psycheEmit
// (an event, as JSON, for the page) before starting it; the module then
// defines psycheStart(config JSON, text bytes, key seed), psycheCheck(file
// name, bytes), psycheAddress(key seed) and psycheBench(config JSON, text
// bytes, steps), and emits {"kind":"loaded"}.
// Training blocks the worker, never the page; the page stops a client by
// ending its worker (to the server, a closed tab and a stopped client are
// the same dropout).
package main

import (
	"context"
	"encoding/json"
	"syscall/js"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/federated/browser"
	"github.com/psyche-go/psyche/federated/fedclient"
)

func emit(ev browser.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		b, _ = json.Marshal(browser.Event{Kind: "error", Error: err.Error()})
	}
	js.Global().Call("psycheEmit", string(b))
}

func fail(err error) { emit(browser.Event{Kind: "error", Error: err.Error()}) }

// args reads the config JSON and the bytes of a Uint8Array.
func args(a []js.Value) (browser.Config, []byte, error) {
	var cfg browser.Config
	if err := json.Unmarshal([]byte(a[0].String()), &cfg); err != nil {
		return cfg, nil, err
	}
	text := make([]byte, a[1].Get("length").Int())
	js.CopyBytesToGo(text, a[1])
	return cfg, text, nil
}

func main() {
	js.Global().Set("psycheStart", js.FuncOf(func(_ js.Value, a []js.Value) any {
		cfg, text, err := args(a)
		if err == nil && a[2].Get("length").Int() != len(cfg.Seed) {
			err = errKeySeed
		}
		if err != nil {
			fail(err)
			return nil
		}
		js.CopyBytesToGo(cfg.Seed[:], a[2])
		go func() {
			if err := browser.Run(context.Background(), cfg, text, emit); err != nil {
				fail(err)
			}
		}()
		return nil
	}))
	js.Global().Set("psycheBench", js.FuncOf(func(_ js.Value, a []js.Value) any {
		cfg, text, err := args(a)
		if err != nil {
			fail(err)
			return nil
		}
		steps := a[2].Int()
		go func() {
			tps, err := browser.Bench(context.Background(), cfg, text, steps)
			if err != nil {
				fail(err)
				return
			}
			emit(browser.Event{Kind: "bench", TokensPerSec: tps})
		}()
		return nil
	}))
	js.Global().Set("psycheCheck", js.FuncOf(func(_ js.Value, a []js.Value) any {
		text := make([]byte, a[1].Get("length").Int())
		js.CopyBytesToGo(text, a[1])
		ev := browser.Event{Kind: "checked"}
		if err := fedclient.CheckText(a[0].String(), text); err != nil {
			ev.Error = err.Error()
		}
		emit(ev)
		return nil
	}))
	js.Global().Set("psycheAddress", js.FuncOf(func(_ js.Value, a []js.Value) any {
		var seed [32]byte
		if a[0].Get("length").Int() != len(seed) {
			fail(errKeySeed)
			return nil
		}
		js.CopyBytesToGo(seed[:], a[0])
		emit(browser.Event{Kind: "address", Address: chain.KeypairFromSeed(seed).Public().String()})
		return nil
	}))
	emit(browser.Event{Kind: "loaded"})
	select {}
}
