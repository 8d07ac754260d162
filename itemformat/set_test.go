package itemformat

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

type setDecodeCase struct {
	Name     string   `json:"name"`
	Value    string   `json:"value"`
	Members  []string `json:"members"`
	Tokens   int      `json:"tokens"`
	Removals int      `json:"removals"`
}

func loadSetDecodeCases(t testing.TB) []setDecodeCase {
	t.Helper()
	data, err := os.ReadFile("testdata/setformat/decode.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []setDecodeCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatalf("testdata/setformat/decode.json: %v", err)
	}
	return cases
}

func TestDecodeSet(t *testing.T) {
	for _, tc := range loadSetDecodeCases(t) {
		t.Run(tc.Name, func(t *testing.T) {
			st := DecodeSet([]byte(tc.Value))
			if !slices.Equal(st.Members, tc.Members) {
				t.Errorf("Members = %q, want %q", st.Members, tc.Members)
			}
			if st.Tokens != tc.Tokens || st.Removals != tc.Removals {
				t.Errorf("Tokens, Removals = %d, %d, want %d, %d", st.Tokens, st.Removals, tc.Tokens, tc.Removals)
			}
		})
	}
}

func TestSetStateDirty(t *testing.T) {
	tests := []struct {
		value string
		ratio float64
		want  bool
	}{
		{"", 0.5, false},
		{"+a +b ", 0.5, false},
		{"+a +b ", 0.01, false},
		{"+a -a ", 0.5, true},           // 2 of 2 dropped
		{"+a +b -a ", 0.5, true},        // 2 of 3
		{"+a +b +c -a ", 0.5, true},     // 2 of 4: exactly the ratio
		{"+a +b +c +d -a ", 0.5, false}, // 2 of 5
		{"+a +a ", 0.5, true},           // a duplicate add is dropped too
		{"+a +a ", 0.6, false},          // 1 of 2
		{"+a -a ", 1, true},
		{"+a +b -a ", 1, false},
		{"+a -a ", 1.5, false},
	}
	for _, tc := range tests {
		if got := DecodeSet([]byte(tc.value)).Dirty(tc.ratio); got != tc.want {
			t.Errorf("DecodeSet(%q).Dirty(%v) = %v, want %v", tc.value, tc.ratio, got, tc.want)
		}
	}
}

func TestAppendToken(t *testing.T) {
	tests := []struct {
		add    bool
		member string
		want   string
	}{
		{true, "42", "+42 "},
		{false, "42", "-42 "},
		{true, "a b", "+a%20b "},
		{true, "100%", "+100%25 "},
		{true, "line\r\nbreak", "+line%0D%0Abreak "},
		{false, "tab\there\x7f", "-tab%09here%7F "},
		{true, "", "+ "},
		{true, "é\u00a0", "+é\u00a0 "},
	}
	for _, tc := range tests {
		got := string(AppendToken([]byte("x"), tc.add, tc.member))
		if got != "x"+tc.want {
			t.Errorf("AppendToken(%v, %q) = %q, want %q", tc.add, tc.member, got, "x"+tc.want)
		}
		escaped := string(AppendEscapedToken(nil, tc.add, rules.Escape(tc.member)))
		if escaped != tc.want {
			t.Errorf("AppendEscapedToken(%v, Escape(%q)) = %q, want %q", tc.add, tc.member, escaped, tc.want)
		}
	}
}

func TestEncodeSet(t *testing.T) {
	if got := string(EncodeSet(nil)); got != "" {
		t.Errorf("EncodeSet(nil) = %q, want empty", got)
	}
	members := []string{"a", "b%20c", ""}
	got := EncodeSet(members)
	if string(got) != "+a +b%20c + " {
		t.Errorf("EncodeSet = %q", got)
	}
	st := DecodeSet(got)
	if !slices.Equal(st.Members, members) || st.Tokens != 3 || st.Removals != 0 || st.Dirty(0.01) {
		t.Errorf("DecodeSet(EncodeSet(%q)) = %+v", members, st)
	}
}

func TestUnescape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"a%20b", "a b"},
		{"%41%42", "AB"},
		{"%2a", "*"},
		{"100%25", "100%"},
		{"%%41", "%A"},
		{"%", "%"},
		{"%4", "%4"},
		{"x%4", "x%4"},
		{"%zz", "%zz"},
		{"%0D%0A", "\r\n"},
		{"end%", "end%"},
	}
	for _, tc := range tests {
		if got := Unescape(tc.in); got != tc.want {
			t.Errorf("Unescape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// referenceMembers is the set semantics written the obvious way: a member
// is present when its last token is an add.
func referenceMembers(value []byte) map[string]bool {
	present := map[string]bool{}
	for _, tok := range strings.FieldsFunc(string(value), func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		switch tok[0] {
		case '+':
			present[tok[1:]] = true
		case '-':
			delete(present, tok[1:])
		}
	}
	return present
}

func FuzzDecodeSet(f *testing.F) {
	for _, tc := range loadSetDecodeCases(f) {
		f.Add([]byte(tc.Value))
	}
	f.Add([]byte("+a\xff\xfe -\xc2 +\xe2\x80\xa8 "))
	f.Fuzz(func(t *testing.T, value []byte) {
		st := DecodeSet(value)
		if st.Removals > st.Tokens || len(st.Members) > st.Tokens {
			t.Fatalf("DecodeSet(%q) = %+v: counts exceed tokens", value, st)
		}
		want := referenceMembers(value)
		if len(st.Members) != len(want) {
			t.Fatalf("DecodeSet(%q) members %q, reference %v", value, st.Members, want)
		}
		for _, m := range st.Members {
			if !want[m] {
				t.Fatalf("DecodeSet(%q) has member %q that the reference lacks", value, m)
			}
		}
		// Compaction keeps the membership and leaves nothing to drop.
		compact := EncodeSet(st.Members)
		again := DecodeSet(compact)
		if !slices.Equal(again.Members, st.Members) || again.Tokens != len(st.Members) || again.Removals != 0 {
			t.Fatalf("DecodeSet(EncodeSet(%q)) = %+v", st.Members, again)
		}
		if len(st.Members) > 0 && again.Dirty(0.01) {
			t.Fatalf("compacted set %q is dirty", compact)
		}
	})
}

func FuzzTokenRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a", "a b", "100%", "%41", "\r\n", "\x00\x7f", "é\u00a0x", "\xff"} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, member string, add bool) {
		if got := Unescape(rules.Escape(member)); got != member {
			t.Fatalf("Unescape(Escape(%q)) = %q", member, got)
		}
		value := AppendToken([]byte("+other "), add, member)
		st := DecodeSet(value)
		if st.Tokens != 2 {
			t.Fatalf("token for %q split into %d tokens: %q", member, st.Tokens-1, value)
		}
		has := slices.Contains(st.Members, rules.Escape(member))
		if has != add && rules.Escape(member) != "other" {
			t.Fatalf("after %q: member %q present = %v, want %v", value, member, has, add)
		}
	})
}
