package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCopyFile(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("new content"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte("an older and longer content"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(src, link); err != nil {
		t.Fatal(err)
	}
	if err := CopyFile(link, dst, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(dst); err != nil || string(got) != "new content" {
		t.Fatalf("dst holds %q (%v), want the source's content, truncated", got, err)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := CopyFile(src, fresh, 0o750); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm()&0o700 != 0o700 {
		t.Fatalf("fresh file mode %v (%v), want the owner's bits of 0750", fi.Mode(), err)
	}
	if err := CopyFile(filepath.Join(dir, "missing"), dst, 0o600); !os.IsNotExist(err) {
		t.Fatalf("missing source: %v, want a not-exist error", err)
	}
}
