package cacheops

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

func TestMembersDecodes(t *testing.T) {
	mc := readTestClient(t)
	// Compaction off: this test is about decoding only.
	r := NewReader(mc, readTestLogger(t), ReaderOptions{CompactRatio: 2})
	cases := []struct {
		name, stored string
		want         []string
	}{
		{"empty", "", []string{}},
		{"adds", "+a +b +c ", []string{"a", "b", "c"}},
		{"removal", "+a +b +c -b ", []string{"a", "c"}},
		{"removed then added again", "+a -a +b +a ", []string{"b", "a"}},
		{"removal of an absent member", "-x +a ", []string{"a"}},
		{"escaped members come back raw", "+a%20b +100%25 +tab%09 ", []string{"a b", "100%", "tab\t"}},
		{"foreign ops and extra whitespace ignored", "  +a\t*b \r\n+c  ", []string{"a", "c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := readTestKey("set")
			if err := mc.Set(&memcache.Item{Key: key, Value: []byte(tc.stored), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			got, err := r.Members(t.Context(), key, func(context.Context) ([]string, error) {
				t.Error("loader called for a present set")
				return nil, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Members(%q) = %q, want %q", tc.stored, got, tc.want)
			}
			if it, err := mc.Get(key); err != nil || string(it.Value) != tc.stored {
				t.Errorf("item changed with compaction off: %v, %v", it, err)
			}
		})
	}
}

func TestMembersCompactsDirtySets(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{CompactRatio: 0.5, SetTTL: 60e9})
	cases := []struct {
		name, stored, after string
	}{
		// 2 of 4 tokens are garbage: at the ratio, compacted.
		{"dirty", "+a +b -a +c ", "+b +c "},
		{"repeated adds", "+a +a +a ", "+a "},
		{"all removed", "+a -a ", ""},
		// 1 of 4 tokens is garbage: below the ratio, left alone.
		{"clean enough", "+a +b +c -x ", "+a +b +c -x "},
		{"compact", "+x%20y +z ", "+x%20y +z "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := readTestKey("set")
			if err := mc.Set(&memcache.Item{Key: key, Value: []byte(tc.stored), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			before, err := r.Members(t.Context(), key, nil)
			if err != nil {
				t.Fatal(err)
			}
			it, err := mc.Get(key)
			if err != nil {
				t.Fatal(err)
			}
			if string(it.Value) != tc.after {
				t.Errorf("stored after read: %q, want %q", it.Value, tc.after)
			}
			after, err := r.Members(t.Context(), key, nil)
			if err != nil || !slices.Equal(before, after) {
				t.Errorf("members changed by compaction: %q then %q (%v)", before, after, err)
			}
		})
	}
}

func TestCompactionNeverDropsNewerAppends(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{})
	key := readTestKey("set")
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("+a -a +b -b +c "), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	read, err := mc.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon appends between the reader's read and its compaction.
	if err := mc.Append(&memcache.Item{Key: key, Value: AppendToken(nil, true, "d")}); err != nil {
		t.Fatal(err)
	}
	if r.compactSet(read, DecodeSet(read.Value)) {
		t.Fatal("compaction based on an outdated read was stored")
	}
	now, err := mc.Get(key)
	if err != nil || string(now.Value) != "+a -a +b -b +c +d " {
		t.Fatalf("item after lost compaction: %v, %v", now, err)
	}
	got, err := r.Members(t.Context(), key, nil)
	if err != nil || !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("Members = %q, %v", got, err)
	}
	if now, err := mc.Get(key); err != nil || string(now.Value) != "+c +d " {
		t.Fatalf("item after compaction on read: %v, %v", now, err)
	}
}

func TestMembersLoadsMissingSets(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{SetTTL: 60e9})

	t.Run("loaded and added", func(t *testing.T) {
		key := readTestKey("set")
		loads := 0
		load := func(context.Context) ([]string, error) {
			loads++
			return []string{"b", "a b", "100%", "b"}, nil
		}
		want := []string{"b", "a b", "100%"}
		got, err := r.Members(t.Context(), key, load)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("first Members = %q, %v; want %q", got, err, want)
		}
		it, err := mc.Get(key)
		if err != nil || string(it.Value) != "+b +a%20b +100%25 " {
			t.Fatalf("added set: %v, %v", it, err)
		}
		got, err = r.Members(t.Context(), key, load)
		if err != nil || !slices.Equal(got, want) || loads != 1 {
			t.Fatalf("second Members = %q, %v after %d loads", got, err, loads)
		}
	})

	t.Run("empty set", func(t *testing.T) {
		key := readTestKey("set")
		got, err := r.Members(t.Context(), key, func(context.Context) ([]string, error) { return nil, nil })
		if err != nil || len(got) != 0 {
			t.Fatalf("Members = %q, %v", got, err)
		}
		// The empty item exists, so the daemon's appends now land.
		if err := mc.Append(&memcache.Item{Key: key, Value: AppendToken(nil, true, "x")}); err != nil {
			t.Fatalf("append to the loaded empty set: %v", err)
		}
		got, err = r.Members(t.Context(), key, nil)
		if err != nil || !slices.Equal(got, []string{"x"}) {
			t.Fatalf("Members after append = %q, %v", got, err)
		}
	})

	t.Run("lost add", func(t *testing.T) {
		key := readTestKey("set")
		got, err := r.Members(t.Context(), key, func(context.Context) ([]string, error) {
			// Another client adds the set while this one loads.
			if err := mc.Add(&memcache.Item{Key: key, Value: []byte("+other "), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			return []string{"mine"}, nil
		})
		if err != nil || !slices.Equal(got, []string{"mine"}) {
			t.Fatalf("Members = %q, %v", got, err)
		}
		if it, err := mc.Get(key); err != nil || string(it.Value) != "+other " {
			t.Fatalf("the first add must win: %v, %v", it, err)
		}
	})

	t.Run("load error", func(t *testing.T) {
		key := readTestKey("set")
		boom := errors.New("database down")
		_, err := r.Members(t.Context(), key, func(context.Context) ([]string, error) { return []string{"partial"}, boom })
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the loader's", err)
		}
		if _, err := mc.Get(key); !errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("a failed load stored something: %v", err)
		}
	})

	t.Run("no loader", func(t *testing.T) {
		_, err := r.Members(t.Context(), readTestKey("set"), nil)
		if !errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("err = %v, want a cache miss", err)
		}
	})
}

