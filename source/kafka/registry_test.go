package kafka

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/cachewarden/cachewarden/internal/debeziumavro"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/source/replay"
)

// testRegistry is a schema registry served in-process over HTTP with
// Confluent's REST API (franz-go's srfake), with a switch that makes it
// answer 503 to every request, and a count of the schema-by-id requests
// the daemon makes.
type testRegistry struct {
	fake   *srfake.Registry
	client *sr.Client // what the connector's converter would register with
	down   atomic.Bool
	mu     sync.Mutex
	byID   map[string]int // GET /schemas/ids/{id} requests, by id
}

func newTestRegistry(t *testing.T, opts ...srfake.Option) *testRegistry {
	t.Helper()
	tr := &testRegistry{fake: srfake.New(opts...), byID: map[string]int{}}
	t.Cleanup(tr.fake.Close)
	tr.fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if id, ok := strings.CutPrefix(r.URL.Path, "/schemas/ids/"); ok && r.Method == http.MethodGet && !strings.Contains(id, "/") {
			tr.mu.Lock()
			tr.byID[id]++
			tr.mu.Unlock()
		}
		if tr.down.Load() {
			http.Error(w, `{"error_code":50003,"message":"registry is restarting"}`, http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	var err error
	if tr.client, err = sr.NewClient(sr.URLs(tr.fake.URL())); err != nil {
		t.Fatal(err)
	}
	return tr
}

// daemonClient is the daemon's side: a SchemaRegistry over tr.
func (tr *testRegistry) daemonClient(t *testing.T, c RegistryConfig) *SchemaRegistry {
	t.Helper()
	c.URLs = []string{tr.fake.URL()}
	c.Timeout = 2 * time.Second
	reg, err := NewSchemaRegistry(c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// requests returns the schema-by-id requests made, by id.
func (tr *testRegistry) requests() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[string]int, len(tr.byID))
	for k, v := range tr.byID {
		out[k] = v
	}
	return out
}

// avroTables are the tables of daemonRules as Debezium's MySQL connector
// writes them in Avro, on topics named "<prefix>.<db>.<table>".
func avroTables(prefix string) (users, interests, comments debeziumavro.Table) {
	users = debeziumavro.Table{Topic: prefix + ".shop.users", Key: []string{"id"}, Columns: []debeziumavro.Column{
		{Name: "id", Type: debeziumavro.Long}, {Name: "name", Type: debeziumavro.String, Optional: true}}}
	interests = debeziumavro.Table{Topic: prefix + ".shop.user_interests", Key: []string{"user_id", "interest_id"}, Columns: []debeziumavro.Column{
		{Name: "user_id", Type: debeziumavro.Long}, {Name: "interest_id", Type: debeziumavro.Int}}}
	comments = debeziumavro.Table{Topic: prefix + ".blog.comments", Key: []string{"id"}, Columns: []debeziumavro.Column{
		{Name: "id", Type: debeziumavro.Long}, {Name: "post_id", Type: debeziumavro.Long},
		{Name: "score", Type: debeziumavro.Decimal(10, 2), Optional: true}}}
	return users, interests, comments
}

func register(t *testing.T, tr *testRegistry, table debeziumavro.Table) *debeziumavro.Encoder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := debeziumavro.Register(ctx, tr.client, table, false)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// avroChange is a Kafka message of a change encoded by e: key from the
// row image, source block of a binlog change of db.table.
func avroChange(t *testing.T, e *debeziumavro.Encoder, op, db, table string, before, after map[string]any) kafka.Message {
	t.Helper()
	src := debeziumavro.Source{Name: "cdc", TsMs: 1700000000000, Snapshot: "false", DB: db, Table: table,
		ServerID: 1, File: "mysql-bin.000003", Pos: 154, Thread: 7}
	v, err := e.Envelope(op, before, after, src, 1700000000003)
	if err != nil {
		t.Fatal(err)
	}
	img := after
	if img == nil {
		img = before
	}
	k, err := e.Key(img)
	if err != nil {
		t.Fatal(err)
	}
	return kafka.Message{Key: k, Value: v}
}

// TestAvroDaemon runs the daemon on Avro topics of every rule kind and
// op, read through a registry: memcached ends as with the same changes in
// JSON (TestDaemonAppliesDebeziumEvents); each schema is asked for once;
// a schema evolved mid-stream (a column added, then one dropped) is read
// without a restart; and a set whose Avro message key is made of the
// set's columns is appended to while one keyed by another column is
// deleted (the ordering check reads Avro keys).
func TestAvroDaemon(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	tr := newTestRegistry(t)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn, schemas: tr.daemonClient(t, RegistryConfig{})})
	prefix := "cdc" + testsvc.Unique()
	users, interests, comments := avroTables(prefix)
	byID := interests
	byID.Topic = prefix + ".shop.user_interests_by_id"
	byID.Columns = append([]debeziumavro.Column{{Name: "id", Type: debeziumavro.Long}}, interests.Columns...)
	byID.Key = []string{"id"}
	group := "cw-" + testsvc.Unique()
	topics := []string{users.Topic, interests.Topic, comments.Topic, byID.Topic}
	brokers := testsvc.KafkaTopics(t, 2, topics...)
	eu, ei, ec, eb := register(t, tr, users), register(t, tr, interests), register(t, tr, comments), register(t, tr, byID)

	createComments(t, db, 9, 3)
	r.set("ns:user:1", "10")
	r.set("interests:7", "+1 ")
	r.set("interests:8", "+1 ")
	r.set("comments:9", "100") // wrong: the first batch must recount it

	produce(t, brokers, users.Topic,
		avroChange(t, eu, "c", "shop", "users", nil, row("id", int64(1), "name", "a")),
		avroChange(t, eu, "c", "shop", "users", nil, row("id", int64(2), "name", nil)),
	)
	produce(t, brokers, interests.Topic,
		avroChange(t, ei, "c", "shop", "user_interests", nil, row("user_id", int64(7), "interest_id", int32(2))),
		avroChange(t, ei, "d", "shop", "user_interests", row("user_id", int64(7), "interest_id", int32(1)), nil),
	)
	produce(t, brokers, comments.Topic,
		avroChange(t, ec, "c", "blog", "comments", nil, row("id", int64(100), "post_id", int64(9), "score", "12.50")))
	produce(t, brokers, byID.Topic,
		avroChange(t, eb, "c", "shop", "user_interests", nil, row("id", int64(5), "user_id", int64(8), "interest_id", int32(3))))
	d, stop := r.daemon(brokers, group, topics...)
	caughtUp := func(want map[string]int64) func() string {
		return func() string {
			for topic, n := range want {
				c := committed(t, brokers, group, topic, 0, 1)
				if got := max(c[0], 0) + max(c[1], 0); got != n {
					return fmt.Sprintf("%s: committed %d messages, want %d", topic, got, n)
				}
			}
			return ""
		}
	}
	waitFor(t, 20*time.Second, caughtUp(map[string]int64{users.Topic: 2, interests.Topic: 2, comments.Topic: 1, byID.Topic: 1}))
	for k, want := range map[string]string{
		"ns:user:1":   "11",
		"interests:7": "+1 +2 -1 ",
		"interests:8": "<missing>", // keyed by id on two partitions: deleted
		"comments:9":  "3",
	} {
		if got := r.get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_set_rule_unordered", "rule=user-interests", "topic="+byID.Topic); got != 1 {
		t.Errorf("set rule unordered on %s = %v, want 1", byID.Topic, got)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_set_rule_unordered", "rule=user-interests", "topic="+interests.Topic); got != 0 {
		t.Errorf("set rule unordered on %s = %v, want 0: its Avro key is (user_id, interest_id)", interests.Topic, got)
	}
	if !d.Ready() {
		t.Errorf("not ready while consuming")
	}

	// The users table gains a column, then loses one: the connector
	// registers each new schema and its messages carry the new ids.
	added := users
	added.Columns = append(append([]debeziumavro.Column{}, users.Columns...), debeziumavro.Column{Name: "email", Type: debeziumavro.String, Optional: true})
	eAdded := register(t, tr, added)
	dropped := added
	dropped.Columns = []debeziumavro.Column{added.Columns[0], added.Columns[2]}
	eDropped := register(t, tr, dropped)
	produce(t, brokers, users.Topic,
		avroChange(t, eAdded, "u", "shop", "users", row("id", int64(1), "name", "a", "email", nil), row("id", int64(1), "name", "a", "email", "a@x")),
		avroChange(t, eDropped, "u", "shop", "users", row("id", int64(1), "email", "a@x"), row("id", int64(1), "email", "b@x")),
		avroChange(t, eu, "u", "shop", "users", row("id", int64(1), "name", "a"), row("id", int64(1), "name", "c")),
	)
	waitFor(t, 20*time.Second, caughtUp(map[string]int64{users.Topic: 5}))
	// Bumps of one key in one batch are coalesced: 12 to 14.
	if got := r.get("ns:user:1"); got < "12" || got > "14" || len(got) != 2 {
		t.Errorf("ns:user:1 after the evolved schemas = %q, want 12 to 14", got)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_events_total", "topic="+users.Topic, "format=avro", "outcome=planned"); got != 5 {
		t.Errorf("planned users events = %v, want 5", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_poison_messages_total", "topic="+users.Topic); got != 0 {
		t.Errorf("%v poison messages", got)
	}
	reqs := tr.requests()
	// Eight value and key schemas, then two evolved users schemas (their
	// key schema is the same id).
	if len(reqs) != 10 {
		t.Errorf("schema ids asked for: %v, want 10", reqs)
	}
	for id, n := range reqs {
		if n != 1 {
			t.Errorf("schema id %s asked for %d times, want once", id, n)
		}
	}
}

// avroUsersRig is a rig reading one users topic in Avro through tr, with
// a dead-letter topic; e encodes the topic's changes.
type avroUsersRig struct {
	*rig
	tr                     *testRegistry
	brokers                []string
	topic, dlqTopic, group string
	e                      *debeziumavro.Encoder
}

func newAvroUsersRig(t *testing.T) *avroUsersRig {
	t.Helper()
	a := &avroUsersRig{tr: newTestRegistry(t), topic: "cdc" + testsvc.Unique() + ".shop.users",
		dlqTopic: "dlq-" + testsvc.Unique(), group: "cw-" + testsvc.Unique()}
	a.brokers = testsvc.KafkaTopics(t, 1, a.topic, a.dlqTopic)
	dlq, err := NewDLQ(KafkaConn{Brokers: a.brokers}, a.dlqTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dlq.Close() })
	a.rig = newRig(t, daemonRules, rigOptions{poison: dlq, schemas: a.tr.daemonClient(t, RegistryConfig{})})
	users, _, _ := avroTables("x")
	users.Topic = a.topic
	a.e = register(t, a.tr, users)
	return a
}

