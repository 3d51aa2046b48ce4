package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"lukechampine.com/blake3"
)

func sampleAnnouncement(t testing.TB) Announcement {
	payload := randomBytes(1, 2*BlockSize+3)
	hs := BlockDigests(payload)
	a := Announcement{
		RunID: "run-7", Step: 42, Batch: BatchRange{Start: 1000, End: 1016},
		Trainer:    coordinator.ClientID{Signer: coordinator.Pubkey{9, 9, 9}},
		Commitment: Commitment(42, BatchRange{Start: 1000, End: 1016}, payload),
		Blob:       BlobRef{Size: uint64(len(payload)), Blocks: hs}, Nonce: 0x0102030405060708,
	}
	if err := a.Sign(testKey("wire")); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAnnouncementLayout checks the offset table in announcement.go.
func TestAnnouncementLayout(t *testing.T) {
	a := sampleAnnouncement(t)
	b, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	L, K := len(a.RunID), len(a.Blob.Blocks)
	le32, le64 := binary.LittleEndian.Uint32, binary.LittleEndian.Uint64
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"version", b[0] == 2},
		{"run id length", int(b[1]) == L},
		{"run id", string(b[2:2+L]) == a.RunID},
		{"step", le32(b[2+L:]) == a.Step},
		{"batch start", le64(b[6+L:]) == a.Batch.Start},
		{"batch end", le64(b[14+L:]) == a.Batch.End},
		{"signer", bytes.Equal(b[22+L:54+L], a.Trainer.Signer[:])},
		{"p2p key", bytes.Equal(b[54+L:86+L], a.Trainer.P2P[:])},
		{"commitment", bytes.Equal(b[86+L:118+L], a.Commitment[:])},
		{"size", le64(b[118+L:]) == a.Blob.Size},
		{"block count", int(binary.LittleEndian.Uint16(b[126+L:])) == K},
		{"last block", bytes.Equal(b[128+L+32*(K-1):128+L+32*K], a.Blob.Blocks[K-1][:])},
		{"nonce", le64(b[128+L+32*K:]) == a.Nonce},
		{"signature", bytes.Equal(b[136+L+32*K:], a.Signature[:])},
		{"length", len(b) == 136+L+32*K+ed25519.SignatureSize},
	} {
		if !c.ok {
			t.Errorf("%s is not where the table says", c.field)
		}
	}
}

