package itemformat

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckKey: the keys memcached takes as one token, and no other.
func TestCheckKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{strings.Repeat("k", 250), true},
		{"caf\xc3\xa9:%20", true},
		{"", false},
		{strings.Repeat("k", 251), false},
		{"a b", false},
		{"a\x00", false},
		{"a\x7f", false},
		{"a\r\n", false},
	} {
		if err := CheckKey(tc.key); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidKey)) {
			t.Errorf("CheckKey(%q) = %v", tc.key, err)
		}
	}
}

// TestHasKeySeparator: every byte value at every position of a word and
// of the tail is judged as isSetTokenSeparator judges it alone, and
// beside others (a borrow from one byte must not hide or invent another).
func TestHasKeySeparator(t *testing.T) {
	for n := 1; n <= 19; n++ {
		for pos := range n {
			for c := 0; c < 256; c++ {
				for _, fill := range []byte{'k', 0x80, 0xff, 0x21} {
					var b []byte
					for range n {
						b = append(b, fill)
					}
					b[pos] = byte(c)
					want := isSetTokenSeparator(byte(c))
					if got := hasKeySeparator(string(b)); got != want {
						t.Fatalf("hasKeySeparator(%q) = %v, want %v", b, got, want)
					}
				}
			}
		}
	}
}

func FuzzCheckKey(f *testing.F) {
	f.Add("ns:user:42")
	f.Add("a\x7fb")
	f.Fuzz(func(t *testing.T, key string) {
		want := key != "" && len(key) <= 250
		for i := 0; i < len(key); i++ {
			if key[i] <= ' ' || key[i] == 0x7f {
				want = false
			}
		}
		if err := CheckKey(key); (err == nil) != want {
			t.Fatalf("CheckKey(%q) = %v, want ok %v", key, err, want)
		}
	})
}

func BenchmarkCheckKey(b *testing.B) {
	key := "bench:ns:user:1234567"
	for b.Loop() {
		if CheckKey(key) != nil {
			b.Fatal("rejected")
		}
	}
}