// TestAvroRegistryDown: while the registry cannot answer for a schema a
// batch needs, the partition holds (nothing applied, nothing committed,
// nothing sent to the DLQ) and the daemon is not ready; once it answers,
// the batch is applied and the daemon is ready again.
func TestAvroRegistryDown(t *testing.T) {
	a := newAvroUsersRig(t)
	tr, topic, group, brokers, r, e := a.tr, a.topic, a.group, a.brokers, a.rig, a.e
	r.set("ns:user:4", "20")
	tr.down.Store(true)
	produce(t, brokers, topic, avroChange(t, e, "u", "shop", "users", row("id", int64(4), "name", "a"), row("id", int64(4), "name", "b")))
	d, stop := r.daemon(brokers, group, topic)
	defer stop()
	waitFor(t, 20*time.Second, func() string {
		if !r.pipeline.WaitingForSchemas() || testsvc.Metric(t, r.reg, "cachewarden_schema_registry_waiting_batches") != 1 {
			return "no batch waits for the registry"
		}
		return ""
	})
	// Retries, however long a loaded machine takes to make them.
	waitFor(t, 30*time.Second, func() string {
		if n := tr.requests()[fmt.Sprint(mustID(e))]; n < 2 {
			return fmt.Sprintf("the schema was asked for %d times while the registry was down, want retries", n)
		}
		return ""
	})
	if d.Ready() {
		t.Errorf("ready while a batch waits for the registry")
	}
	if off := committed(t, brokers, group, topic, 0)[0]; off > 0 {
		t.Errorf("committed %d while the registry is down", off)
	}
	if got := r.get("ns:user:4"); got != "20" {
		t.Errorf("ns:user:4 = %q while the registry is down, want 20", got)
	}
	if !strings.Contains(r.logs.String(), "cannot read message schemas from the schema registry") {
		t.Errorf("the wait is not logged")
	}

	tr.down.Store(false)
	waitFor(t, 20*time.Second, func() string {
		if off := committed(t, brokers, group, topic, 0)[0]; off != 1 {
			return fmt.Sprintf("committed offset %d, want 1", off)
		}
		if !d.Ready() {
			return "not ready after the registry came back"
		}
		return ""
	})
	if got := r.get("ns:user:4"); got != "21" {
		t.Errorf("ns:user:4 = %q, want 21", got)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_poison_messages_total", "topic="+topic); got != 0 {
		t.Errorf("%v poison messages: a registry outage made messages poison", got)
	}
	if r.pipeline.WaitingForSchemas() || testsvc.Metric(t, r.reg, "cachewarden_schema_registry_waiting_batches") != 0 {
		t.Errorf("still waiting for the registry")
	}
}

