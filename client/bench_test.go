package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// BenchmarkHotKeySpread shows how reads of namespaces spread over 8
// memcached servers (modula-crc32, as the client routes them) with K
// copies per namespace: "global" is one namespace read by every request
// (the hot key the copies are for), "zipf" reads the namespaces of 100,000
// entities with Zipf-distributed popularity (s = 1.1). It reports the
// share of reads that the busiest server takes and its ratio to the mean
// (1 is an even spread).
//
//	go test ./client -run '^$' -bench HotKeySpread
func BenchmarkHotKeySpread(b *testing.B) {
	const servers = 8
	var list []itemformat.Server
	for i := range servers {
		list = append(list, itemformat.Server{Addr: "127.0.0.1:" + strconv.Itoa(21000+i)})
	}
	for _, load := range []string{"global", "zipf"} {
		for _, copies := range []int{0, 2, 4, 8} {
			b.Run(fmt.Sprintf("%s/copies=%d", load, copies), func(b *testing.B) {
				src := "version: 1\nrules:\n  - {name: ns, table: t, bump: \"ns:{id}\""
				if copies > 0 {
					src += ", copies: " + strconv.Itoa(copies)
				}
				rs, err := rulefile.Parse("bench.yaml", []byte(src+"}\n"))
				if err != nil {
					b.Fatal(err)
				}
				c, err := New(Config{Servers: list, Rules: rs}, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				r := c.rules["ns"]
				zipf := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 99_999)
				var hits [servers]int
				for b.Loop() {
					id := uint64(0)
					if load == "zipf" {
						id = zipf.Uint64()
					}
					raw, err := r.rendered(Row{"id": id})
					if err != nil {
						b.Fatal(err)
					}
					hits[c.sel.Index(r.readKey(raw))]++
				}
				most, total := 0, 0
				for _, h := range hits {
					most, total = max(most, h), total+h
				}
				b.ReportMetric(100*float64(most)/float64(total), "%busiest")
				b.ReportMetric(float64(most)/(float64(total)/servers), "busiest/mean")
			})
		}
	}
}

// BenchmarkNamespaceReads compares reading the namespaces of 1, 3 and 10
// entities per request from per-entity namespaces (one GetMulti of every
// entity's key) with a master namespace with evidence (one get of the
// master, and a GetMulti only of entities whose bit is set), on 4 private
// memcached servers. Of 64 evidence bits, 4 are set (four entities were
// changed since the master last rolled). It reports the memcached
// requests per read (one per server a round trip reaches) and the round
// trips per read. Every namespace exists (a warm cache).
//
//	go test ./client -run '^$' -bench NamespaceReads
func BenchmarkNamespaceReads(b *testing.B) {
	addrs := startMemcacheds(b, 4)
	var list []itemformat.Server
	for _, a := range addrs {
		list = append(list, itemformat.Server{Addr: a})
	}
	rs, err := rulefile.Parse("bench.yaml", []byte(`version: 1
rules:
  - {name: plain, table: users, bump: "ns:user:{id}"}
  - {name: evidence, table: members, bump: "ns:member:{id}", evidence: {master: "ns:member:master", bits: 64}}
`))
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Servers: list, Rules: rs}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cc := &serverCountingClient{readClient: c.mc, sel: c.sel}
	c.mc = cc
	ctx := context.Background()
	// The daemon changed four members.
	pw := cacheops.NewMetaApplier(c.sel, nil, nil, cacheops.Config{}, nil)
	defer pw.Close()
	if _, err := c.Namespace(ctx, "evidence", Row{"id": 0}); err != nil {
		b.Fatal(err)
	}
	var ops []rules.Op
	for _, id := range []string{"5", "17", "40", "63"} {
		ops, _, _ = rs.Plan(ops, &rules.Event{Table: "members", Operation: rules.Insert,
			After: rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: id}}}})
	}
	if err := pw.Apply(ctx, ops, make([]cacheops.Result, len(ops))); err != nil {
		b.Fatal(err)
	}
	// Every namespace exists, as in a warm cache.
	for _, rule := range []string{"plain", "evidence"} {
		var rows []Row
		for id := range 10_000 {
			rows = append(rows, Row{"id": id})
			if len(rows) == 100 {
				if _, err := c.Namespaces(ctx, rule, rows); err != nil {
					b.Fatal(err)
				}
				rows = rows[:0]
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, rule := range []string{"plain", "evidence"} {
		for _, n := range []int{1, 3, 10} {
			b.Run(fmt.Sprintf("%s/entities=%d", rule, n), func(b *testing.B) {
				rows := make([]Row, n)
				cc.requests.Store(0)
				cc.roundTrips.Store(0)
				for b.Loop() {
					for i := range rows {
						rows[i] = Row{"id": rng.IntN(10_000)}
					}
					if _, err := c.Namespaces(ctx, rule, rows); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cc.requests.Load())/float64(b.N), "requests/read")
				b.ReportMetric(float64(cc.roundTrips.Load())/float64(b.N), "roundtrips/read")
			})
		}
	}
}

// serverCountingClient counts round trips and the memcached requests
// they make (a GetMulti asks every server holding one of its keys).
type serverCountingClient struct {
	readClient
	sel                  *itemformat.Selector
	requests, roundTrips atomic.Int64
}

func (c *serverCountingClient) Get(key string) (*memcache.Item, error) {
	c.requests.Add(1)
	c.roundTrips.Add(1)
	return c.readClient.Get(key)
}

func (c *serverCountingClient) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	servers := map[int]bool{}
	for _, k := range keys {
		servers[c.sel.Index(k)] = true
	}
	c.requests.Add(int64(len(servers)))
	c.roundTrips.Add(1)
	return c.readClient.GetMulti(keys)
}

