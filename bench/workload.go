package bench

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
)

// KeyPrefix is the prefix of every key in the benchmark rule file
// (bench/testdata/rules.yaml).
const KeyPrefix = "bench:"

// SampleIDBase is the first user id of latency samples: far above any id
// of the key space, so that each sample's namespace key is new.
const SampleIDBase = 1_000_000_000_000

// Event mix, in percent of all events (the rest are comment changes).
const (
	userSharePct     = 40 // bench.users updates: namespace bumps
	interestSharePct = 30 // bench.user_interests inserts/deletes: set appends
	// interestDeletePct is the share of user_interests changes that are
	// deletes (a "-member" token); the rest are inserts.
	interestDeletePct = 40
	// commentDeletePct is the share of comments changes that are deletes
	// (a -1 delta); the rest are inserts (+1).
	commentDeletePct = 30
)

// Distribution says how entity ids are drawn.
type Distribution string

// The key distributions.
const (
	// Uniform draws every id of [1, Keys] with the same probability.
	Uniform Distribution = "uniform"
	// Zipf draws id k+1 with probability proportional to 1/(1+k)^s, so a
	// few hot entities receive most changes.
	Zipf Distribution = "zipf"
	// Counter is the counter workload: the uniform stream, with events
	// that name the MySQL server of the counter database (Source), run
	// by the daemon with a MySQL DSN and the comment counter's recount
	// query. Generators treat it as Uniform.
	Counter Distribution = "counter"
)

// Workload describes a stream of generated Debezium change events.
type Workload struct {
	// Dist is how entity ids are drawn.
	Dist Distribution
	// Keys is the number of distinct entities of each table (users,
	// posts); ids run from 1 to Keys.
	Keys int
	// ZipfS is the Zipf exponent s (> 1) used when Dist is Zipf.
	ZipfS float64
	// Seed makes the stream reproducible: the same Workload yields the
	// same events.
	Seed uint64
	// Source, when set, is the database the events claim to come from
	// (the counter workload names the MariaDB its recounts run on, so
	// that fences compare the events' positions with the recounts'). By
	// default the events come from server 223344, binary log
	// mysql-bin.000042 from position 4, with MySQL GTIDs.
	Source *BinlogSource
}

// BinlogSource is a database server's binary log as the events' Debezium
// source block names it.
type BinlogSource struct {
	// ServerID is the server's @@server_id.
	ServerID uint32
	// File is the binary log file the events are in, and Pos the position
	// of the first event (each later one is 512 bytes further).
	File string
	Pos  int64
}

// EventKind is the table a generated event changes.
type EventKind uint8

// The generated tables.
const (
	// UserUpdate is an update of bench.users (namespace rule "user").
	UserUpdate EventKind = iota
	// InterestChange is an insert or delete in bench.user_interests (set
	// rule "user-interests").
	InterestChange
	// CommentChange is an insert or delete in bench.comments (counter rule
	// "post-comments").
	CommentChange
)

// Generator produces the events of a Workload. It is not safe for
// concurrent use.
type Generator struct {
	w     Workload
	rng   *rand.Rand
	zipf  *rand.Zipf
	seq   uint64 // events generated: drives binlog positions and timestamps
	comID uint64 // last comment id
}

// NewGenerator returns a Generator for w. Keys must be positive and, for
// Zipf, ZipfS greater than 1.
func NewGenerator(w Workload) (*Generator, error) {
	if w.Keys <= 0 {
		return nil, fmt.Errorf("bench: workload keys must be positive, got %d", w.Keys)
	}
	g := &Generator{w: w, rng: rand.New(rand.NewPCG(w.Seed, 0x9e3779b97f4a7c15))}
	switch w.Dist {
	case Uniform, Counter:
	case Zipf:
		if w.ZipfS <= 1 {
			return nil, fmt.Errorf("bench: zipf exponent must be > 1, got %v", w.ZipfS)
		}
		g.zipf = rand.NewZipf(g.rng, w.ZipfS, 1, uint64(w.Keys-1))
	default:
		return nil, fmt.Errorf("bench: unknown key distribution %q", w.Dist)
	}
	return g, nil
}

// id draws an entity id in [1, Keys].
func (g *Generator) id() uint64 {
	if g.zipf != nil {
		return g.zipf.Uint64() + 1
	}
	return g.rng.Uint64N(uint64(g.w.Keys)) + 1
}

// Next appends the next event's Kafka message key and value to the given
// buffers and returns them with the event's kind.
func (g *Generator) Next(key, value []byte) ([]byte, []byte, EventKind) {
	g.seq++
	r := g.rng.IntN(100)
	switch {
	case r < userSharePct:
		id := g.id()
		key, value = g.user(key, value, id)
		return key, value, UserUpdate
	case r < userSharePct+interestSharePct:
		key, value = g.interest(key, value, g.id(), g.rng.IntN(100) < interestDeletePct)
		return key, value, InterestChange
	default:
		key, value = g.comment(key, value, g.id(), g.rng.IntN(100) < commentDeletePct)
		return key, value, CommentChange
	}
}

