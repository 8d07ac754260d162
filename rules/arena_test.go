package rules

import (
	"strconv"
	"strings"
	"testing"
)

// TestStringArena: copies equal their source, share no memory with it,
// and stay unchanged while later copies fill and replace the blocks.
func TestStringArena(t *testing.T) {
	var a StringArena
	src := []byte("ns:user:42")
	first := a.Copy(src)
	src[0] = 'X'
	if first != "ns:user:42" {
		t.Fatalf("copy changed with its source: %q", first)
	}
	var kept []string
	for i := range 5000 {
		kept = append(kept, a.CopyString("key:"+strconv.Itoa(i)))
	}
	big := strings.Repeat("b", arenaChunk)
	if got := a.CopyString(big); got != big {
		t.Fatal("large copy differs")
	}
	for i, s := range kept {
		if s != "key:"+strconv.Itoa(i) {
			t.Fatalf("copy %d became %q", i, s)
		}
	}
	if first != "ns:user:42" || a.Copy(nil) != "" {
		t.Fatal("first copy changed, or empty copy not empty")
	}
}