func mustID(e *debeziumavro.Encoder) int {
	id, _ := e.IDs()
	return id
}

// TestAvroPoison: a message whose schema id the registry does not know,
// one whose body is cut short, and one of a schema registered as
// Protobuf are poison with errors saying so; the partition moves on.
func TestAvroPoison(t *testing.T) {
	a := newAvroUsersRig(t)
	tr, topic, dlqTopic, group, brokers, r, e := a.tr, a.topic, a.dlqTopic, a.group, a.brokers, a.rig, a.e
	proto, err := tr.client.CreateSchema(context.Background(), "other-value", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; message M { int64 id = 1; }`})
	if err != nil {
		t.Fatal(err)
	}
	r.set("ns:user:6", "30")
	good := avroChange(t, e, "u", "shop", "users", row("id", int64(6), "name", "a"), row("id", int64(6), "name", "b"))
	unknown := kafka.Message{Value: debeziumavro.Frame(987654, good.Value[5:])}
	cut := kafka.Message{Value: good.Value[:len(good.Value)-30]}
	protobuf := kafka.Message{Value: debeziumavro.Frame(proto.ID, []byte{0, 2, 8, 1})}
	produce(t, brokers, topic, unknown, cut, protobuf, good)
	_, stop := r.daemon(brokers, group, topic)
	waitCommitted(t, brokers, group, topic, 4)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.get("ns:user:6"); got != "31" {
		t.Errorf("ns:user:6 = %q, want 31: the good message after the poison applies", got)
	}
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: dlqTopic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, want := range []string{
		"schema id 987654 is unknown to the schema registry",
		"cut short",
		"registered as a PROTOBUF schema",
	} {
		m, err := reader.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("DLQ record %d: %v", i, err)
		}
		for _, h := range m.Headers {
			if h.Key == HeaderError && !strings.Contains(string(h.Value), want) {
				t.Errorf("DLQ record %d: error %q lacks %q", i, h.Value, want)
			}
		}
	}
}

// TestSchemaRegistryAuth: basic auth is sent; wrong credentials are not
// taken for a missing schema (the batch would wait, not go to the DLQ).
func TestSchemaRegistryAuth(t *testing.T) {
	// "cw:pw" in base64.
	tr := newTestRegistry(t, srfake.WithAuth("Basic Y3c6cHc="))
	tr.client, _ = sr.NewClient(sr.URLs(tr.fake.URL()), sr.BasicAuth("cw", "pw"))
	users, _, _ := avroTables("auth")
	id := mustID(register(t, tr, users))
	ctx := context.Background()
	good := tr.daemonClient(t, RegistryConfig{Username: "cw", Password: "pw"})
	if err := good.Fetch(ctx, []uint32{uint32(id)}); err != nil || good.Cache().Lookup(uint32(id)) == nil {
		t.Fatalf("fetch with the right credentials: %v", err)
	}
	bad := tr.daemonClient(t, RegistryConfig{Username: "cw", Password: "wrong"})
	err := bad.Fetch(ctx, []uint32{uint32(id)})
	if err == nil || schemaNotFound(err) || bad.Cache().Lookup(uint32(id)) != nil {
		t.Errorf("fetch with wrong credentials: %v (not found: %v)", err, schemaNotFound(err))
	}
	missing := good.Fetch(ctx, []uint32{424242})
	if missing != nil || good.Cache().Lookup(424242) != nil {
		t.Errorf("an unknown id: %v; want no error and nothing cached", missing)
	}
	dead, err := NewSchemaRegistry(RegistryConfig{URLs: []string{"http://" + testsvc.ClosedAddr(t)}, Timeout: time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Fetch(ctx, []uint32{1}); err == nil || schemaNotFound(err) {
		t.Errorf("fetch from a registry nothing listens at: %v", err)
	}
}

// TestAvroReplayKafka replays an Avro topic from Kafka, applying and as a
// dry run: the schemas are read from the registry as the daemon reads
// them, counter changes end as recounts, and the dry run prints the
// planned ops.
func TestAvroReplayKafka(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	createComments(t, db, 9, 4)
	tr := newTestRegistry(t)
	users, _, comments := avroTables("cdc" + testsvc.Unique())
	brokers := testsvc.KafkaTopics(t, 1, users.Topic, comments.Topic)
	eu, ec := register(t, tr, users), register(t, tr, comments)
	produce(t, brokers, users.Topic,
		avroChange(t, eu, "c", "shop", "users", nil, row("id", int64(1), "name", "a")),
		avroChange(t, eu, "u", "shop", "users", row("id", int64(2), "name", "a"), row("id", int64(2), "name", "b")))
	produce(t, brokers, comments.Topic,
		avroChange(t, ec, "c", "blog", "comments", nil, row("id", int64(1), "post_id", int64(9), "score", nil)),
		avroChange(t, ec, "d", "blog", "comments", row("id", int64(2), "post_id", int64(9), "score", "-0.50"), nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := KafkaConn{Brokers: brokers}
	ranges, err := ResolveReplayRanges(ctx, conn, []string{users.Topic, comments.Topic}, ReplayBound{Earliest: true}, ReplayBound{}, nil)
	if err != nil {
		t.Fatal(err)
	}

	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn, schemas: tr.daemonClient(t, RegistryConfig{})})
	r.set("ns:user:2", "7")
	r.set("comments:9", "100")
	var report lockedBuffer
	sum, err := r.replayer(replay.Config{Report: &report}).Replay(ctx, replay.Input{Streams: replayStreams(conn, ranges)})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if sum.Messages != 4 || sum.Poison != 0 || sum.Recounts != 1 || report.String() != "" {
		t.Errorf("summary %s, report %q", sum, report.String())
	}
	if got := r.get("ns:user:2"); got != "8" {
		t.Errorf("ns:user:2 = %q, want 8", got)
	}
	if got := r.get("comments:9"); got != "4" {
		t.Errorf("comments:9 = %q, want MySQL's 4", got)
	}

	dry := newRig(t, daemonRules, rigOptions{prefix: "p:", schemas: tr.daemonClient(t, RegistryConfig{})})
	var out bytes.Buffer
	if _, err := dry.replayer(replay.Config{Report: &report}).DryRun(ctx, replay.Input{Streams: replayStreams(conn, ranges)}, &out); err != nil {
		t.Fatal(err)
	}
	want := `{"line":1,"rule":"post-comments","op":"count","key":"p:comments:9","delta":1}
{"line":2,"rule":"post-comments","op":"count","key":"p:comments:9","delta":-1}
{"line":3,"rule":"user-profile","op":"bump","key":"p:ns:user:1"}
{"line":4,"rule":"user-profile","op":"bump","key":"p:ns:user:2"}
{"rule":"post-comments","op":"recount","key":"p:comments:9"}
`
	if out.String() != want || report.String() != "" {
		t.Errorf("dry run:\n%s\nwant:\n%s\nreport %q", out.String(), want, report.String())
	}
}

// TestUnknownSchemaIDsCachedNegatively: an id the registry does not know
// is asked once per negativeSchemaTTL, whatever the number of its
// messages, and the warnings of many unknown ids are one line per
// unknownSchemaLogInterval that counts the others.
func TestUnknownSchemaIDsCachedNegatively(t *testing.T) {
	tr := newTestRegistry(t)
	reg := tr.daemonClient(t, RegistryConfig{})
	log, logs := testLogger(t)
	reg.log = log
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg.now = func() time.Time { return clock }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 200
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(900000 + i)
	}
	total := func() (sum int) {
		for _, c := range tr.requests() {
			sum += c
		}
		return sum
	}
	warnings := func() int { return strings.Count(logs.String(), "schema id unknown to the registry") }
	for range 5 { // five batches of messages framed with the same ids
		if err := reg.Fetch(ctx, ids); err != nil {
			t.Fatal(err)
		}
		clock = clock.Add(negativeSchemaTTL / 10)
	}
	if got := total(); got != n {
		t.Errorf("%d registry requests for %d unknown ids in 5 batches, want %d", got, n, n)
	}
	if got := warnings(); got != 1 {
		t.Errorf("%d warnings, want 1:\n%s", got, logs.String())
	}
	clock = clock.Add(negativeSchemaTTL)
	if err := reg.Fetch(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if got := total(); got != 2*n {
		t.Errorf("%d registry requests after the negative cache expired, want %d", got, 2*n)
	}
	if got := warnings(); got != 2 || !strings.Contains(logs.String(), fmt.Sprintf("other_unknown_ids_not_logged=%d", n-1)) {
		t.Errorf("%d warnings, want 2, the second counting %d ids not logged:\n%s", got, n-1, logs.String())
	}
	// The negative cache is bounded in entries.
	for i := range maxUnknownSchemaIDs + 100 {
		reg.rememberUnknown(uint32(i), clock)
	}
	if len(reg.unknown) > maxUnknownSchemaIDs {
		t.Errorf("%d ids remembered as unknown, want at most %d", len(reg.unknown), maxUnknownSchemaIDs)
	}
}

// replayer returns a Replayer over the rig's pipeline with cfg.
func (r *rig) replayer(cfg replay.Config) *replay.Replayer {
	r.t.Helper()
	cfg.Pipeline, cfg.Logger = r.pipeline, r.log
	rp, err := replay.New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return rp
}

// replayStreams returns the streams that read ranges through conn.
func replayStreams(conn KafkaConn, ranges []PartitionRange) []replay.Stream {
	var out []replay.Stream
	for _, st := range RangeStreams(conn, ranges, 0, nil) {
		out = append(out, st)
	}
	return out
}
