package torch

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/psyche-go/psyche/internal/f32le"
)

// The worker protocol. psyche writes requests to the worker's fd 3 and
// reads answers from its fd 4 (its stdout and stderr stay free for what
// torch and the worker print). Each message, either way, is
//
//	u32 little-endian: the length of the header
//	the header: a JSON object; "blobs" lists the byte length of each blob
//	the blobs, back to back
//
// A request's header names its "op"; an answer's says "ok", and when not
// ok an "error" and its "kind" (errorKind). Numbers in blobs are
// little-endian: tokens and indices uint32, values and losses float32. The
// worker's side of this format is worker/protocol.py; the values both
// sides share are in worker/protocol.json (protocol.go).

// Limits on what psyche reads from a worker: a header is small, and no blob
// is larger than the largest tensor the protocol carries (a model's
// parameters cross one tensor per blob).
const (
	maxHeaderBytes = 1 << 20
	maxBlobBytes   = 1 << 36
)

// tensorBlobs are float32 blobs read a chunk at a time as they are
// written: sizes[i] values of tensor i, read by read (a model's weights go
// to the worker without a copy of them in bytes, or in this process at
// all when they are read from elsewhere).
type tensorBlobs struct {
	sizes []int
	read  func(i, off int, dst []float32) error
}

// sliceBlobs are tensors held in slices, as tensorBlobs.
func sliceBlobs(ts [][]float32) tensorBlobs {
	sizes := make([]int, len(ts))
	for i, t := range ts {
		sizes[i] = len(t)
	}
	return tensorBlobs{sizes: sizes, read: func(i, off int, dst []float32) error {
		copy(dst, ts[i][off:])
		return nil
	}}
}

// readCtx is read with a context: the tensors as weights.Weights reads
// them.
func (t tensorBlobs) readCtx(_ context.Context, i, off int, dst []float32) error {
	return t.read(i, off, dst)
}

// writeMessage writes one message: the request (its blobs' lengths set
// here), blobs, then tensors as float32 blobs, each read and encoded a
// chunk at a time as it is written. A failed read leaves the message cut
// short: the caller ends the worker, as after any failed write.
func writeMessage(w io.Writer, r request, blobs [][]byte, tensors tensorBlobs) error {
	lens := make([]int, 0, len(blobs)+len(tensors.sizes))
	for _, b := range blobs {
		lens = append(lens, len(b))
	}
	for _, n := range tensors.sizes {
		lens = append(lens, 4*n)
	}
	r.header().Blobs = lens
	js, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, b := range blobs {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	var values []float32
	var buf []byte
	for i, size := range tensors.sizes {
		for off := 0; off < size; {
			k := min(size-off, tensorChunk)
			if cap(values) < k {
				values = make([]float32, tensorChunk)
			}
			if err := tensors.read(i, off, values[:k]); err != nil {
				return fmt.Errorf("torch: reading tensor %d for the worker: %w", i, err)
			}
			buf = f32le.Append(buf[:0], values[:k])
			if _, err := w.Write(buf); err != nil {
				return err
			}
			off += k
		}
	}
	return nil
}

// tensorChunk is how many values of a tensor writeMessage reads and
// encodes at a time: a quarter of a mebibyte, large enough that a write is
// not a system call per value, small enough to be nothing beside a model.
const tensorChunk = 1 << 16

// answer is a decoded answer: its header fields and blobs.
type answer struct {
	OK    bool      `json:"ok"`
	Error string    `json:"error"`
	Kind  errorKind `json:"kind"`
	Blobs []int64   `json:"blobs"`
	// Progress, in a message of its own (no answer), is how many
	// collectives each rank of a multi-device worker has entered.
	Progress []uint64        `json:"progress"`
	Raw      json.RawMessage `json:"-"`
	blobs    [][]byte
}

// readMessage reads one answer, within the limits above.
func readMessage(r io.Reader) (*answer, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxHeaderBytes {
		return nil, fmt.Errorf("torch: a worker header of %d bytes (at most %d)", size, maxHeaderBytes)
	}
	js := make([]byte, size)
	if _, err := io.ReadFull(r, js); err != nil {
		return nil, noEOF(err)
	}
	a := &answer{Raw: js}
	if err := json.Unmarshal(js, a); err != nil {
		return nil, fmt.Errorf("torch: a worker header that is not JSON: %w", err)
	}
	for _, l := range a.Blobs {
		if l < 0 || l > maxBlobBytes {
			return nil, fmt.Errorf("torch: a worker blob of %d bytes", l)
		}
		b := make([]byte, l)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, noEOF(err)
		}
		a.blobs = append(a.blobs, b)
	}
	return a, nil
}

// noEOF turns an end of stream within a message into an unexpected one.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// fields decodes the answer's header into v.
func (a *answer) fields(v any) error { return json.Unmarshal(a.Raw, v) }

func u32Bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

func f32Bytes(v []float32) []byte { return f32le.Append(nil, v) }

// f32Into decodes b into dst, which must have exactly its length.
func f32Into(dst []float32, b []byte) error {
	if len(b) != 4*len(dst) {
		return fmt.Errorf("torch: %d bytes for %d float32 values", len(b), len(dst))
	}
	f32le.Decode(dst, b)
	return nil
}

func f32s(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("torch: %d bytes is not a float32 array", len(b))
	}
	v := make([]float32, len(b)/4)
	return v, f32Into(v, b)
}

func u32s(b []byte) ([]uint32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("torch: %d bytes is not a uint32 array", len(b))
	}
	v := make([]uint32, len(b)/4)
	for i := range v {
		v[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return v, nil
}
