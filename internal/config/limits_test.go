package config

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestHugeFilesAreRefusedCheaply: a file over the size cap is refused before it is parsed,
// naming the cap; a file within it but full of entries (a million unknown keys, a flow list of
// one-byte items) is refused before a node tree is built; a file of many problems lists the
// first MaxProblems and counts the rest. Memory stays far below a sidecar's limit.
func TestHugeFilesAreRefusedCheaply(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(strings.Repeat("k: 1\n", (MaxFileBytes/5)+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), fmt.Sprint(MaxFileBytes)) {
		t.Fatalf("a file over the cap: %v, want an error naming the %d-byte limit", err, MaxFileBytes)
	}

	var b strings.Builder
	for i := 0; b.Len() < MaxFileBytes-64; i++ {
		fmt.Fprintf(&b, "k%d: 1\n", i)
	}
	unknown := b.String()
	flow := "x: [" + strings.Repeat("1,", MaxFileBytes/2-8) + "]\n"
	for name, data := range map[string]string{"unknown keys": unknown, "flow list": flow} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Parse([]byte(data))
		runtime.ReadMemStats(&after)
		if err == nil || len(err.Error()) > 4096 {
			t.Errorf("%s: error of %d bytes, want a short refusal", name, len(fmt.Sprint(err)))
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
			t.Errorf("%s: %d MiB allocated to refuse it, want under 16", name, alloc>>20)
		}
	}

	// Within the entry bound, many problems: the first MaxProblems are listed, the rest counted.
	b.Reset()
	b.WriteString("upstream: http://127.0.0.1:1\n")
	for i := range 500 {
		fmt.Fprintf(&b, "unknown%d: 1\n", i)
	}
	_, err := Parse([]byte(b.String()))
	p, ok := err.(*Problems)
	if !ok || len(p.List) != MaxProblems || p.Omitted != 500-MaxProblems || !strings.Contains(err.Error(), fmt.Sprintf("and %d more problems", 500-MaxProblems)) {
		t.Fatalf("500 unknown keys: %d listed, %d omitted (%v)", len(p.List), p.Omitted, err)
	}
}