func TestAnnouncementRoundTripAndTamper(t *testing.T) {
	a := sampleAnnouncement(t)
	b, _ := a.MarshalBinary()
	got, err := DecodeAnnouncement(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("round trip: got %+v", got)
	}
	if err := got.Verify(); err != nil {
		t.Fatal(err)
	}
	// Flipping any signed byte (past the structural ones) breaks the signature.
	for _, off := range []int{2, 10, 30, 60, 100, 140, len(b) - 70} {
		c := bytes.Clone(b)
		c[off] ^= 1
		d, err := DecodeAnnouncement(c)
		if err == nil {
			err = d.Verify()
		}
		if err == nil {
			t.Errorf("flipping byte %d went unnoticed", off)
		}
	}
	for name, c := range map[string][]byte{
		"truncated": b[:len(b)-1], "trailing": append(bytes.Clone(b), 0), "version 1 (sha2-256 block names)": append([]byte{1}, b[1:]...), "version 3": append([]byte{3}, b[1:]...),
	} {
		if _, err := DecodeAnnouncement(c); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := DecodeAnnouncement(make([]byte, MaxAnnouncementSize+1)); !errors.Is(err, ErrOversize) {
		t.Errorf("oversize: %v", err)
	}
}

func TestCommitmentBindsStepBatchPayload(t *testing.T) {
	base := Commitment(1, BatchRange{Start: 2, End: 3}, []byte("x"))
	for _, other := range []coordinator.Hash{
		Commitment(2, BatchRange{Start: 2, End: 3}, []byte("x")),
		Commitment(1, BatchRange{Start: 2, End: 4}, []byte("x")),
		Commitment(1, BatchRange{Start: 2, End: 3}, []byte("y")),
	} {
		if other == base {
			t.Error("commitment ignores a field")
		}
	}
}

func TestPullRoundTrip(t *testing.T) {
	req := PullRequest{RunID: "r", Step: 9}
	b, err := req.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodePullRequest(b); err != nil || got != req {
		t.Fatalf("request: %+v %v", got, err)
	}
	a := sampleAnnouncement(t)
	ab, _ := a.MarshalBinary()
	resp, err := EncodePullResponse([][]byte{ab, ab[:10]})
	if err != nil {
		t.Fatal(err)
	}
	items, err := DecodePullResponse(resp)
	if err != nil || len(items) != 2 || !bytes.Equal(items[0], ab) || !bytes.Equal(items[1], ab[:10]) {
		t.Fatalf("response: %d items, %v", len(items), err)
	}
}

func TestCheckpointManifestRoundTrip(t *testing.T) {
	hs := BlockDigests(randomBytes(3, BlockSize+1))
	m := CheckpointManifest{Tensors: []TensorEntry{
		{Name: "wte", DType: "F32", Shape: []uint64{256, 64}, Blob: BlobRef{Size: BlockSize + 1, Blocks: hs}},
		{Name: "empty", DType: "BF16", Blob: BlobRef{}},
	}}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCheckpointManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip: %+v", got)
	}
	if b[0] != 2 {
		t.Errorf("version byte %d, want 2", b[0])
	}
	if _, err := DecodeCheckpointManifest(append([]byte{1}, b[1:]...)); !errors.Is(err, ErrVersion) {
		t.Errorf("a version 1 manifest (sha2-256 block names): %v", err)
	}
	bad := m
	bad.Tensors = []TensorEntry{{Name: "x", Blob: BlobRef{Size: 5}}}
	if _, err := bad.MarshalBinary(); !errors.Is(err, ErrMalformed) {
		t.Errorf("block count mismatch: %v", err)
	}
}

// Fuzz targets: every decoder of outside bytes must not panic, and what it
// accepts must re-encode to the same bytes (one encoding per value).

