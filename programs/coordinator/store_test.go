package coordinator_test

import (
	"strings"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
)

// TestStoreRules applies the checkpoint store's rules (CheckpointStore in the
// Go coordinator, store_valid in the C program) to the same updates: both
// must accept and refuse alike, and the Go side must name the rule.
func TestStoreRules(t *testing.T) {
	w := newWorld(t)
	admin := key("admin")
	var runID [coord.MaxRunIDLen]byte
	copy(runID[:], "run-store")
	w.do(0, &coord.InitCoordinator{MainAuthority: admin, RunID: runID}, ctxOf(admin))
	k := testConfig()
	for _, tc := range []struct {
		name, url, endpoint, region string
		refusal                     string // "" to accept; else a part of the Go error
	}{
		{"none", "", "", "", ""},
		{"bucket", "s3://psyche-ckpt", "", "", ""},
		{"prefix", "s3://psyche-ckpt/runs/a.b-c_d", "https://s3.us-east-1.amazonaws.com", "us-east-1", ""},
		{"R2", "s3://ckpt", "https://0123456789abcdef0123456789abcdef.r2.cloudflarestorage.com", "auto", ""},
		{"MinIO over http", "s3://ckpt.local/x", "http://10.0.0.1:9000", "", ""},
		{"bucket with dots and dashes", "s3://a.b-c", "", "", ""},
		{"64 bytes", "s3://" + strings.Repeat("b", 59), "", "", ""},
		{"endpoint without url", "", "http://127.0.0.1:9000", "", "need a store url"},
		{"region without url", "", "", "us-east-1", "need a store url"},
		{"not s3", "https://bucket/prefix", "", "", "must start with s3://"},
		{"short bucket", "s3://ab", "", "", "bucket"},
		{"upper-case bucket", "s3://Bucket", "", "", "bucket"},
		{"bucket ends with a dash", "s3://bucket-/p", "", "", "bucket"},
		{"bucket starts with a dot", "s3://.bucket", "", "", "bucket"},
		{"empty prefix", "s3://bucket/", "", "", "prefix"},
		{"trailing slash", "s3://bucket/a/", "", "", "prefix"},
		{"empty part", "s3://bucket/a//b", "", "", "prefix"},
		{"space in prefix", "s3://bucket/a b", "", "", "prefix"},
		{"endpoint scheme", "s3://bucket", "ftp://host", "", "http:// or https://"},
		{"endpoint without host", "s3://bucket", "https://", "", "host"},
		{"endpoint with a space", "s3://bucket", "https://a b", "", "host"},
		{"region case", "s3://bucket", "", "US-EAST-1", "region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testModel()
			for _, f := range []struct {
				dst []byte
				s   string
			}{{m.Store.URL[:], tc.url}, {m.Store.Endpoint[:], tc.endpoint}, {m.Store.Region[:], tc.region}} {
				if err := coord.SetFixedString(f.dst, f.s); err != nil {
					t.Fatal(err)
				}
			}
			err := m.Validate()
			if tc.refusal == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.refusal) {
				t.Fatalf("Validate: %v, want an error saying %q", err, tc.refusal)
			}
			want := uint32(0)
			if tc.refusal != "" {
				want = coord.ErrInvalidModel.Code
			}
			// probe runs both implementations and fails on any difference.
			got := w.probe(tc.name, w.acct, coord.EncodeInstruction(&coord.Update{Config: &k, Model: &m}), ctxOf(admin))
			if got != want {
				t.Fatalf("update: code %s, want %s", codeName(got), codeName(want))
			}
		})
	}
	// Padding after the text is refused too (not canonical).
	m := testModel()
	copy(m.Store.URL[:], "s3://bucket")
	m.Store.URL[20] = 'x'
	if got := w.probe("padding", w.acct, coord.EncodeInstruction(&coord.Update{Config: &k, Model: &m}), ctxOf(admin)); got != coord.ErrInvalidModel.Code {
		t.Fatalf("non-zero padding: code %s", codeName(got))
	}
}