func (c *serverCountingClient) Add(it *memcache.Item) error {
	c.requests.Add(1)
	c.roundTrips.Add(1)
	return c.readClient.Add(it)
}

// startMemcacheds starts n private memcached servers on free loopback
// ports for the rest of the benchmark or test.
func startMemcacheds(tb testing.TB, n int) []string {
	tb.Helper()
	var addrs []string
	for range n {
		addrs = append(addrs, testsvc.PrivateMemcached(tb, testsvc.MemcachedOptions{}).Addr)
	}
	return addrs
}

// BenchmarkSetAndCounterReads reads a warm set and a warm counter with
// Members and Count (docs/formats.md, "Generations": each read also reads
// its table's generation) and reports the round trips and the keys asked
// per read: one round trip, two keys, for either.
func BenchmarkSetAndCounterReads(b *testing.B) {
	addr := testsvc.Memcached(b)
	rs, err := rulefile.Parse("bench.yaml", []byte("version: 1\nprefix: \"bench"+testsvc.Unique()+":\"\nrules:\n"+
		"  - {name: tags, table: items, set: {key: \"tags:{id}\", member: \"{tag}\"}}\n"+
		"  - {name: likes, table: likes, count: {key: \"likes:{id}\"}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Servers: []itemformat.Server{{Addr: addr}}, Rules: rs}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	row := Row{"id": 1}
	setKey, _ := c.Key("tags", row)
	countKey, _ := c.Key("likes", row)
	var gens [2]uint64
	for i, rule := range []string{"tags", "likes"} {
		if gens[i], err = c.generation(ctx, c.rules[rule].rule.Generation, nil); err != nil {
			b.Fatal(err)
		}
	}
	mc := c.Memcache()
	if err := mc.Set(&memcache.Item{Key: setKey, Value: itemformat.EncodeSetAt(gens[0], []string{"a", "b", "c"})}); err != nil {
		b.Fatal(err)
	}
	if err := mc.Set(&memcache.Item{Key: itemformat.CounterKey(countKey, gens[1]), Value: []byte("42")}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Count(ctx, "likes", row); err != nil { // learns the generation
		b.Fatal(err)
	}
	for _, rule := range []string{"tags", "likes"} {
		b.Run(rule, func(b *testing.B) {
			cc := &keyCountingClient{readClient: c.mc}
			c.mc = cc
			defer func() { c.mc = cc.readClient }()
			for b.Loop() {
				var err error
				if rule == "tags" {
					_, err = c.Members(ctx, rule, row)
				} else {
					_, err = c.Count(ctx, rule, row)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cc.trips.Load())/float64(b.N), "roundtrips/read")
			b.ReportMetric(float64(cc.keys.Load())/float64(b.N), "keys/read")
		})
	}
}

// keyCountingClient counts round trips and the keys they ask for.
type keyCountingClient struct {
	readClient
	trips, keys atomic.Int64
}

func (c *keyCountingClient) Get(key string) (*memcache.Item, error) {
	c.trips.Add(1)
	c.keys.Add(1)
	return c.readClient.Get(key)
}

func (c *keyCountingClient) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	c.trips.Add(1)
	c.keys.Add(int64(len(keys)))
	return c.readClient.GetMulti(keys)
}
