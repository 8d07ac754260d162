package cacheops

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// TestTokenLog appends to a missing log (created by add), removes members
// by appending, reads the members (which compacts), and fills a log up to
// memcached's item size: the append compacts first, and fails with
// ErrTooLarge only when the live members alone do not fit; a removal from
// a log full of live members goes through.
func TestTokenLog(t *testing.T) {
	e := newWTEnv(t)
	l := NewTokenLog(e.mc, nil)
	key := e.key("log")
	for _, tokens := range []string{"+a +b ", "+c -a ", "-c "} {
		if err := l.Append(key, []byte(tokens)); err != nil {
			t.Fatalf("Append(%q): %v", tokens, err)
		}
	}
	if v, _ := e.value(t, key); v != "+a +b +c -a -c " {
		t.Fatalf("log = %q", v)
	}
	got, err := l.Members([]string{key, e.key("missing")})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got[key], ",") != "b" || len(got) != 1 {
		t.Fatalf("Members = %v, want b only (and nothing for the missing log)", got)
	}
	if v, _ := e.value(t, key); v != "+b " {
		t.Errorf("log after reading = %q, want it compacted", v)
	}
	if err := l.Append(key, []byte("+bad token")); err == nil {
		t.Errorf("Append of malformed tokens succeeded")
	}

	// Fill: 100-byte members, each added and removed, until the item is
	// near memcached's limit; the next append compacts and goes through.
	max := e.itemSizeMax(t)
	member := strings.Repeat("m", 100)
	churn := []byte("+" + member + " -" + member + " ")
	full := e.key("full")
	e.set(t, full, strings.Repeat(string(churn), (max-4096)/len(churn)), 0)
	big := []byte("+" + strings.Repeat("x", 8192) + " ") // more than the room left
	if err := l.Append(full, big); err != nil {
		t.Fatalf("Append to a full log of removed members: %v", err)
	}
	huge := []byte("+" + strings.Repeat("y", max) + " ")
	if err := l.Append(full, huge); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append beyond the item size = %v, want ErrTooLarge", err)
	}

	// A log of live members only, near the limit: a removal still goes
	// through (the rewrite applies it), an add that does not fit fails.
	live := e.key("live")
	var value strings.Builder
	for i := 0; value.Len() < max-4096; i++ {
		fmt.Fprintf(&value, "+%s%06d ", member, i)
	}
	e.set(t, live, value.String(), 0)
	n := strings.Count(value.String(), "+")
	for ; ; n++ { // up to the last byte memcached takes
		if err := e.mc.Append(&memcache.Item{Key: live, Value: fmt.Appendf(nil, "+%s%06d ", member, n)}); err != nil {
			break
		}
	}
	if err := l.Append(live, []byte("-"+member+"000000 "+"-"+member+"000001 ")); err != nil {
		t.Fatalf("removal from a log full of live members: %v", err)
	}
	got, err = l.Members([]string{live})
	if err != nil {
		t.Fatal(err)
	}
	if len(got[live]) != n-2 || got[live][0] != member+"000002" {
		t.Errorf("log has %d members starting %.20q after the removal, want %d, the first two removed", len(got[live]), got[live][0], n-2)
	}
	if err := l.Append(live, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("add beyond the item size to a log of live members = %v, want ErrTooLarge", err)
	}
}