// independentSetReader decodes a set item the simplest way the format
// allows: split the bytes on ASCII whitespace, look at each token's first
// byte. Any client of the format, in any language, can read it like this.
func independentSetReader(value string) map[string]bool {
	set := map[string]bool{}
	asciiSpace := func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r' }
	for _, tok := range strings.FieldsFunc(value, asciiSpace) {
		switch tok[0] {
		case '+':
			set[tok[1:]] = true
		case '-':
			delete(set, tok[1:])
		}
	}
	return set
}

func TestSetItemsReadableByPlainDecoder(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{CompactRatio: 0.3})
	key := readTestKey("set")
	raw := []string{"plain", "with space", "tab\there", "new\nline", "50%", "ünïcode", "non\u00a0breaking", "+plus", "-minus"}
	if _, err := r.Members(t.Context(), key, func(context.Context) ([]string, error) { return raw, nil }); err != nil {
		t.Fatal(err)
	}
	var tokens []byte
	tokens = AppendToken(tokens, false, "with space")
	tokens = AppendToken(tokens, true, "late arrival")
	tokens = AppendToken(tokens, false, "50%")
	if err := mc.Append(&memcache.Item{Key: key, Value: tokens}); err != nil {
		t.Fatal(err)
	}
	for _, pass := range []string{"appended", "compacted"} {
		it, err := mc.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		plain := independentSetReader(string(it.Value))
		got, err := r.Members(t.Context(), key, nil) // the first pass compacts
		if err != nil {
			t.Fatal(err)
		}
		if len(plain) != len(got) {
			t.Fatalf("%s: plain decoder sees %d members, Members %d (%q)", pass, len(plain), len(got), got)
		}
		for _, m := range got {
			if !plain[EscapeKeyPart(m)] {
				t.Errorf("%s: member %q (escaped %q) missing from the plain decoding %v", pass, m, EscapeKeyPart(m), plain)
			}
		}
	}
	want := []string{"plain", "tab\there", "new\nline", "ünïcode", "non\u00a0breaking", "+plus", "-minus", "late arrival"}
	escaped := make([]string, len(want))
	for i, m := range want {
		escaped[i] = EscapeKeyPart(m)
	}
	if it, err := mc.Get(key); err != nil || string(it.Value) != string(EncodeSet(escaped)) {
		t.Errorf("compacted item = %v, %v; want %q", it, err, EncodeSet(escaped))
	}
}