func FuzzDecodeAnnouncement(f *testing.F) {
	a := sampleAnnouncement(f)
	b, _ := a.MarshalBinary()
	f.Add(b)
	empty := Announcement{RunID: "x"}
	eb, _ := empty.MarshalBinary()
	f.Add(eb)
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAnnouncement(b)
		if err != nil {
			return
		}
		_ = a.Verify()
		again, err := a.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

func FuzzDecodePullRequest(f *testing.F) {
	b, _ := PullRequest{RunID: "run", Step: 3}.MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodePullRequest(b)
		if err != nil {
			return
		}
		again, err := r.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

func FuzzDecodePullResponse(f *testing.F) {
	a := sampleAnnouncement(f)
	ab, _ := a.MarshalBinary()
	resp, _ := EncodePullResponse([][]byte{ab})
	f.Add(resp)
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		items, err := DecodePullResponse(b)
		if err != nil {
			return
		}
		again, err := EncodePullResponse(items)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

func FuzzDecodeCheckpointManifest(f *testing.F) {
	hs := BlockDigests(randomBytes(3, BlockSize+1))
	m := CheckpointManifest{Tensors: []TensorEntry{{Name: "wte", DType: "F32", Shape: []uint64{2, 3},
		Blob: BlobRef{Size: BlockSize + 1, Blocks: hs}}}}
	b, _ := m.MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeCheckpointManifest(b)
		if err != nil {
			return
		}
		again, err := m.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

// BenchmarkValidateAnnouncement is the validator's per-message cost (decode
// and ed25519 verify), paid inline by every node for every message.
func BenchmarkValidateAnnouncement(b *testing.B) {
	a := sampleAnnouncement(b)
	raw, _ := a.MarshalBinary()
	b.ReportAllocs()
	for b.Loop() {
		d, err := DecodeAnnouncement(raw)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Verify(); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzDecodeOffer(f *testing.F) {
	f.Add(EncodeOffer(coordinator.Hash{1, 2, 3}, true))
	f.Add(EncodeOffer(coordinator.Hash{}, false))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok, err := DecodeOffer(b)
		if err != nil {
			return
		}
		if again := EncodeOffer(id, ok); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}

// randomBytes is n reproducible bytes from seed.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint64())
	}
	return b
}

// testKey is a reproducible ed25519 key.
func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("psyche p2p test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// An announcement is refused before anything is fetched when it lists a
// block twice (a large declared size backed by one block) or declares more
// bytes than the run's results can have.
func TestAnnouncementBounds(t *testing.T) {
	a := sampleAnnouncement(t)
	if err := a.Check(); err != nil {
		t.Fatalf("honest: %v", err)
	}
	rep := a
	rep.Blob.Blocks = []coordinator.Hash{a.Blob.Blocks[0], a.Blob.Blocks[0], a.Blob.Blocks[2]}
	if err := rep.Check(); !errors.Is(err, ErrMalformed) {
		t.Errorf("a repeated block: %v, want ErrMalformed", err)
	}
	for _, tc := range []struct {
		max  int64
		want error
	}{{0, nil}, {int64(a.Blob.Size), nil}, {int64(a.Blob.Size) - 1, ErrOversize}, {1000, ErrOversize}} {
		if err := a.CheckSize(tc.max); !errors.Is(err, tc.want) {
			t.Errorf("CheckSize(%d) = %v, want %v", tc.max, err, tc.want)
		}
	}
	for i, want := range []int{BlockSize, BlockSize, 3} {
		if got := BlockLen(a.Blob.Size, i); got != want {
			t.Errorf("BlockLen(%d, %d) = %d, want %d", a.Blob.Size, i, got, want)
		}
	}
}

// A malformed announcement its trainer signed is evidence (its result for
// the batch is refused); one that is unsigned, signed by another key, cut
// short or well formed is not.
func TestSignedMalformedIsEvidence(t *testing.T) {
	key := testKey("wire")
	encode := func(a Announcement, signer ed25519.PrivateKey) []byte {
		copy(a.Trainer.P2P[:], key.Public().(ed25519.PublicKey))
		copy(a.Signature[:], ed25519.Sign(signer, signingMessage(a.signedBytes())))
		return append(a.signedBytes(), a.Signature[:]...)
	}
	honest := sampleAnnouncement(t)
	repeated := honest
	repeated.Blob.Blocks = []coordinator.Hash{honest.Blob.Blocks[0], honest.Blob.Blocks[0], honest.Blob.Blocks[0]}
	miscounted := honest
	miscounted.Blob.Size = 100 * BlockSize
	good, err := honest.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		b        []byte
		evidence bool
	}{
		{"a block listed three times, signed", encode(repeated, key), true},
		{"a size its blocks cannot hold, signed", encode(miscounted, key), true},
		{"a block listed three times, signed by another key", encode(repeated, testKey("other")), false},
		{"cut short", encode(repeated, key)[:200], false},
		{"well formed", good, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeAnnouncement(tc.b); err == nil && tc.evidence {
				t.Fatal("DecodeAnnouncement accepted it")
			}
			a, err := DecodeMalformed(tc.b)
			if tc.evidence != (err == nil) {
				t.Fatalf("DecodeMalformed: %v, want evidence %v", err, tc.evidence)
			}
			if tc.evidence && (a.Step != honest.Step || a.Batch != honest.Batch || a.Trainer.P2P != honest.Trainer.P2P || !a.SignedMalformed()) {
				t.Errorf("decoded %+v", a)
			}
		})
	}
}

func sampleBlobRequest() BlobRequest {
	payload := randomBytes(4, 2*BlockSize+3)
	return WantsOf(BlobRef{Size: uint64(len(payload)), Blocks: BlockDigests(payload)}, []int{2, 0})
}

// TestBlobRequestLayout checks the offset table in blob_protocol.go.
func TestBlobRequestLayout(t *testing.T) {
	r := sampleBlobRequest()
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	le16, le32 := binary.LittleEndian.Uint16, binary.LittleEndian.Uint32
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"version", b[0] == 1},
		{"count", le16(b[1:]) == 2},
		{"first digest", bytes.Equal(b[3:35], r.Blocks[0].Hash[:])},
		{"first length", le32(b[35:]) == 3},
		{"second digest", bytes.Equal(b[39:71], r.Blocks[1].Hash[:])},
		{"second length", le32(b[71:]) == BlockSize},
		{"length", len(b) == 3+2*36},
	} {
		if !c.ok {
			t.Errorf("%s is not where the table says", c.field)
		}
	}
	if MaxBlobRequestSize != 3+36*MaxBlobBlocks {
		t.Errorf("MaxBlobRequestSize %d", MaxBlobRequestSize)
	}
}

// A request the encoder refuses is one the decoder refuses: no blocks,
// too many, an empty or oversized block.
func TestBlobRequestBounds(t *testing.T) {
	for _, r := range []BlobRequest{
		{},
		{Blocks: make([]BlockWant, MaxBlobBlocks+1)},
		{Blocks: []BlockWant{{Len: 0}}},
		{Blocks: []BlockWant{{Len: BlockSize + 1}}},
	} {
		for i := range r.Blocks {
			if r.Blocks[i].Len == 0 && len(r.Blocks) > 1 {
				r.Blocks[i].Len = 1
			}
		}
		if _, err := r.MarshalBinary(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%d blocks: encoded (%v)", len(r.Blocks), err)
		}
		b := []byte{1}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Blocks)))
		for _, w := range r.Blocks {
			b = append(b, w.Hash[:]...)
			b = binary.LittleEndian.AppendUint32(b, w.Len)
		}
		if _, err := DecodeBlobRequest(b); err == nil {
			t.Errorf("%d blocks: decoded", len(r.Blocks))
		}
	}
	full := BlobRequest{Blocks: make([]BlockWant, MaxBlobBlocks)}
	for i := range full.Blocks {
		full.Blocks[i].Len = BlockSize
	}
	b, err := full.MarshalBinary()
	if err != nil || len(b) != MaxBlobRequestSize {
		t.Fatalf("the largest request: %d bytes, %v", len(b), err)
	}
	if _, err := DecodeBlobRequest(append(b, 0)); !errors.Is(err, ErrOversize) {
		t.Errorf("one byte over the largest request: %v", err)
	}
}

