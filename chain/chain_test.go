package chain

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeypairFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "id.json")
	k, err := NewKeypair()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Save(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if err := k.Save(context.Background(), path); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("saving over a key file: %v, want ErrKeyExists", err)
	}
	other, _ := NewKeypair()
	if err := other.Replace(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadKeypair(path); err != nil || got.Public() != other.Public() {
		t.Fatalf("after Replace: %v", err)
	}
	if err := k.Replace(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode().Perm())
	}
	got, err := LoadKeypair(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Public() != k.Public() || !Verify(k.Public(), []byte("m"), got.Sign([]byte("m"))) {
		t.Fatal("loaded key differs")
	}
	for name, content := range map[string]string{
		"short":    "[1,2,3]",
		"not json": "hello",
		"range":    "[" + strings.Repeat("300,", 63) + "1]",
		"mismatch": "[" + strings.Repeat("1,", 63) + "1]",
	} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(content), 0o600)
		if _, err := LoadKeypair(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