// Sample appends a bench.users update for user id SampleIDBase+n: its
// namespace key (SampleKey(n)) exists in no cache until a consumer applies
// the event.
func (g *Generator) Sample(key, value []byte, n uint64) ([]byte, []byte) {
	g.seq++
	return g.user(key, value, SampleIDBase+n)
}

// SampleKey is the memcached key that the event of Sample(n) bumps.
func SampleKey(n uint64) string {
	return KeyPrefix + "ns:user:" + strconv.FormatUint(SampleIDBase+n, 10)
}

// Seed keys: the items a warm cache holds before the stream starts.

// UserKey is the namespace key of user id.
func UserKey(id uint64) string { return KeyPrefix + "ns:user:" + strconv.FormatUint(id, 10) }

// InterestsKey is the set key of user id's interests.
func InterestsKey(id uint64) string { return KeyPrefix + "interests:" + strconv.FormatUint(id, 10) }

// CommentsKey is the counter key of post id's comments.
func CommentsKey(id uint64) string { return KeyPrefix + "comments:" + strconv.FormatUint(id, 10) }

const (
	baseTsMs   = 1_767_000_000_000 // source timestamps start here (ms)
	binlogFile = `"mysql-bin.000042"`
)

// Debezium 3.x MySQL connector envelope, schema-less (value converter
// without schemas): {"before","after","source","transaction","op","ts_ms",...}.
func (g *Generator) envelope(dst []byte, table string, before, after func([]byte) []byte, op byte) []byte {
	ts := baseTsMs + g.seq/50 // 50 changes per millisecond
	dst = append(dst, `{"before":`...)
	if before == nil {
		dst = append(dst, "null"...)
	} else {
		dst = before(dst)
	}
	dst = append(dst, `,"after":`...)
	if after == nil {
		dst = append(dst, "null"...)
	} else {
		dst = after(dst)
	}
	dst = append(dst, `,"source":{"version":"3.1.2.Final","connector":"mysql","name":"benchdb","ts_ms":`...)
	dst = strconv.AppendUint(dst, ts, 10)
	dst = append(dst, `,"ts_us":`...)
	dst = strconv.AppendUint(dst, ts*1000, 10)
	dst = append(dst, `,"ts_ns":`...)
	dst = strconv.AppendUint(dst, ts*1_000_000, 10)
	dst = append(dst, `,"snapshot":"false","db":"bench","sequence":null,"table":"`...)
	dst = append(dst, table...)
	if src := g.w.Source; src != nil {
		// MariaDB: GTIDs are domain-server-sequence.
		dst = append(dst, `","server_id":`...)
		dst = strconv.AppendUint(dst, uint64(src.ServerID), 10)
		dst = append(dst, `,"gtid":"0-`...)
		dst = strconv.AppendUint(dst, uint64(src.ServerID), 10)
		dst = append(dst, '-')
		dst = strconv.AppendUint(dst, 1000+g.seq, 10)
		dst = append(dst, `","file":`...)
		dst = strconv.AppendQuote(dst, src.File)
		dst = append(dst, `,"pos":`...)
		dst = strconv.AppendUint(dst, uint64(src.Pos)+(g.seq-1)*512, 10)
	} else {
		dst = append(dst, `","server_id":223344,"gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:`...)
		dst = strconv.AppendUint(dst, 1000+g.seq, 10)
		dst = append(dst, `","file":`...)
		dst = append(dst, binlogFile...)
		dst = append(dst, `,"pos":`...)
		dst = strconv.AppendUint(dst, 4+g.seq*512, 10)
	}
	dst = append(dst, `,"row":0,"thread":`...)
	dst = strconv.AppendUint(dst, 7+g.seq%16, 10)
	dst = append(dst, `,"query":null},"transaction":null,"op":"`...)
	dst = append(dst, op)
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendUint(dst, ts+3, 10)
	dst = append(dst, `,"ts_us":`...)
	dst = strconv.AppendUint(dst, (ts+3)*1000+417, 10)
	dst = append(dst, `,"ts_ns":`...)
	dst = strconv.AppendUint(dst, (ts+3)*1_000_000+417_215, 10)
	return append(dst, '}')
}

var countries = [...]string{"DE", "FR", "US", "BR", "JP", "IN", "GB", "ES", "IT", "NL"}

// userRow appends a bench.users row image.
func userRow(dst []byte, id uint64, version uint64) []byte {
	ids := strconv.FormatUint(id, 10)
	dst = append(dst, `{"id":`...)
	dst = append(dst, ids...)
	dst = append(dst, `,"email":"user`...)
	dst = append(dst, ids...)
	dst = append(dst, `@example.com","name":"User `...)
	dst = append(dst, ids...)
	dst = append(dst, ` v`...)
	dst = strconv.AppendUint(dst, version, 10)
	dst = append(dst, `","avatar_url":"https://cdn.example.com/avatars/`...)
	dst = append(dst, ids...)
	dst = append(dst, `.png","country":"`...)
	dst = append(dst, countries[id%uint64(len(countries))]...)
	dst = append(dst, `","plan":"standard","login_count":`...)
	dst = strconv.AppendUint(dst, version, 10)
	dst = append(dst, `,"created_at":"2024-03-0`...)
	dst = strconv.AppendUint(dst, 1+id%9, 10)
	dst = append(dst, `T08:15:00Z","updated_at":"2026-01-0`...)
	dst = strconv.AppendUint(dst, 1+version%9, 10)
	dst = append(dst, `T12:00:00Z"}`...)
	return dst
}

