package kafka

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// TestParseDeadLetter reads dead letters as DLQ.Send writes them, and
// ones whose headers are damaged: the original message comes back
// without the cachewarden.* headers, and what cannot be re-driven says
// why.
func TestParseDeadLetter(t *testing.T) {
	orig := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sent := func(p pipeline.Poison) *kgo.Record {
		r := dlqRecord(&p)
		r.Partition, r.Offset = 2, 40
		return r
	}
	msg := pipeline.Message{Key: []byte("k"), Value: []byte(`{"op":"c"}`), Time: orig,
		Headers: []pipeline.Header{{Key: "trace", Value: []byte("t1")}},
		Pos:     rules.Position{Topic: "cdc.shop.users", Partition: 1, Offset: 7}}
	header := func(pairs ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(pairs); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: pairs[i], Value: []byte(pairs[i+1])})
		}
		return hs
	}
	tests := []struct {
		name        string
		rec         *kgo.Record
		wantOrigin  PartitionOffset
		wantReason  string
		wantSize    int
		notRedrive  string // in Redrivable's error; "" when re-drivable
		wantProblem string
	}{
		{name: "poison", rec: sent(pipeline.Poison{Message: msg, Err: errors.New("bad JSON")}),
			wantOrigin: PartitionOffset{"cdc.shop.users", 1, 7}, wantReason: "bad JSON", wantSize: 10},
		{name: "oversized batch", rec: sent(pipeline.Poison{Message: pipeline.Message{Time: orig, Pos: msg.Pos},
			Err: &OversizedBatch{FirstOffset: 5, EndOffset: 9}}),
			wantOrigin: PartitionOffset{"cdc.shop.users", 1, 5}, wantReason: "record batch at offsets 5 to 8", notRedrive: "replay --from cdc.shop.users:1:5 --to cdc.shop.users:1:9"},
		{name: "value dropped", rec: &kgo.Record{Headers: header(HeaderError, "x", HeaderTopic, "t", HeaderPartition, "0", HeaderOffset, "3", HeaderValueDropped, "2000000")},
			wantOrigin: PartitionOffset{"t", 0, 3}, wantReason: "x", wantSize: 2000000, notRedrive: "without its value (2000000 bytes); replay the original: cachewarden replay --from t:0:3 --to t:0:4"},
		{name: "bad offset", rec: &kgo.Record{Value: []byte("v"), Headers: header(HeaderTopic, "t", HeaderPartition, "0", HeaderOffset, "-4")},
			wantOrigin: PartitionOffset{"t", 0, -1}, wantSize: 1, wantProblem: `header cachewarden.offset "-4" is not a number from 0`, notRedrive: "not a number"},
		{name: "topic without offset", rec: &kgo.Record{Value: []byte("v"), Headers: header(HeaderTopic, "t")},
			wantOrigin: PartitionOffset{"t", 0, 0}, wantSize: 1, wantProblem: "without its partition and offset", notRedrive: "without its partition"},
		{name: "bad topic", rec: &kgo.Record{Value: []byte("v"), Headers: header(HeaderTopic, "a b", HeaderPartition, "0", HeaderOffset, "1")},
			wantOrigin: PartitionOffset{"", 0, 1}, wantSize: 1, wantProblem: "only letters", notRedrive: "only letters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := ParseDeadLetter(tt.rec)
			if d.Origin != tt.wantOrigin || !strings.HasPrefix(d.Reason, tt.wantReason) || (tt.wantReason == "") != (d.Reason == "") || d.Size != tt.wantSize {
				t.Errorf("origin %v, reason %q, size %d; want %v, %q, %d", d.Origin, d.Reason, d.Size, tt.wantOrigin, tt.wantReason, tt.wantSize)
			}
			if !strings.Contains(d.Problem, tt.wantProblem) || (tt.wantProblem == "") != (d.Problem == "") {
				t.Errorf("problem %q, want %q", d.Problem, tt.wantProblem)
			}
			err := d.Redrivable()
			if (err == nil) != (tt.notRedrive == "") || err != nil && (!strings.Contains(err.Error(), tt.notRedrive) || !errors.Is(err, ErrNotRedrivable)) {
				t.Errorf("Redrivable() = %v, want one saying %q", err, tt.notRedrive)
			}
			for _, h := range d.Message.Headers {
				if strings.HasPrefix(h.Key, "cachewarden.") {
					t.Errorf("the original message keeps header %s", h.Key)
				}
			}
		})
	}
	d := ParseDeadLetter(sent(pipeline.Poison{Message: msg, Err: errors.New("bad JSON")}))
	m := d.Message
	if d.Partition != 2 || d.Offset != 40 || !m.Time.Equal(orig) || m.Pos != msg.Pos || string(m.Key) != "k" || string(m.Value) != string(msg.Value) ||
		len(m.Headers) != 1 || m.Headers[0].Key != "trace" {
		t.Errorf("dead letter %+v: message %+v, want the original %+v at 2:40", d, m, msg)
	}
}
