package client

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// vectorsPath is the one file of test vectors of docs/formats.md, shared
// with the Python and PHP readers.
const vectorsPath = "../testdata/formats/vectors.json"

// formatVectors mirrors testdata/formats/vectors.json.
type formatVectors struct {
	Keys []struct {
		Name, Prefix, Template, Key string
		Values                      map[string]string
	}
	Tokens []struct {
		Member, Token string
		Add           bool
	}
	Sets []struct {
		Name, Value, Compacted string
		Members                []string
		Tokens, Garbage        int
		// Generation is the set's generation; "" when it has none.
		Generation string
	}
	Generations []struct {
		Prefix, Database, Table, Key string
	}
	CounterKeys []struct {
		Key, Generation string
		CounterKey      string `json:"counter_key"`
	} `json:"counter_keys"`
	Namespaces []struct {
		Value, Version string
		Valid          bool
	}
	NamespaceStart []struct {
		UnixMs int64 `json:"unix_ms"`
		Start  string
	} `json:"namespace_start"`
	Counters []struct {
		Value, Count string
		Valid        bool
	}
	CopyKeys []struct {
		Prefix, Template, Key string
		Values                map[string]string
		Copy                  int
	} `json:"copy_keys"`
	EvidenceBits []struct {
		ID        string
		Bits, Bit int
	} `json:"evidence_bits"`
	Masters []struct {
		Value, Version string
		Bits           int
		Valid          bool
		Set            []int
	}
	EvidenceMarks []struct {
		Name, Value, Next string
		Bits              int
		MaxSet            int `json:"max_set"`
		Batch             []int
		UnixMs            int64 `json:"unix_ms"`
		Changed           bool
	} `json:"evidence_marks"`
	Lifetimes []struct {
		Name        string
		Lifetime    float64
		ComputeTime float64 `json:"compute_time"`
		MG          string
		MSTTL       int32   `json:"ms_ttl"`
		StaleFor    float64 `json:"stale_for"`
		MD          string
		RuleTTL     *float64 `json:"rule_ttl"`
		DaemonTTL   int32    `json:"daemon_ttl"`
		ReaderTTL   int32    `json:"reader_ttl"`
	}
}

