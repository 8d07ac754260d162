package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// memoryPipeline is a pipeline over daemonRules for planning only: its
// memcached is never asked.
func memoryPipeline(t testing.TB) *Pipeline {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(daemonRules, "PREFIX", "m:")), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatal(err)
	}
	w := cacheops.NewTextApplier(memcache.New("127.0.0.1:1"), nil, nil, cacheops.Config{}, nil)
	p, err := New(Config{Rules: rs, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// bigCanal is a Canal UPDATE of rows rows of table, each row built by
// row(i), with an old image per row.
func bigCanal(table string, rows int, row func(i int) string, old string) []byte {
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(row(i))
	}
	b.WriteString(`],"old":[`)
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(old)
	}
	b.WriteString(`],"database":"shop","table":"` + table + `","isDdl":false,"type":"UPDATE","es":1,"ts":1}`)
	return []byte(b.String())
}

// allocatedPlanning returns the bytes allocated while a new batch plans
// the message value.
func allocatedPlanning(p *Pipeline, value []byte) (allocated uint64, b *Batch) {
	msgs := []Message{{Value: value, Pos: rules.Position{Topic: "t", Offset: 1}}}
	b = &Batch{}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p.Plan(b, msgs, CoalesceOptions{})
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, b
}

// Memory a message may take while it is decoded, planned and coalesced
// (docs/operations.md, "Memory"): memoryPerSize times its size plus
// memoryPerRow per row, its rows bounded by the decoder.
const (
	memoryPerSize = 8
	memoryPerRow  = 3 << 10
)

// TestMessageMemoryBound measures the bytes allocated while a new batch
// decodes, plans and coalesces one large message: a Canal message of
// 200,000 rows (more than a message may hold: poison, with its table's
// fallback bumped), messages at the bound of rows, and 50 MB column
// values read by keys and set members.
func TestMessageMemoryBound(t *testing.T) {
	p := memoryPipeline(t)
	user := func(i int) string {
		return fmt.Sprintf(`{"id":"%d","name":"user number %d","email":"u%d@example.com"}`, i, i, i)
	}
	wide := func(i int) string {
		return fmt.Sprintf(`{"id":"%d","customer_id":"20771","status":"paid","currency":"EUR","total_cents":"129900","items":"3","coupon":null,"paid":"1","note":"leave at the door","created_at":"2024-06-10 06:13:20","updated_at":"2024-06-10 06:15:23","version":"8"}`, i)
	}
	interest := func(i int) string {
		return fmt.Sprintf(`{"user_id":"%d","interest_id":"%d","x":"abcdefghijklmn"}`, i, i%1000)
	}
	huge := strings.Repeat("x", 50<<20)
	for _, tc := range []struct {
		name   string
		value  []byte
		rows   int
		poison bool
	}{
		{"canal 200000 rows", bigCanal("users", 200_000, user, `{"name":"old"}`), 200_000, true},
		{"canal 200000 set rows", bigCanal("user_interests", 200_000, interest, `{"interest_id":"1"}`), 200_000, true},
		{"canal rows at the bound", bigCanal("users", decode.MaxMessageRows, user, `{"name":"old"}`), decode.MaxMessageRows, false},
		{"canal wide rows at the bound", bigCanal("users", decode.MaxMessageRows, wide, `{"status":"pending","paid":"0","version":"7"}`), decode.MaxMessageRows, false},
		{"canal set rows at the bound", bigCanal("user_interests", decode.MaxMessageRows, interest, `{"interest_id":"1"}`), decode.MaxMessageRows, false},
		{"50 MB set member", []byte(`{"op":"c","before":null,"after":{"user_id":1,"interest_id":"` + huge + `"},"source":{"db":"shop","table":"user_interests"}}`), 1, false},
		{"50 MB key column", []byte(`{"op":"c","before":null,"after":{"id":"` + huge + `"},"source":{"db":"shop","table":"users"}}`), 1, false},
	} {
		n, b := allocatedPlanning(p, tc.value)
		ratio := float64(n) / float64(len(tc.value))
		t.Logf("%s: %d bytes, %d rows: allocated %d bytes (%.1fx its size, %d per row), %d ops, %d poison",
			tc.name, len(tc.value), tc.rows, n, ratio, n/uint64(tc.rows), len(b.Ops), len(b.Poison))
		if got := len(b.Poison) == 1; got != tc.poison {
			t.Errorf("%s: poison %v, want %v", tc.name, got, tc.poison)
		}
		// Messages beyond the bound of rows and single huge values: a
		// multiple of their size alone.
		limit := uint64(memoryPerSize * len(tc.value))
		if !tc.poison && tc.rows > 1 {
			limit += uint64(memoryPerRow * tc.rows)
		}
		if n > limit {
			t.Errorf("%s: allocated %d bytes (%.1fx its size), want at most %d", tc.name, n, ratio, limit)
		}
	}
}