func (g *Generator) user(key, value []byte, id uint64) ([]byte, []byte) {
	key = append(key, `{"id":`...)
	key = strconv.AppendUint(key, id, 10)
	key = append(key, '}')
	version := g.seq
	value = g.envelope(value, "users",
		func(b []byte) []byte { return userRow(b, id, version) },
		func(b []byte) []byte { return userRow(b, id, version+1) },
		'u')
	return key, value
}

// interestRow appends a bench.user_interests row image.
func interestRow(dst []byte, userID, interestID, seq uint64) []byte {
	dst = append(dst, `{"user_id":`...)
	dst = strconv.AppendUint(dst, userID, 10)
	dst = append(dst, `,"interest_id":`...)
	dst = strconv.AppendUint(dst, interestID, 10)
	dst = append(dst, `,"active":1,"weight":`...)
	dst = strconv.AppendUint(dst, seq%100, 10)
	dst = append(dst, `,"source":"onboarding-questionnaire","label":"interest number `...)
	dst = strconv.AppendUint(dst, interestID, 10)
	dst = append(dst, ` picked by the user on the profile page","created_at":"2025-11-2`...)
	dst = strconv.AppendUint(dst, seq%10, 10)
	dst = append(dst, `T09:41:00Z","updated_at":"2026-01-1`...)
	dst = strconv.AppendUint(dst, seq%10, 10)
	dst = append(dst, `T09:41:00Z"}`...)
	return dst
}

func (g *Generator) interest(key, value []byte, userID uint64, del bool) ([]byte, []byte) {
	interestID := g.rng.Uint64N(500) + 1
	key = append(key, `{"user_id":`...)
	key = strconv.AppendUint(key, userID, 10)
	key = append(key, `,"interest_id":`...)
	key = strconv.AppendUint(key, interestID, 10)
	key = append(key, '}')
	seq := g.seq
	row := func(b []byte) []byte { return interestRow(b, userID, interestID, seq) }
	if del {
		value = g.envelope(value, "user_interests", row, nil, 'd')
	} else {
		value = g.envelope(value, "user_interests", nil, row, 'c')
	}
	return key, value
}

const commentBody = "Thanks for the write-up. We hit the same problem with stale " +
	"fragments after a deploy and ended up versioning the keys per entity; " +
	"the part about replicas lagging behind the primary was new to me though."

// commentRow appends a bench.comments row image.
func commentRow(dst []byte, id, postID uint64) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, `,"post_id":`...)
	dst = strconv.AppendUint(dst, postID, 10)
	dst = append(dst, `,"author_id":`...)
	dst = strconv.AppendUint(dst, id%99991+1, 10)
	dst = append(dst, `,"approved":1,"body":"`...)
	dst = append(dst, commentBody...)
	dst = append(dst, `","created_at":"2026-01-14T10:2`...)
	dst = strconv.AppendUint(dst, id%10, 10)
	dst = append(dst, `:00Z"}`...)
	return dst
}

func (g *Generator) comment(key, value []byte, postID uint64, del bool) ([]byte, []byte) {
	var id uint64
	if del && g.comID > 0 {
		id = g.rng.Uint64N(g.comID) + 1 // an earlier comment
	} else {
		g.comID++
		id = g.comID
	}
	key = append(key, `{"id":`...)
	key = strconv.AppendUint(key, id, 10)
	key = append(key, '}')
	row := func(b []byte) []byte { return commentRow(b, id, postID) }
	if del {
		value = g.envelope(value, "comments", row, nil, 'd')
	} else {
		value = g.envelope(value, "comments", nil, row, 'c')
	}
	return key, value
}

// SetSourceTime overwrites the source timestamps (ts_ms, ts_us, ts_ns of
// the source block) of a generated event in place with ms, Unix
// milliseconds of 13 digits like the generated ones, so that the daemon's
// event age (now minus the source time) measures from the moment the
// event is produced. It reports false when value holds no such fields.
func SetSourceTime(value []byte, ms int64) bool {
	i := bytes.Index(value, []byte(`"source":{`))
	if i < 0 {
		return false
	}
	src := value[i:]
	ok := true
	for _, f := range []struct {
		name  string
		scale int64
	}{{`"ts_ms":`, 1}, {`"ts_us":`, 1000}, {`"ts_ns":`, 1_000_000}} {
		j := bytes.Index(src, []byte(f.name))
		if j < 0 {
			ok = false
			continue
		}
		digits := src[j+len(f.name):]
		n := 0
		for n < len(digits) && digits[n] >= '0' && digits[n] <= '9' {
			n++
		}
		v := strconv.AppendInt(make([]byte, 0, 20), ms*f.scale, 10)
		if len(v) != n {
			ok = false
			continue
		}
		copy(digits, v)
	}
	return ok
}
