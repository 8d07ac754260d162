package observer

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/rules"
)

// parseAt reads "file:pos" ("" is no position).
func parseAt(t *testing.T, s string) counters.BinlogPosition {
	t.Helper()
	if s == "" {
		return counters.BinlogPosition{}
	}
	i := strings.LastIndexByte(s, ':')
	pos, err := strconv.ParseInt(s[i+1:], 10, 64)
	if i < 0 || err != nil {
		t.Fatalf("position %q: want file:pos", s)
	}
	return counters.BinlogPosition{File: s[:i], Pos: pos}
}

// TestReached: the table of testdata/reached.json, whether the daemon's
// applied positions (batches of ops on one topic) have reached a
// snapshot's position.
func TestReached(t *testing.T) {
	data, err := os.ReadFile("testdata/reached.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name    string
		Counts  int
		Batches [][]struct {
			P      int
			At     string
			Server uint32
		}
		Snapshot string
		Server   uint32
		Want     bool
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	const topic = "cdc.app.comments"
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var a appliedPositions
			if c.Counts > 0 {
				a.setCounts(map[string]int{topic: c.Counts, "other": 1})
			}
			for _, b := range c.Batches {
				var ops []rules.Op
				for _, op := range b {
					at := parseAt(t, op.At)
					ops = append(ops, rules.Op{Source: rules.Position{Topic: topic, Partition: op.P, BinlogFile: at.File, BinlogPos: at.Pos, ServerID: op.Server}})
				}
				a.advance(batchPositions(ops))
			}
			got, why := a.reached(topic, parseAt(t, c.Snapshot), c.Server)
			if got != c.Want {
				t.Errorf("reached = %v (%s), want %v", got, why, c.Want)
			}
			if !got && why == "" {
				t.Error("not reached, and no reason given")
			}
		})
	}
}