// Every frame a responder writes reads back as what it held, and a block
// with one wrong byte fails VerifyBlock.
func TestBlobResponseRoundTrip(t *testing.T) {
	payload := randomBytes(5, BlockSize+10)
	ref := BlobRef{Size: uint64(len(payload)), Blocks: BlockDigests(payload)}
	req := WantsOf(ref, []int{0, 1})
	var buf bytes.Buffer
	if err := WriteBlobBlock(&buf, nil); err != nil { // block 0 not held
		t.Fatal(err)
	}
	if err := WriteBlobBlock(&buf, payload[BlockSize:]); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, BlockSize)
	if held, err := ReadBlobBlock(&buf, req.Blocks[0], dst); held || err != nil {
		t.Fatalf("not held: %v %v", held, err)
	}
	held, err := ReadBlobBlock(&buf, req.Blocks[1], dst)
	if !held || err != nil {
		t.Fatalf("held: %v %v", held, err)
	}
	if err := VerifyBlock(req.Blocks[1], dst[:10]); err != nil {
		t.Fatal(err)
	}
	dst[3] ^= 1
	if err := VerifyBlock(req.Blocks[1], dst[:10]); !errors.Is(err, ErrBlockMismatch) {
		t.Fatalf("a wrong byte: %v", err)
	}
	if err := VerifyBlock(req.Blocks[1], payload[BlockSize:BlockSize+9]); !errors.Is(err, ErrBlockMismatch) {
		t.Fatalf("a short block: %v", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("%d bytes left unread", buf.Len())
	}
}

