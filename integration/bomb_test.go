package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// bombBytesEnv sets how many bytes each compression bomb of
// TestCompressionBombs decompresses to; default defaultBombBytes.
const bombBytesEnv = "CACHEWARDEN_TEST_BOMB_BYTES"

// bombCodecsEnv, when set, names the codecs TestCompressionBombs
// publishes bombs of (comma-separated); default all four.
const bombCodecsEnv = "CACHEWARDEN_TEST_BOMB_CODECS"

// defaultBombBytes is eight times the default
// kafka.max_decompressed_batch_bytes (16 MiB): over the limit, and quick
// to compress on a loaded machine. The figures of docs/operations.md
// ("Compression bombs") were measured with 1 GiB.
const defaultBombBytes = 128 << 20

// maxBombRSS bounds the daemon's peak resident memory through the bombs:
// 99 to 117 MB on a quiet machine, up to 164 MB with the whole suite
// running beside it (each bomb leaves up to the limit's buffer as garbage
// and a loaded machine collects it later), against about 1 GB without
// the limit.
const maxBombRSS = 200 << 20

// Kafka's compression codecs (record batch attributes).
var bombCodecs = []struct {
	name  string
	codec int16
}{{"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}}

// TestCompressionBombs runs `cachewarden run` as a process and publishes,
// in the middle of ordinary changes, one record batch per codec whose
// single record of zeros decompresses far past
// kafka.max_decompressed_batch_bytes. Each batch must be poison: a dead
// letter naming its topic, partition, offsets and sizes (not the bomb),
// the fallback namespace of its topic's tables bumped and counted in
// cachewarden_invalidations_lost_total, and the partition moving past it
// so that the changes behind it are applied. The daemon's peak RSS
// (VmHWM) must stay under 150 MB.
func TestCompressionBombs(t *testing.T) {
	size := defaultBombBytes
	if v := os.Getenv(bombBytesEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 16<<20 {
			t.Fatalf("%s=%q: want a byte count over 16 MiB", bombBytesEnv, v)
		}
		size = n
	}
	rules := rulesWithFallback(t)
	s := newScenario(t, ScenarioOptions{Rules: []string{rules}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	users := s.topic(s.Schema.Users)
	// A snappy batch cannot be smaller than about 1/21 of its
	// decompressed size: room for 1 GiB of zeros.
	if err := allowLargeMessages(ctx, s.Broker, users); err != nil {
		t.Fatal(err)
	}
	dlq := s.Opts.TopicPrefix + ".dlq"
	cf := s.ConfigFile(dlq)
	cf.Log.Level = "info"
	path := filepath.Join(t.TempDir(), "cachewarden.yaml")
	if err := cf.Write(path); err != nil {
		t.Fatal(err)
	}
	d := &faultDaemon{daemonProcess: startProcess(t, buildBinary(t), path), ClientID: "bombs"}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon stderr (last lines):\n%s", lastLines(d.stderr.String(), 60))
		}
	})
	addr := d.httpAddr(t)
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Round(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// Partition 0 of users serves the group a record before the bombs:
	// a bomb that is a partition's first batch ever stops it until it is
	// assigned again (docs/operations.md, "Compression bombs";
	// kafka.TestDaemonOversizedFirstBatch).
	warmup, err := kgo.NewClient(kgo.SeedBrokers(s.Broker.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	if err := warmup.ProduceSync(ctx, &kgo.Record{Topic: users, Partition: 0, Value: []byte(`{"op":`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	warmup.Close()
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	rssBefore := peakRSS(t, d.cmd.Process.Pid)
	lostBefore, err := d.metric(addr, "cachewarden_invalidations_lost_total", `covered="fallback",reason="poison"`)
	if err != nil {
		t.Fatal(err)
	}

	// Produce requests that name topics (v13 names topic IDs).
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Broker.Addrs()...), kgo.RequestTimeoutOverhead(time.Minute),
		kgo.MaxVersions(kversion.V3_9_0()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	type sent struct {
		codec      string
		offset     int64
		compressed int
	}
	var bombs []sent
	only := os.Getenv(bombCodecsEnv)
	for _, c := range bombCodecs {
		if only != "" && !strings.Contains(","+only+",", ","+c.name+",") {
			continue
		}
		start := time.Now()
		batch := bombBatch(t, c.codec, size)
		offset := produceBatch(t, ctx, cl, users, batch)
		bombs = append(bombs, sent{c.name, offset, len(batch)})
		t.Logf("%s bomb: %d bytes decompressing to %d, at offset %d (made in %v)", c.name, len(batch), size, offset, time.Since(start).Round(time.Millisecond))
		// Ordinary changes behind each bomb.
		if _, _, err := s.Publish(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp, cancelCaughtUp := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelCaughtUp()
	if err := s.WaitCaughtUp(caughtUp); err != nil {
		t.Fatalf("the partitions did not move past the bombs: %v", err)
	}
	rss := peakRSS(t, d.cmd.Process.Pid)
	t.Logf("daemon peak RSS (VmHWM): %.1f MB before the bombs, %.1f MB after %d bombs of %d MiB each", float64(rssBefore)/1e6, float64(rss)/1e6, len(bombs), size>>20)
	if rss > maxBombRSS {
		t.Errorf("daemon peak RSS %.1f MB, want under %.0f MB", float64(rss)/1e6, float64(maxBombRSS)/1e6)
	}
	if d.exited() {
		t.Fatalf("the daemon died")
	}

	dead, err := s.Broker.ReadAll(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	byOffset := map[string]Message{}
	for _, m := range dead {
		byOffset[m.Headers["cachewarden.offset"]] = m
	}
	for _, b := range bombs {
		m, ok := byOffset[strconv.FormatInt(b.offset, 10)]
		if !ok {
			t.Errorf("%s bomb at offset %d: no dead letter (dead letters: %d)", b.codec, b.offset, len(dead))
			continue
		}
		h := m.Headers
		reason := h["cachewarden.error"]
		if h["cachewarden.topic"] != users || h["cachewarden.partition"] != "0" || h["cachewarden.end-offset"] != strconv.FormatInt(b.offset+1, 10) ||
			!strings.Contains(reason, "decompresses to more than 16777216 bytes") {
			t.Errorf("%s bomb: dead letter headers %v", b.codec, h)
		}
		if len(m.Value) != 0 || len(m.Key) != 0 {
			t.Errorf("%s bomb: dead letter holds %d bytes of key and %d of value, want none", b.codec, len(m.Key), len(m.Value))
		}
		t.Logf("%s bomb: dead letter: %s", b.codec, reason)
	}
	lost, err := d.metric(addr, "cachewarden_invalidations_lost_total", `covered="fallback",reason="poison"`)
	if err != nil {
		t.Fatal(err)
	}
	if lost-lostBefore != float64(len(bombs)) {
		t.Errorf("cachewarden_invalidations_lost_total{reason=poison,covered=fallback} grew by %.0f, want %d", lost-lostBefore, len(bombs))
	}
	if status, body, err := d.httpGet(addr, "/readyz"); err != nil || status != 200 {
		t.Errorf("/readyz: %d %s %v", status, body, err)
	}
	check(t, ctx, s)
	d.terminate(t)
}

// rulesWithFallback writes the test rules with a fallback namespace per
// table into a directory of their own, and returns it.
func rulesWithFallback(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(testRules, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("rules: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out := strings.Replace(string(data), "\nrules:\n", "\nfallback: \"ns:table:{db}.{table}\"\nrules:\n", 1)
		if out == string(data) {
			t.Fatalf("%s: no rules: line", f)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// bombBatch returns a Kafka record batch (v2, no producer ID) compressed
// with codec, holding one record whose value is size zero bytes. It
// compresses as it goes: the zeros are never all in memory.
func bombBatch(t *testing.T, codec int16, size int) []byte {
	t.Helper()
	// The record: length, attributes, timestamp delta, offset delta,
	// key length (-1: null), value length, value, header count.
	head := []byte{0, 0, 0}
	head = binary.AppendVarint(head, -1)
	head = binary.AppendVarint(head, int64(size))
	recLen := len(head) + size + 1
	rec := binary.AppendVarint(nil, int64(recLen))
	rec = append(rec, head...)

	var out bytes.Buffer
	var w io.WriteCloser
	switch codec {
	case 1:
		w = gzip.NewWriter(&out)
	case 2:
		w = &xerialWriter{out: &out}
	case 3:
		w = lz4.NewWriter(&out)
	case 4:
		zw, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		w = zw
	}
	zeros := make([]byte, 1<<20)
	if _, err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	for left := size; left > 0; left -= len(zeros) {
		if _, err := w.Write(zeros[:min(left, len(zeros))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Write([]byte{0}); err != nil { // no headers
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, Attributes: codec,
		FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: 1, Records: out.Bytes(),
	}
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

// xerialWriter frames snappy as Kafka's Java producer does: a header,
// then each 32 KiB block compressed on its own, after its big-endian
// length.
type xerialWriter struct {
	out     *bytes.Buffer
	pending []byte
	started bool
}

func (x *xerialWriter) Write(p []byte) (int, error) {
	if !x.started {
		x.out.Write([]byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1})
		x.started = true
	}
	x.pending = append(x.pending, p...)
	for len(x.pending) >= 32<<10 {
		x.block(x.pending[:32<<10])
		x.pending = x.pending[32<<10:]
	}
	x.pending = append([]byte(nil), x.pending...)
	return len(p), nil
}

func (x *xerialWriter) block(p []byte) {
	enc := s2.EncodeSnappy(nil, p)
	x.out.Write(binary.BigEndian.AppendUint32(nil, uint32(len(enc))))
	x.out.Write(enc)
}

func (x *xerialWriter) Close() error {
	if len(x.pending) > 0 {
		x.block(x.pending)
	}
	return nil
}

// produceBatch writes a raw record batch to partition 0 of topic and
// returns its offset.
func produceBatch(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, batch []byte) int64 {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Acks = -1
	req.TimeoutMillis = 60_000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition = 0
	rp.Records = batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("produce a batch of %d bytes: %v", len(batch), err)
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		t.Fatalf("produce a batch of %d bytes: %v", len(batch), fmt.Errorf("%w", err))
	}
	return p.BaseOffset
}

// peakRSS returns the peak resident set size (VmHWM) of process pid in
// bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}