// seconds converts a vector's seconds.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func loadVectors(t *testing.T) *formatVectors {
	t.Helper()
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v formatVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// TestFormatVectors checks the Go implementation of every stored format
// against the shared vectors.
func TestFormatVectors(t *testing.T) {
	v := loadVectors(t)
	if len(v.Keys) == 0 || len(v.Sets) == 0 || len(v.Counters) == 0 {
		t.Fatal("no vectors")
	}
	for _, c := range v.Keys {
		if got, err := rules.Key(c.Prefix, c.Template, c.Values); err != nil || got != c.Key {
			t.Errorf("key %s: %q, %v; want %q", c.Name, got, err, c.Key)
		}
	}
	for _, c := range v.Tokens {
		if got := string(itemformat.AppendToken(nil, c.Add, c.Member)); got != c.Token {
			t.Errorf("token of %q: %q, want %q", c.Member, got, c.Token)
		}
	}
	for _, c := range v.Sets {
		st := itemformat.DecodeSet([]byte(c.Value))
		got := unescapeMembers(st.Members)
		if !slices.Equal(got, c.Members) && !(len(got) == 0 && len(c.Members) == 0) || st.Tokens != c.Tokens || st.Tokens-len(st.Members) != c.Garbage {
			t.Errorf("set %s: %q, %d tokens, %d garbage; want %q, %d, %d", c.Name, got, st.Tokens, st.Tokens-len(st.Members), c.Members, c.Tokens, c.Garbage)
		}
		gen := ""
		if st.HasGen {
			gen = strconv.FormatUint(st.Gen, 10)
		}
		if gen != c.Generation {
			t.Errorf("set %s: generation %q, want %q", c.Name, gen, c.Generation)
		}
		if got := string(st.Compact()); got != c.Compacted {
			t.Errorf("set %s compacted: %q, want %q", c.Name, got, c.Compacted)
		}
	}
	if len(v.Generations) == 0 || len(v.CounterKeys) == 0 {
		t.Fatal("no generation vectors")
	}
	for _, c := range v.Generations {
		if got := rules.GenerationKey(c.Prefix, c.Database, c.Table); got != c.Key {
			t.Errorf("generation key of %q %q %q: %q, want %q", c.Prefix, c.Database, c.Table, got, c.Key)
		}
	}
	for _, c := range v.CounterKeys {
		g, err := strconv.ParseUint(c.Generation, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := itemformat.CounterKey(c.Key, g); got != c.CounterKey {
			t.Errorf("counter key of %q at %d: %q, want %q", c.Key, g, got, c.CounterKey)
		}
	}
	for _, c := range v.Namespaces {
		n, err := parseVersion("k", []byte(c.Value))
		if (err == nil) != c.Valid || (err == nil && strconv.FormatUint(n, 10) != c.Version) {
			t.Errorf("namespace %q: %d, %v; want %q valid=%v", c.Value, n, err, c.Version, c.Valid)
		}
	}
	for _, c := range v.NamespaceStart {
		if got := strconv.FormatUint(itemformat.NamespaceStart(time.UnixMilli(c.UnixMs)), 10); got != c.Start {
			t.Errorf("namespace start %d: %s, want %s", c.UnixMs, got, c.Start)
		}
	}
	for _, c := range v.Counters {
		n, ok := itemformat.ParseCount([]byte(c.Value))
		if ok != c.Valid || (ok && strconv.FormatInt(n, 10) != c.Count) {
			t.Errorf("counter %q: %d, %v; want %s valid=%v", c.Value, n, ok, c.Count, c.Valid)
		}
	}
	for _, c := range v.CopyKeys {
		tmpl, err := rules.ParseTemplate(c.Template)
		if err != nil {
			t.Fatal(err)
		}
		r := &Rule{rule: &rules.Rule{Prefix: c.Prefix, Key: tmpl, Kind: rules.BumpRule, Copies: c.Copy + 1}}
		row := Row{}
		for k, v := range c.Values {
			row[k] = v
		}
		keys, err := r.CopyKeys(row)
		if err != nil || keys[c.Copy] != c.Key {
			t.Errorf("copy %d of %s%s: %q, %v; want %q", c.Copy, c.Prefix, c.Template, keys, err, c.Key)
		}
	}
	for _, c := range v.EvidenceBits {
		if got := rules.EvidenceBit(c.ID, c.Bits); got != c.Bit {
			t.Errorf("evidence bit of %q in %d: %d, want %d", c.ID, c.Bits, got, c.Bit)
		}
	}
	for _, c := range v.Masters {
		m, err := itemformat.DecodeMaster([]byte(c.Value), c.Bits)
		if (err == nil) != c.Valid {
			t.Errorf("master %q (%d bits): %v, want valid=%v", c.Value, c.Bits, err, c.Valid)
			continue
		}
		if err != nil {
			continue
		}
		var set []int
		for b := range c.Bits {
			if m.Has(b) {
				set = append(set, b)
			}
		}
		if strconv.FormatUint(m.Version, 10) != c.Version || !slices.Equal(set, c.Set) && len(set)+len(c.Set) > 0 {
			t.Errorf("master %q: version %d, bits %v; want %s, %v", c.Value, m.Version, set, c.Version, c.Set)
		}
	}
	for _, c := range v.EvidenceMarks {
		next, changed := itemformat.MarkEvidence([]byte(c.Value), c.Batch, c.Bits, c.MaxSet, time.UnixMilli(c.UnixMs))
		if string(next) != c.Next || changed != c.Changed {
			t.Errorf("evidence mark %q: %q, %v; want %q, %v", c.Name, next, changed, c.Next, c.Changed)
		}
	}
	now := time.Now()
	for _, c := range v.Lifetimes {
		switch {
		case c.MG != "":
			cl := &Client{cfg: Config{Turnstile: TurnstileOptions{ComputeTime: seconds(c.ComputeTime)}}.withDefaults()}
			g := cl.leaseGet("KEY")
			mg := fmt.Sprintf("mg %s v c t N%d R%d", g.Key, itemformat.Expiration(g.Vivify, now), (g.Recache+time.Second-1)/time.Second)
			ttl := itemformat.Expiration(cl.storedTTL(seconds(c.Lifetime)), now)
			if mg != c.MG || ttl != c.MSTTL {
				t.Errorf("lifetimes %q: %s, ms T%d; want %s, T%d", c.Name, mg, ttl, c.MG, c.MSTTL)
			}
		case c.MD != "":
			cl := &Client{cfg: Config{Turnstile: TurnstileOptions{StaleFor: seconds(c.StaleFor)}}.withDefaults()}
			if md := fmt.Sprintf("md KEY I T%d", itemformat.Expiration(atLeast(cl.cfg.Turnstile.StaleFor), now)); md != c.MD {
				t.Errorf("lifetimes %q: %s, want %s", c.Name, md, c.MD)
			}
		case c.RuleTTL != nil:
			d := seconds(*c.RuleTTL)
			if got, rd := itemformat.Expiration(d, now), readExpiration(d, now); got != c.DaemonTTL || rd != c.ReaderTTL {
				t.Errorf("lifetimes %q: daemon T%d, reader T%d; want %d, %d", c.Name, got, rd, c.DaemonTTL, c.ReaderTTL)
			}
		default:
			t.Errorf("lifetimes %q: nothing to check", c.Name)
		}
	}
}
