package itemformat

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// positionVectors mirrors the source position sections of
// testdata/formats/vectors.json (docs/formats.md, "Source positions").
type positionVectors struct {
	PositionKeys []struct {
		ServerID uint32 `json:"server_id"`
		Key      string
	} `json:"position_keys"`
	SourcePositions struct {
		MaxWait float64 `json:"max_wait"`
		Items   []struct {
			Name, Value, Position string
			Error                 bool
			Wait                  *struct {
				Function, Query string
				Args            []any
			}
		}
		Merges []struct {
			Name, Stored, Batch, Merged string
		}
		Outcomes []struct {
			Function, Outcome string
			Result            *string
		}
	} `json:"source_positions"`
}

func loadPositionVectors(t *testing.T) positionVectors {
	t.Helper()
	b, err := os.ReadFile("../testdata/formats/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v positionVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.PositionKeys) == 0 || len(v.SourcePositions.Items) == 0 || len(v.SourcePositions.Merges) == 0 {
		t.Fatal("vectors.json: no source position vectors")
	}
	return v
}

func TestPositionVectors(t *testing.T) {
	v := loadPositionVectors(t)
	for _, c := range v.PositionKeys {
		if got := PositionKey(c.ServerID); got != c.Key {
			t.Errorf("PositionKey(%d) = %q, want %q", c.ServerID, got, c.Key)
		}
	}
	sp := v.SourcePositions
	for _, c := range sp.Items {
		p, err := DecodePosition([]byte(c.Value))
		if c.Error {
			if err == nil {
				t.Errorf("%s: DecodePosition(%q) = %+v, want an error", c.Name, c.Value, p)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: DecodePosition(%q): %v", c.Name, c.Value, err)
			continue
		}
		if got := string(p.Encode()); got != c.Position {
			t.Errorf("%s: %q encodes again as %q, want %q", c.Name, c.Value, got, c.Position)
		}
		w, ok := p.Wait(sp.MaxWait)
		if (c.Wait != nil) != ok {
			t.Errorf("%s: Wait ok = %v, want %v", c.Name, ok, c.Wait != nil)
			continue
		}
		if !ok {
			continue
		}
		// JSON numbers are float64; the statement binds int64 offsets.
		args := make([]any, len(w.Args))
		for i, a := range w.Args {
			if n, isInt := a.(int64); isInt {
				a = float64(n)
			}
			args[i] = a
		}
		if w.Function != c.Wait.Function || w.Query != c.Wait.Query || !reflect.DeepEqual(args, c.Wait.Args) {
			t.Errorf("%s: Wait = %s %q %v, want %s %q %v", c.Name, w.Function, w.Query, args, c.Wait.Function, c.Wait.Query, c.Wait.Args)
		}
	}
	for _, c := range sp.Merges {
		a, errA := DecodePosition([]byte(c.Stored))
		b, errB := DecodePosition([]byte(c.Batch))
		if errA != nil || errB != nil {
			t.Fatalf("%s: %v %v", c.Name, errA, errB)
		}
		if got := string(MergePositions(a, b).Encode()); got != c.Merged {
			t.Errorf("%s: merge %q into %q = %q, want %q", c.Name, c.Batch, c.Stored, got, c.Merged)
		}
	}
	names := map[WaitOutcome]string{WaitReached: "reached", WaitTimedOut: "timed_out", WaitUnusable: "unusable"}
	for _, c := range sp.Outcomes {
		w := ReplicaWait{Function: c.Function}
		var got WaitOutcome
		if c.Result == nil {
			got = w.Outcome("", true)
		} else {
			got = w.Outcome(*c.Result, false)
		}
		if names[got] != c.Outcome {
			t.Errorf("%s answering %v: %s, want %s", c.Function, c.Result, names[got], c.Outcome)
		}
	}
}

func TestPositionOfEvent(t *testing.T) {
	for _, c := range []struct {
		name string
		src  rules.Position
		want string
	}{
		{"Debezium on MariaDB", rules.Position{GTID: "0-1-17", BinlogFile: "mysql-bin.000003", BinlogPos: 4711, ServerID: 1}, "gtid=0-1-17 binlog=mysql-bin.000003:4711"},
		{"Debezium on MySQL", rules.Position{GTID: "3E11FA47-71CA-11E1-9E33-C80AA9429562:5", ServerID: 1}, "gtid=3e11fa47-71ca-11e1-9e33-c80aa9429562:5"},
		{"a GTID that does not parse: the binary log only", rules.Position{GTID: "0-1", BinlogFile: "b.000001", BinlogPos: 9}, "binlog=b.000001:9"},
		{"nothing", rules.Position{Topic: "t", Offset: 3}, ""},
	} {
		if got := string(PositionOfEvent(c.src).Encode()); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// MergePositions never moves a position back, whatever the order the
// batches of two partitions arrive in.
func TestMergePositionsCommutes(t *testing.T) {
	ps := []string{"gtid=0-1-5", "gtid=0-1-9,1-1-2", "gtid=1-1-4 binlog=b.000002:7", "binlog=b.000001:900", ""}
	for _, x := range ps {
		for _, y := range ps {
			a, _ := DecodePosition([]byte(x))
			b, _ := DecodePosition([]byte(y))
			ab, ba := MergePositions(a, b), MergePositions(b, a)
			if !ab.Equal(ba) {
				t.Errorf("merge(%q, %q) = %q, merge the other way = %q", x, y, ab.Encode(), ba.Encode())
			}
			if !MergePositions(ab, a).Equal(ab) || !MergePositions(ab, b).Equal(ab) {
				t.Errorf("merge(%q, %q) = %q moves when merged with either again", x, y, ab.Encode())
			}
		}
	}
}

// Include is MergePositions with the event's position, event by event.
func TestIncludeIsMerge(t *testing.T) {
	events := []rules.Position{
		{GTID: "0-1-9", BinlogFile: "b.000002", BinlogPos: 50},
		{GTID: "0-1-7", BinlogFile: "b.000001", BinlogPos: 900},
		{GTID: "1-1-3"},
		{GTID: "0-1-10", BinlogFile: "b.000002", BinlogPos: 80},
		{BinlogFile: "b.000002", BinlogPos: 60},
	}
	var inc, merged SourcePosition
	for _, e := range events {
		inc.Include(e)
		merged = MergePositions(merged, PositionOfEvent(e))
		if !inc.Equal(merged) {
			t.Fatalf("after %+v: Include gives %q, MergePositions %q", e, inc.Encode(), merged.Encode())
		}
	}
	if got, want := string(inc.Encode()), "gtid=0-1-10,1-1-3 binlog=b.000002:80"; got != want {
		t.Errorf("newest of the batch = %q, want %q", got, want)
	}
}
