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
