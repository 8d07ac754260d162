package observer

import (
	"encoding/json"
	"maps"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// judgeCases are the table tests of testdata/judge.json.
type judgeCases struct {
	Versions []struct {
		Name     string
		Before   *string
		Now      *string
		BeforeMs int64 `json:"before_ms"`
		Detached bool
		Want     string
	}
	Masters []struct {
		Name     string
		Before   *string
		Now      *string
		BeforeMs int64 `json:"before_ms"`
		Bit      int
		Want     string
	}
	Sets []struct {
		Name  string
		Now   *string
		Truth []string
		Want  string
	}
	Members []struct {
		Name    string
		Now     *string
		Members map[string]bool
		Want    string
	}
	Counters []struct {
		Name  string
		Now   *string
		Truth int64
		Want  string
	}
}

func item(s *string) Item {
	if s == nil {
		return Item{}
	}
	return Item{Present: true, Value: []byte(*s)}
}

func TestJudge(t *testing.T) {
	data, err := os.ReadFile("testdata/judge.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases judgeCases
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, name string, v verdict, want string) {
		t.Helper()
		if v.result.String() != want {
			t.Errorf("%s: got %s (expected %q, seen %q), want %s", name, v.result, v.expected, v.seen, want)
		}
		if v.result == Inconsistent && (v.expected == "" || v.seen == "") {
			t.Errorf("%s: an inconsistency without evidence: expected %q, seen %q", name, v.expected, v.seen)
		}
	}
	for _, c := range cases.Versions {
		check(t, "version "+c.Name, judgeVersion(item(c.Before), item(c.Now), time.UnixMilli(c.BeforeMs), time.Second, c.Detached), c.Want)
	}
	for _, c := range cases.Masters {
		check(t, "master "+c.Name, judgeMaster(item(c.Before), item(c.Now), c.Bit, 64, time.UnixMilli(c.BeforeMs), time.Second), c.Want)
	}
	for _, c := range cases.Sets {
		check(t, "set "+c.Name, judgeSetAll(item(c.Now), c.Truth), c.Want)
	}
	for _, c := range cases.Members {
		check(t, "members "+c.Name, judgeSetMembers(item(c.Now), c.Members), c.Want)
	}
	for _, c := range cases.Counters {
		check(t, "counter "+c.Name, judgeCounter(item(c.Now), c.Truth), c.Want)
	}
	if n := len(cases.Versions) + len(cases.Masters) + len(cases.Sets) + len(cases.Members) + len(cases.Counters); n < 30 {
		t.Fatalf("only %d cases read from testdata/judge.json", n)
	}
}

func TestNines(t *testing.T) {
	for _, c := range []struct {
		counts Counts
		want   string
	}{
		{Counts{}, "none judged"},
		{Counts{NotJudged: 5}, "none judged"},
		{Counts{Consistent: 10}, "all"},
		{Counts{Consistent: 98, Missing: 1, Inconsistent: 1}, "2.00"},
		{Counts{Consistent: 999, Inconsistent: 1, NotJudged: 1000}, "3.00"},
		{Counts{Consistent: 1, Inconsistent: 1}, "0.30"},
		{Counts{Inconsistent: 8}, "0.00"},
	} {
		if got := c.counts.NinesText(); got != c.want {
			t.Errorf("%+v: nines %s, want %s", c.counts, got, c.want)
		}
	}
}

func TestStatusHandlerOff(t *testing.T) {
	rec := httptest.NewRecorder()
	StatusHandler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var got map[string]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	if on, ok := got["observer"]["enabled"]; !ok || on != false || len(got["observer"]) != 1 {
		t.Errorf("/status of no observer: %s", rec.Body.String())
	}
	for _, c := range []struct {
		n    Nines
		want string
	}{{Nines(Counts{}.Nines()), "null"}, {Nines(Counts{Consistent: 3}.Nines()), `"+Inf"`}, {Nines(Counts{Consistent: 99, Inconsistent: 1}.Nines()), "2.000"}} {
		if b, _ := json.Marshal(c.n); string(b) != c.want {
			t.Errorf("nines %v in JSON: %s, want %s", float64(c.n), b, c.want)
		}
	}
}

// TestTokenMembersSplitAsSets: the members of a sampled append are split
// as a set's value is (itemformat.SetTokens): only bytes up to space and
// DEL separate tokens, so a member with a no-break or em space stays one.
func TestTokenMembersSplitAsSets(t *testing.T) {
	got := tokenMembers("+caf\u00a0x -a\u2003b\t+c ")
	want := map[string]bool{"caf\u00a0x": true, "a\u2003b": false, "c": true}
	if !maps.Equal(got, want) {
		t.Errorf("tokenMembers = %v, want %v", got, want)
	}
}
