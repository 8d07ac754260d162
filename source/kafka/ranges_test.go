package kafka

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseReplayBound(t *testing.T) {
	tests := []struct {
		in      string
		want    ReplayBound
		wantErr string // substring of the error; "" for success
	}{
		{in: "earliest", want: ReplayBound{Earliest: true}},
		{in: " 2026-05-01T12:00:00Z ", want: ReplayBound{Time: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}},
		{in: "2026-05-01T14:00:00.5+02:00", want: ReplayBound{Time: time.Date(2026, 5, 1, 12, 0, 0, 5e8, time.UTC)}},
		{in: "cdc.users:0:1200", want: ReplayBound{Offsets: []PartitionOffset{{"cdc.users", 0, 1200}}}},
		{in: "cdc.users:0:1200, cdc.users:1:0,other_t-2:17:5", want: ReplayBound{Offsets: []PartitionOffset{
			{"cdc.users", 0, 1200}, {"cdc.users", 1, 0}, {"other_t-2", 17, 5}}}},
		{in: "", wantErr: "empty"},
		{in: "2026-05-01", wantErr: "not an RFC 3339 time"},
		{in: "2026-05-01 12:00:00", wantErr: "not an RFC 3339 time"},
		{in: "cdc", wantErr: "want topic:partition:offset"},
		{in: "cdc:0", wantErr: "want topic:partition:offset"},
		{in: "cdc:x:1", wantErr: `partition "x"`},
		{in: "cdc:-1:1", wantErr: `partition "-1"`},
		{in: "cdc:0:-5", wantErr: `offset "-5"`},
		{in: "cdc:0:", wantErr: `offset ""`},
		{in: ":0:5", wantErr: "1 to 249 characters"},
		{in: "a/b:0:5", wantErr: "only letters"},
		{in: "cdc:0:5,cdc:0:6", wantErr: "cdc:0 is listed twice"},
		{in: "cdc:0:5,", wantErr: "want topic:partition:offset"},
		{in: "yesterday", wantErr: "want topic:partition:offset"},
	}
	for _, tt := range tests {
		got, err := ParseReplayBound(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseReplayBound(%q) = %+v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseReplayBound(%q): %v", tt.in, err)
			continue
		}
		if !got.Time.Equal(tt.want.Time) || got.Earliest != tt.want.Earliest || !reflect.DeepEqual(got.Offsets, tt.want.Offsets) {
			t.Errorf("ParseReplayBound(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		// String gives back something that parses to the same bound.
		again, err := ParseReplayBound(got.String())
		if err != nil || !again.Time.Equal(got.Time) || again.Earliest != got.Earliest || !reflect.DeepEqual(again.Offsets, got.Offsets) {
			t.Errorf("ParseReplayBound(%q).String() = %q parses to %+v, %v", tt.in, got.String(), again, err)
		}
	}
}

func TestReplayRange(t *testing.T) {
	tp := topicPartition{"cdc", 1}
	// The log holds offsets 100..199; the end offset is 200.
	o := partitionOffsets{first: 100, end: 200, fromAt: 150, toAt: 180}
	none := partitionOffsets{first: 100, end: 200, fromAt: -1, toAt: -1}
	at := ReplayBound{Time: time.Unix(1, 0)}
	offs := func(list ...PartitionOffset) ReplayBound { return ReplayBound{Offsets: list} }
	tests := []struct {
		name       string
		o          partitionOffsets
		from, to   ReplayBound
		start, end int64
		notes      int
	}{
		{"earliest to the end", o, ReplayBound{Earliest: true}, ReplayBound{}, 100, 200, 0},
		{"time to time", o, at, at, 150, 180, 0},
		{"time with nothing that recent", none, at, ReplayBound{}, 200, 200, 1},
		{"time on an empty partition", partitionOffsets{first: 200, end: 200, fromAt: -1, toAt: -1}, at, ReplayBound{}, 200, 200, 0},
		{"end time with nothing that recent", none, ReplayBound{Earliest: true}, at, 100, 200, 0},
		{"offsets", o, offs(PartitionOffset{"cdc", 1, 120}), offs(PartitionOffset{"cdc", 1, 130}), 120, 130, 0},
		{"end offset of another partition", o, offs(PartitionOffset{"cdc", 1, 120}), offs(PartitionOffset{"cdc", 0, 130}), 120, 200, 0},
		{"start removed by retention", o, offs(PartitionOffset{"cdc", 1, 5}), ReplayBound{}, 100, 200, 1},
		{"start beyond the end", o, offs(PartitionOffset{"cdc", 1, 500}), ReplayBound{}, 200, 200, 1},
		{"end beyond the end", o, offs(PartitionOffset{"cdc", 1, 120}), offs(PartitionOffset{"cdc", 1, 900}), 120, 200, 1},
		{"end before the start", o, offs(PartitionOffset{"cdc", 1, 150}), offs(PartitionOffset{"cdc", 1, 110}), 150, 150, 0},
		{"end time before the start time", partitionOffsets{first: 100, end: 200, fromAt: 180, toAt: 150}, at, at, 180, 180, 0},
	}
	for _, tt := range tests {
		r, notes := replayRange(tp, tt.o, tt.from, tt.to)
		if r.Start != tt.start || r.End != tt.end || r.Topic != "cdc" || r.Partition != 1 || len(notes) != tt.notes {
			t.Errorf("%s: range %v, notes %q; want [%d,%d) with %d notes", tt.name, r, notes, tt.start, tt.end, tt.notes)
		}
	}
}
