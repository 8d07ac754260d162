package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// hostileCase is one message of hostile input.
type hostileCase struct {
	name  string
	table *Table
	key   []byte
	value []byte
	// poison says the daemon must send it to the DLQ; otherwise it must
	// apply it (or skip it) like any message.
	poison bool
	// second puts the message in a second batch, published once the
	// first was applied.
	second bool
	// keys are the memcached keys, built with the application's key
	// function from the raw hostile values, that applying it must leave
	// in memcached; check runs extra assertions once it was applied.
	keys  []string
	check func(t *testing.T, fs *faultScenario)
}

// hostileRow returns a Debezium create event for table with the row after.
func hostileRow(t *testing.T, table *Table, after map[string]any) []byte {
	t.Helper()
	v, err := json.Marshal(map[string]any{
		"before": nil, "after": after, "op": "c", "ts_ms": time.Now().UnixMilli(),
		"source": map[string]any{"db": table.Database, "table": table.Name, "file": "mysql-bin.000001", "pos": 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustKey(t *testing.T, prefix, template string, values map[string]string) string {
	t.Helper()
	k, err := rules.Key(prefix, template, values)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Injection targets: keys and a table that hostile values try to reach
// through memcached's text protocol and through SQL.
const (
	sentinelKey   = "cw-sentinel"
	sentinelValue = "untouched"
	injectedKey   = "cw-injected"
	canaryTable   = "cw_canary"
)

// hostileCases returns the hostile input: malformed messages, which are
// poison, and well-formed rows whose values are hostile (spaces, CR/LF
// that spell memcached commands, SQL, 10 MB, control bytes, types a column
// never has), which are applied.
func hostileCases(t *testing.T, fs *faultScenario) []hostileCase {
	sc := fs.Schema
	const shop, blog = "it:shop:", "it:blog:"
	big := strings.Repeat("A", 10<<20)
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	user := func(id any) map[string]any {
		return map[string]any{"id": id, "name": "n", "email": "e", "avatar_url": nil, "last_seen_at": nil}
	}
	userKey := func(id string) string { return mustKey(t, shop, "ns:user:{id}", map[string]string{"id": id}) }
	crlfSet := "1\r\nset " + injectedKey + " 0 0 5\r\nPWNED"
	crlfFlush := "2\r\nflush_all\r\n"
	crlfDelete := "3\r\ndelete " + sentinelKey + "\r\nincr " + sentinelKey + " 1\r\n"
	controls := "\x00\x01 %\x7f\t"
	longID := strings.Repeat("k", 300)

	// SQL that, if it were ever spliced into a query instead of bound,
	// would count or load every row (or drop a table); bound, it is a
	// string MariaDB compares numerically as 0 or 1, and no post or user
	// has such an id.
	sqlCount := []string{"0 OR 1=1", "1; DROP TABLE " + canaryTable + "; --", "' OR '1'='1"}
	sqlSetUser := "0 OR 1=1"
	sqlSetMember := "x\r\nset " + injectedKey + " 0 0 1\r\n1"

	cases := []hostileCase{
		{name: "truncated JSON", table: sc.Users, value: []byte(`{"before":null,"after":{"id":1,"name":"cut sh`), poison: true},
		{name: "binary garbage", table: sc.Comments, value: []byte("\x00\xff\xfe garbage \r\n"), poison: true},
		{name: "after is a string", table: sc.Users, value: []byte(`{"before":null,"after":"DROP TABLE users","source":{"db":"shop","table":"users"},"op":"c"}`), poison: true},
		{name: "before is a number", table: sc.Users, value: []byte(`{"before":42,"after":{"id":5},"source":{"db":"shop","table":"users"},"op":"u"}`), poison: true},
		{name: "op is a number", table: sc.Users, value: []byte(`{"before":null,"after":{"id":5},"source":{"db":"shop","table":"users"},"op":7}`), poison: true},
		{name: "JSON nested 5000 deep", table: sc.Users, value: []byte(`{"before":null,"after":{"id":` + deep + `},"source":{"db":"shop","table":"users"},"op":"c"}`), poison: true},
		{name: "key column missing", table: sc.Comments, value: hostileRow(t, sc.Comments, map[string]any{"id": 1, "author_id": 1, "body": "b", "approved": 1}), poison: true},
		{name: "10 MB invalid JSON", table: sc.Interests, value: []byte(`{"before":null,"after":{"user_id":1,"interest":"` + big), poison: true},

		{name: "key with spaces", table: sc.Users, key: []byte("a key with spaces"), value: hostileRow(t, sc.Users, user("12 34")), keys: []string{userKey("12 34")}},
		{name: "CR/LF: set command", table: sc.Users, key: []byte("k\r\nset x 0 0 1\r\n"), value: hostileRow(t, sc.Users, user(crlfSet)), keys: []string{userKey(crlfSet)}},
		{name: "CR/LF: flush_all", table: sc.Users, value: hostileRow(t, sc.Users, user(crlfFlush)), keys: []string{userKey(crlfFlush)}},
		{name: "CR/LF: delete and incr", table: sc.Users, value: hostileRow(t, sc.Users, user(crlfDelete)), keys: []string{userKey(crlfDelete)}},
		{name: "control bytes", table: sc.Users, value: hostileRow(t, sc.Users, user(controls)), keys: []string{userKey(controls)}},
		{name: "300-byte key", table: sc.Users, value: hostileRow(t, sc.Users, user(longID)), keys: []string{userKey(longID)}},
		{name: "10 MB value", table: sc.Users, value: hostileRow(t, sc.Users, map[string]any{"id": "big", "name": big, "email": "e"}), keys: []string{userKey("big")}},
		{name: "id is an object", table: sc.Users, value: hostileRow(t, sc.Users, user(map[string]any{"$ne": nil})), keys: []string{userKey(`{"$ne":null}`)}},
		{name: "id is an array", table: sc.Users, value: hostileRow(t, sc.Users, user([]any{1, 2})), keys: []string{userKey("[1,2]")}},
		{name: "id is a float", table: sc.Users, value: hostileRow(t, sc.Users, user(json.Number("1.5e3"))), keys: []string{userKey("1.5e3")}},
		{name: "tombstone (null value)", table: sc.Users, key: []byte(`{"id":1}`), value: nil},
	}
	for i, v := range sqlCount {
		key := mustKey(t, blog, "comments:{post_id}", map[string]string{"post_id": v})
		cases = append(cases, hostileCase{
			name: fmt.Sprintf("SQL as a counter key value %d", i+1), table: sc.Comments,
			value: hostileRow(t, sc.Comments, map[string]any{"id": 900000 + i, "post_id": v, "author_id": 1, "body": "b", "approved": 1}),
			check: func(t *testing.T, fs *faultScenario) {
				// Bound, the recount finds no comment of that post: 0.
				// Spliced into the query it would count every approved
				// comment, or fail (and leave the counter missing).
				// The counter lives under the generation of its table
				// current when the daemon applied it (docs/formats.md,
				// "Generations"); the poison messages of the table
				// published with it may have bumped it since, by one
				// each.
				gen, err := Generation(fs.MC, rules.GenerationKey(blog, "blog", "comments"))
				if err != nil {
					t.Error(err)
					return
				}
				var keys []string
				for back := range uint64(len(sqlCount) + 32) {
					keys = append(keys, itemformat.CounterKey(key, gen-back))
				}
				items, err := fs.MC.GetMulti(keys)
				if err != nil {
					t.Errorf("counter %q: %v", key, err)
					return
				}
				var it *memcache.Item
				for _, k := range keys {
					if it = items[k]; it != nil {
						break
					}
				}
				if it == nil {
					t.Errorf("counter %q: missing under the last %d generations", key, len(keys))
					return
				}
				if got := string(trimSpaces(it.Value)); got != "0" {
					t.Errorf("counter %q holds %q; a recount with the value bound counts 0", key, got)
				}
			},
		})
	}
	setKey := mustKey(t, shop, "interests:{user_id}", map[string]string{"user_id": sqlSetUser})
	cases = append(cases, hostileCase{
		name: "SQL as a set key value, CR/LF in the member", table: sc.Interests,
		value: hostileRow(t, sc.Interests, map[string]any{"user_id": sqlSetUser, "interest": sqlSetMember, "active": 1}),
		keys:  []string{setKey},
		check: func(t *testing.T, fs *faultScenario) {
			// Bound, the load finds no interest of that user; spliced in, it
			// would load every active interest of every user.
			it, err := fs.MC.Get(setKey)
			if err != nil {
				t.Errorf("set %q: %v", setKey, err)
				return
			}
			member := string(mustEscape(sqlSetMember))
			for _, m := range itemformat.DecodeSet(it.Value).Members {
				if m != member {
					t.Errorf("set %q holds member %q: loaded with the key value spliced into SQL?", setKey, m)
				}
			}
		},
	})
	// A set that an append would make larger than memcached's 1 MB item
	// limit. The first message creates the set (loaded from MariaDB, which
	// holds no interest of that user: empty), the second, in a later
	// batch, appends 10 MB to it. memcached refuses the append; the set
	// must end up missing or as MariaDB has it (empty), never holding a
	// member cut short.
	bigSetUser := "big set"
	bigSetKey := mustKey(t, shop, "interests:{user_id}", map[string]string{"user_id": bigSetUser})
	cases = append(cases,
		hostileCase{name: "set member: small", table: sc.Interests,
			value: hostileRow(t, sc.Interests, map[string]any{"user_id": bigSetUser, "interest": "small", "active": 1}),
			keys:  []string{bigSetKey}},
		hostileCase{name: "set member: 10 MB", table: sc.Interests, second: true,
			value: hostileRow(t, sc.Interests, map[string]any{"user_id": bigSetUser, "interest": big, "active": 1}),
			check: func(t *testing.T, fs *faultScenario) {
				if it, err := fs.MC.Get(bigSetKey); err == nil {
					if m := itemformat.DecodeSet(it.Value).Members; len(m) > 0 {
						t.Errorf("set %q holds %d members after an append beyond the item limit (%d bytes); MariaDB has none", bigSetKey, len(m), len(it.Value))
					}
				}
			}},
	)
	return cases
}

// mustEscape escapes a value as keys and set members are escaped.
func mustEscape(s string) []byte {
	k, err := rules.Key("", "{v}", map[string]string{"v": s})
	if err != nil {
		panic(err)
	}
	return []byte(k)
}

// TestFaultHostileInput mixes hostile messages into the stream: the daemon
// must not crash, must send each malformed one to the DLQ with the reason
// and move on, and no value may reach memcached as protocol text or
// MariaDB as SQL text.
func TestFaultHostileInput(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioHostile, DLQ: true})
	ctx := context.Background()
	sz := fs.sizes
	db := fs.MySQL.DB()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+canaryTable+" (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+canaryTable+" VALUES (1), (2), (3)"); err != nil {
		t.Fatal(err)
	}
	// Room for 10 MB messages in the CDC topics; the DLQ keeps the
	// broker's default limit (1 MB), as DLQ topics usually do.
	if err := fs.Broker.CreateTopics(ctx, 1, fs.dlq); err != nil {
		t.Fatal(err)
	}
	if err := allowLargeMessages(ctx, fs.Broker, fs.Topics...); err != nil {
		t.Fatal(err)
	}
	d := fs.startDaemon()
	fs.start(ctx)
	fs.roundsUntil(ctx, sz.Events/2)
	if err := fs.MC.Set(&memcache.Item{Key: sentinelKey, Value: []byte(sentinelValue)}); err != nil {
		t.Fatal(err)
	}
	statsBefore, err := memcachedStats(fs.mc.addr)
	if err != nil {
		t.Fatal(err)
	}
	tablesBefore := tableCounts(t, fs)

	cases := hostileCases(t, fs)
	w := &kafka.Writer{Addr: kafka.TCP(fs.Broker.Addrs()...), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchBytes: 64 << 20, BatchTimeout: time.Millisecond, MaxAttempts: 3}
	defer w.Close()
	for _, second := range []bool{false, true} {
		var msgs []kafka.Message
		for i, c := range cases {
			if c.second != second {
				continue
			}
			m := kafka.Message{Topic: fs.topic(c.table), Key: c.key, Value: c.value,
				Headers: []kafka.Header{{Key: "fault-case", Value: []byte(c.name)}}}
			if m.Key == nil {
				m.Key = []byte(strconv.Itoa(i))
			}
			msgs = append(msgs, m)
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("publish the hostile messages: %v", err)
		}
		settle := time.Now()
		fs.settle(ctx, "hostile messages")
		t.Logf("%d hostile messages consumed and committed in %v", len(msgs), time.Since(settle).Round(time.Millisecond))
		if d.exited() {
			t.Fatalf("the daemon died on hostile input; stderr:\n%s", lastLines(d.stderr.String(), 40))
		}
		for _, c := range cases {
			if c.second != second {
				continue
			}
			for _, k := range c.keys {
				if _, err := fs.MC.Get(k); err != nil {
					t.Errorf("%s: key %q: %v", c.name, k, err)
				}
			}
			if c.check != nil {
				c.check(t, fs)
			}
		}
	}

	// The DLQ holds every poison message, with the reason and where it
	// came from, and nothing else.
	dead := readTopic(t, ctx, fs.Broker, fs.dlq)
	byCase := map[string][]Message{}
	for _, m := range dead {
		byCase[m.Headers["fault-case"]] = append(byCase[m.Headers["fault-case"]], m)
	}
	poison, applied := 0, 0
	var reasons []string
	for _, c := range cases {
		got := byCase[c.name]
		if !c.poison {
			applied++
			if len(got) > 0 {
				t.Errorf("%s: sent to the DLQ (%s), but it is a valid message", c.name, got[0].Headers["cachewarden.error"])
			}
			continue
		}
		poison++
		if len(got) != 1 {
			t.Errorf("%s: %d dead letters, want 1", c.name, len(got))
			continue
		}
		h := got[0].Headers
		if h["cachewarden.error"] == "" || h["cachewarden.topic"] != fs.topic(c.table) {
			t.Errorf("%s: dead-letter headers %v, want the error and the topic %s", c.name, h, fs.topic(c.table))
			continue
		}
		switch dropped := h["cachewarden.value-dropped"]; {
		case dropped != "":
			// Too large for the DLQ topic: the reason and the origin, no value.
			if dropped != strconv.Itoa(len(c.value)) || len(got[0].Value) != 0 {
				t.Errorf("%s: dead letter without its value: dropped %s bytes, holds %d; want %d and 0", c.name, dropped, len(got[0].Value), len(c.value))
			}
			fs.note("The %s message went to the DLQ without its value (cachewarden.value-dropped: %s), too large for the DLQ topic.", c.name, dropped)
		case string(got[0].Value) != string(c.value):
			t.Errorf("%s: the dead letter's value differs from the message (%d bytes, want %d)", c.name, len(got[0].Value), len(c.value))
		}
		p, _ := strconv.Atoi(h["cachewarden.partition"])
		off, _ := strconv.ParseInt(h["cachewarden.offset"], 10, 64)
		orig, err := readRange(ctx, fs.Broker, h["cachewarden.topic"], p, off, off+1)
		if err != nil || len(orig) != 1 || string(orig[0].Value) != string(c.value) {
			t.Errorf("%s: the dead letter's origin %s/%d@%d does not hold the message (%v)", c.name, h["cachewarden.topic"], p, off, err)
		}
		reason := h["cachewarden.error"]
		if len(reason) > 90 {
			reason = reason[:90] + "…"
		}
		reasons = append(reasons, c.name+": "+reason)
	}
	t.Logf("dead letters:\n  %s", strings.Join(reasons, "\n  "))

	// memcached: (above) the keys the valid messages name exist,
	// escaped; every key is a legal one of the rules' prefixes; nothing a
	// value spelled as a command was executed.
	keys, err := memcachedKeys(fs.mc.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		switch {
		case k == sentinelKey:
		case strings.HasPrefix(k, itemformat.PositionKeyMark): // the source position items readers on replicas wait for
		case strings.HasPrefix(k, injectedKey):
			t.Errorf("memcached holds %q: a value was executed as a command", k)
		case !strings.HasPrefix(k, "it:shop:") && !strings.HasPrefix(k, "it:blog:"):
			t.Errorf("memcached holds %q, which no rule makes", k)
		case len(k) > 250 || strings.IndexFunc(k, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
			t.Errorf("memcached holds the illegal key %q", k)
		}
	}
	if it, err := fs.MC.Get(sentinelKey); err != nil || string(it.Value) != sentinelValue {
		t.Errorf("sentinel %s changed: %v", sentinelKey, err)
	}
	statsAfter, err := memcachedStats(fs.mc.addr)
	if err != nil {
		t.Fatal(err)
	}
	if n := statsAfter["cmd_flush"] - statsBefore["cmd_flush"]; n != 0 {
		t.Errorf("memcached ran flush_all %d times", n)
	}
	// MariaDB: the tables and their rows are as they were.
	tablesAfter := tableCounts(t, fs)
	for name, n := range tablesBefore {
		if tablesAfter[name] != n {
			t.Errorf("table %s: %d rows, had %d", name, tablesAfter[name], n)
		}
	}
	if len(tablesAfter) != len(tablesBefore) {
		t.Errorf("tables %v, had %v", tablesAfter, tablesBefore)
	}
	fs.events += len(cases)
	fs.fault("%d hostile messages mixed into the stream: %d malformed, each in the DLQ with its reason; %d with hostile values, applied under escaped keys; no memcached command or SQL injected",
		len(cases), poison, applied)
	fs.note("Malformed: %s.", strings.Join(caseNames(cases, true), ", "))
	fs.note("Hostile values: %s.", strings.Join(caseNames(cases, false), ", "))
	fs.note("Checked after them: %d memcached keys listed (lru_crawler metadump), all legal and of the rules' prefixes, no injected key, flush_all count and a sentinel item unchanged; SQL-looking key values counted and loaded as bound values (0, empty); %d tables with their row counts unchanged.",
		len(keys), len(tablesAfter))
	fs.roundsUntil(ctx, sz.Events)
	recordRow(t, started, fs.finish(ctx, d))
}

// caseNames lists the names of the poison (or the valid) cases.
func caseNames(cases []hostileCase, poison bool) []string {
	var out []string
	for _, c := range cases {
		if c.poison == poison {
			out = append(out, c.name)
		}
	}
	return out
}

// tableCounts returns the row count of every table of the scenario's
// database.
func tableCounts(t *testing.T, fs *faultScenario) map[string]int64 {
	t.Helper()
	db := fs.MySQL.DB()
	rows, err := db.Query("SHOW TABLES")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	sort.Strings(names)
	out := map[string]int64{}
	for _, n := range names {
		var c int64
		if err := db.QueryRow("SELECT COUNT(*) FROM `" + n + "`").Scan(&c); err != nil {
			t.Fatal(err)
		}
		out[n] = c
	}
	if _, ok := out[canaryTable]; !ok {
		t.Errorf("table %s is gone", canaryTable)
	}
	return out
}

// readTopic reads every message of a topic, however large.
func readTopic(t *testing.T, ctx context.Context, b *Broker, topic string) []Message {
	t.Helper()
	ends, err := b.EndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []Message
	for p, end := range ends[topic] {
		msgs, err := readRange(ctx, b, topic, p, 0, end)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, msgs...)
	}
	return out
}

// allowLargeMessages raises max.message.bytes of the topics to 64 MB.
func allowLargeMessages(ctx context.Context, b *Broker, topics ...string) error {
	size := strconv.Itoa(64 << 20)
	resp, err := b.admin.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &size}}, topics...)
	if err != nil {
		return fmt.Errorf("raise max.message.bytes: %w", err)
	}
	for _, r := range resp {
		if r.Err != nil {
			return fmt.Errorf("raise max.message.bytes of %s: %w", r.Name, r.Err)
		}
	}
	return nil
}
