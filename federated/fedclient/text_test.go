package fedclient_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/trainer/data"
)

func TestCheckText(t *testing.T) {
	opticks := data.Opticks()
	for _, tc := range []struct {
		name string
		text []byte
		want error
	}{
		{"plain text", []byte("light is refracted\tand reflected\r\n"), nil},
		{"a slice of a larger UTF-8 file, cut inside characters at both ends", []byte("é—ü")[1:6], nil},
		{"the bundled corpus", opticks[:60000], nil},
		{"a NUL byte", []byte("text\x00more"), fedclient.ErrNotText},
		{"Latin-1, not UTF-8, in the middle", []byte("caf\xe9 au lait, et une phrase assez longue"), fedclient.ErrNotText},
		{"mostly control characters", []byte(strings.Repeat("a\x01", 50)), fedclient.ErrNotText},
		{"a few control characters among text", []byte(strings.Repeat("abcdefghij", 100) + "\x1b[0m"), nil},
		{"a PNG header", []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), fedclient.ErrNotText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fedclient.CheckText("f.txt", tc.text)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("CheckText = %v, want %v", err, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), "f.txt") {
				t.Fatalf("the error does not name the file: %v", err)
			}
		})
	}
}

// FuzzCheckText feeds local data as a person might pick it: whatever
// CheckText takes, NewLocalData splits without panicking.
func FuzzCheckText(f *testing.F) {
	f.Add([]byte("some text\n"))
	f.Add([]byte("\xff\xfe\x00t\x00e\x00x\x00t"))
	f.Add(data.Opticks()[:200])
	f.Fuzz(func(t *testing.T, b []byte) {
		if fedclient.CheckText("f", b) != nil {
			return
		}
		d, err := fedclient.NewLocalData("f", b, 4)
		if err == nil && (len(d.Train) < 5 || len(d.Heldout) < 5) {
			t.Fatalf("took %d train and %d held-out tokens", len(d.Train), len(d.Heldout))
		}
	})
}