func FuzzDecodeBlobRequest(f *testing.F) {
	b, _ := sampleBlobRequest().MarshalBinary()
	f.Add(b)
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeBlobRequest(b)
		if err != nil {
			return
		}
		if len(r.Blocks) > MaxBlobBlocks {
			t.Fatalf("%d blocks", len(r.Blocks))
		}
		again, err := r.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

// FuzzReadBlobResponse feeds responder bytes to a fetcher that asked for a
// blob's blocks at the production block size: it must not read past the
// lengths it asked for, and a block it accepts must be the real one.
func FuzzReadBlobResponse(f *testing.F) {
	payload := randomBytes(6, BlockSize+7)
	ref := BlobRef{Size: uint64(len(payload)), Blocks: BlockDigests(payload)}
	req := WantsOf(ref, []int{1, 0})
	var good bytes.Buffer
	_ = WriteBlobBlock(&good, payload[BlockSize:])
	_ = WriteBlobBlock(&good, nil)
	f.Add(good.Bytes())
	f.Add([]byte{1, 1, 2, 3})
	f.Add([]byte{2})
	dst := make([]byte, BlockSize)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		read := 0
		for i, w := range req.Blocks {
			held, err := ReadBlobBlock(r, w, dst)
			if err != nil {
				return
			}
			read++
			if held {
				read += int(w.Len)
				if VerifyBlock(w, dst[:w.Len]) == nil {
					want := payload[BlockSize:]
					if i == 1 {
						want = payload[:BlockSize]
					}
					if !bytes.Equal(dst[:w.Len], want) {
						t.Fatal("accepted a block that is not the real one")
					}
				}
			}
			if consumed := len(b) - r.Len(); consumed != read {
				t.Fatalf("consumed %d bytes, the frames account for %d", consumed, read)
			}
		}
	})
}

// The commitment of a payload is the commitment of its block list, and it
// changes with every field it covers.
func TestCommitmentCoversTheBlockList(t *testing.T) {
	payload := randomBytes(7, 2*BlockSize+1)
	ref := BlobRef{Size: uint64(len(payload)), Blocks: BlockDigests(payload)}
	batch := BatchRange{Start: 4, End: 8}
	c := Commitment(3, batch, payload)
	if CommitmentOf(3, batch, ref) != c {
		t.Fatal("Commitment and CommitmentOf disagree")
	}
	other := bytes.Clone(payload)
	other[len(other)-1] ^= 1
	shorter := BlobRef{Size: ref.Size - 1, Blocks: ref.Blocks}
	swapped := BlobRef{Size: ref.Size, Blocks: []coordinator.Hash{ref.Blocks[1], ref.Blocks[0], ref.Blocks[2]}}
	for name, d := range map[string]coordinator.Hash{
		"step":    Commitment(4, batch, payload),
		"batch":   Commitment(3, BatchRange{Start: 4, End: 9}, payload),
		"payload": Commitment(3, batch, other),
		"size":    CommitmentOf(3, batch, shorter),
		"order":   CommitmentOf(3, batch, swapped),
	} {
		if d == c {
			t.Errorf("a different %s, the same commitment", name)
		}
	}
}

// BlockDigest is BLAKE3 as its specification defines it: the published
// test vectors (input byte i is i mod 251) pin the hash, so that a change of
// library or a wrong mode (keyed, derive-key) cannot pass unnoticed.
func TestBlockDigestIsBLAKE3(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{
		{0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
		{1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
		{1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
	} {
		in := make([]byte, c.n)
		for i := range in {
			in[i] = byte(i % 251)
		}
		got := BlockDigest(in)
		if hex.EncodeToString(got[:]) != c.want {
			t.Errorf("%d bytes: %x, want %s", c.n, got, c.want)
		}
	}
	// The tree walk agrees with the library's own hash at every shape: one
	// chunk, partial SIMD groups, uneven right subtrees, a whole block.
	for _, n := range []int{1023, 1024 + 1, 16 << 10, 16<<10 + 1, 17 << 10, 31<<10 + 5, 64 << 10, 100_000, 555_555, BlockSize - 1, BlockSize} {
		in := randomBytes(uint64(n), n)
		if got, want := BlockDigest(in), blake3.Sum256(in); got != want {
			t.Errorf("%d bytes: %x, the library's Sum256 %x", n, got, want)
		}
	}
	// BlockDigests cuts at BlockSize and names each piece alone.
	data := randomBytes(9, 2*BlockSize+7)
	hs := BlockDigests(data)
	if len(hs) != 3 || hs[0] != BlockDigest(data[:BlockSize]) || hs[2] != BlockDigest(data[2*BlockSize:]) {
		t.Errorf("BlockDigests: %d digests, not the blocks'", len(hs))
	}
}
