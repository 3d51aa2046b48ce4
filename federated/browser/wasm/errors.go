//go:build js && wasm

package main

import "errors"

var errKeySeed = errors.New("the key seed must be 32 bytes")
