package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"abc:123", "abc:123"},
		{"a b", "a%20b"},
		{"100%", "100%25"},
		{"%20", "%2520"},
		{"tab\there", "tab%09here"},
		{"nl\r\n", "nl%0D%0A"},
		{"\x00\x1f\x20\x21", "%00%1F%20!"},
		{"del\x7f", "del%7F"},
		{"ünï", "ünï"},           // bytes >= 0x80 are kept
		{"\xff\xfe", "\xff\xfe"}, // even when not UTF-8
		{"{}#:/?", "{}#:/?"},
	}
	for _, tc := range tests {
		if got := Escape(tc.in); got != tc.want {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := string(AppendEscaped([]byte("x"), tc.in)); got != "x"+tc.want {
			t.Errorf("AppendEscaped(%q) = %q", tc.in, got)
		}
	}
}

// hashedKey is the long-key rule written out independently.
func hashedKey(full string) string {
	sum := sha256.Sum256([]byte(full))
	return full[:200] + "%#" + hex.EncodeToString(sum[:])[:32]
}

func TestKeyLengthBoundary(t *testing.T) {
	const prefix = "p:"
	for _, n := range []int{0, 1, 200, 247, 248, 249, 250, 300, 1000} {
		// "p:" + "k" + n-byte value
		v := strings.Repeat("v", n)
		full := prefix + "k" + v
		got, err := Key(prefix, "k{v}", map[string]string{"v": v})
		if err != nil {
			t.Fatal(err)
		}
		want := full
		if len(full) > 250 {
			want = hashedKey(full)
		}
		if got != want {
			t.Errorf("len %d: Key = %q, want %q", len(full), got, want)
		}
		if len(got) > MaxKeyLen {
			t.Errorf("len %d: key of %d bytes", len(full), len(got))
		}
		if len(full) > 250 && len(got) != 234 {
			t.Errorf("len %d: hashed key has %d bytes, want 234", len(full), len(got))
		}
		if FinishKey([]byte(full)) != want {
			t.Errorf("FinishKey disagrees with Key at %d bytes", len(full))
		}
	}
	// Escaping counts: 84 spaces become 252 bytes.
	got, _ := Key("", "{v}", map[string]string{"v": strings.Repeat(" ", 84)})
	if want := hashedKey(strings.Repeat("%20", 84)); got != want {
		t.Errorf("escaped long key = %q, want %q", got, want)
	}
	// Two keys sharing their first 200 bytes stay distinct.
	a, _ := Key("", "{v}", map[string]string{"v": strings.Repeat("a", 300) + "1"})
	b, _ := Key("", "{v}", map[string]string{"v": strings.Repeat("a", 300) + "2"})
	if a == b {
		t.Errorf("long keys collide: %q", a)
	}
}

func TestTemplate(t *testing.T) {
	tpl, err := ParseTemplate("ns:{a}:{b}-x:{a}")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tpl.Columns(), []string{"a", "b", "a"}) || !tpl.HasPlaceholders() || tpl.String() != "ns:{a}:{b}-x:{a}" {
		t.Errorf("template = %+v", tpl)
	}
	lit, _ := ParseTemplate("ns:all")
	if lit.HasPlaceholders() || lit.Columns() != nil {
		t.Errorf("literal template has placeholders")
	}
	got, err := Key("shop:", "ns:{a}:{b}-x:{a}", map[string]string{"a": "1 2", "b": ""})
	if err != nil || got != "shop:ns:1%202:-x:1%202" {
		t.Errorf("Key = %q, %v", got, err)
	}
	if _, err := Key("", "{a}:{missing}", map[string]string{"a": "1"}); err == nil || !strings.Contains(err.Error(), `"missing"`) {
		t.Errorf("missing column: err = %v", err)
	}
	for _, bad := range []string{"", "{", "a{b", "}", "a}b", "{}", "{a b}", "{a{b}", "a b", "a\x7f", "a\nb"} {
		if _, err := ParseTemplate(bad); err == nil {
			t.Errorf("ParseTemplate(%q) accepted", bad)
		}
	}
}

func TestTemplateDistinctColumnsAndBare(t *testing.T) {
	for _, tc := range []struct {
		src      string
		distinct []string
		bare     string
	}{
		{"{id}", []string{"id"}, "id"},
		{"ns:{id}", []string{"id"}, ""},
		{"{a}{b}:{a}", []string{"a", "b"}, ""},
		{"ns:all", nil, ""},
	} {
		tpl, err := ParseTemplate(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		if got := tpl.DistinctColumns(); !slices.Equal(got, tc.distinct) {
			t.Errorf("%q: DistinctColumns = %q, want %q", tc.src, got, tc.distinct)
		}
		if got, ok := tpl.Bare(); got != tc.bare || ok != (tc.bare != "") {
			t.Errorf("%q: Bare = %q, %v, want %q", tc.src, got, ok, tc.bare)
		}
	}
}
