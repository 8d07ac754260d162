package binlog

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/pipeline"
)

// TestReplayParseBound reads the bounds of testdata/replay_bounds.txt.
func TestReplayParseBound(t *testing.T) {
	f, err := os.Open("testdata/replay_bounds.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" && !strings.Contains(line, "\t") {
			continue
		}
		in, want, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("testdata line %q: want input<TAB>result", line)
		}
		n++
		b, err := ParseBound(in)
		if wantErr, isErr := strings.CutPrefix(want, "error: "); isErr {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("ParseBound(%q) = %v, %v; want an error with %q", in, b, err, wantErr)
			}
			continue
		}
		if err != nil || b.String() != want {
			t.Errorf("ParseBound(%q) = %q, %v; want %q", in, b.String(), err, want)
		}
	}
	if err := sc.Err(); err != nil || n < 10 {
		t.Fatalf("read %d cases: %v", n, err)
	}
}

// TestReplayComparePos orders file positions by the logs' numbers.
func TestReplayComparePos(t *testing.T) {
	cases := []struct {
		fa   string
		pa   uint32
		fb   string
		pb   uint32
		want int
	}{
		{"mysql-bin.000009", 900, "mysql-bin.000010", 4, -1},
		{"mysql-bin.000010", 4, "mysql-bin.000009", 900, 1},
		{"mysql-bin.999999", 4, "mysql-bin.1000000", 4, -1},
		{"mysql-bin.000003", 154, "mysql-bin.000003", 154, 0},
		{"mysql-bin.000003", 153, "mysql-bin.000003", 154, -1},
		{"a.000001", 4, "b.000001", 4, -1},
	}
	for _, c := range cases {
		if got := comparePos(c.fa, c.pa, c.fb, c.pb); got != c.want {
			t.Errorf("comparePos(%s:%d, %s:%d) = %d, want %d", c.fa, c.pa, c.fb, c.pb, got, c.want)
		}
	}
}

// TestReplayRangeStream reads a range between two file positions with
// transactions larger than MaxEvents: every batch holds whole
// transactions, the range's rows come in order, nothing after its end,
// and no row of a table Tables leaves out.
func TestReplayRangeStream(t *testing.T) {
	f := newFixture(t)
	f.exec(t, "CREATE TABLE r (id INT PRIMARY KEY)", "CREATE TABLE o (id INT PRIMARY KEY)")
	ctx := context.Background()
	from, err := currentPosition(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	f.tx(t, true, "INSERT INTO r VALUES (1)", "INSERT INTO r VALUES (2)", "INSERT INTO r VALUES (3)")
	f.tx(t, true, "INSERT INTO r VALUES (4)", "INSERT INTO o VALUES (40)")
	f.tx(t, true, "INSERT INTO r VALUES (5)", "INSERT INTO r VALUES (6)")
	to, err := currentPosition(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	f.tx(t, true, "INSERT INTO r VALUES (7)") // after the range

	rs, err := OpenRange(ctx, RangeConfig{Stream: Config{DSN: f.dsn, MaxEvents: 2},
		From: Bound{Pos: from}, To: Bound{Pos: to}, Tables: func(db, table string) bool { return table != "o" }}, f.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var progressed, handed int64
	batchOf := map[string]int{} // GTID -> batch
	batch := 0
	err = rs.Read(ctx, 1, func(n int64) { progressed += n }, func(msgs []pipeline.Message) error {
		batch++
		handed += int64(len(msgs))
		for _, m := range msgs {
			for _, ev := range m.Events {
				if ev.Database == f.name && ev.Table == "o" {
					t.Errorf("a row of table o, which Tables leaves out, was read: %+v", ev)
				}
				if ev.Database != f.name || ev.Table != "r" {
					continue
				}
				if b, ok := batchOf[ev.Source.GTID]; ok && b != batch {
					t.Errorf("transaction %s split between batches %d and %d", ev.Source.GTID, b, batch)
				}
				batchOf[ev.Source.GTID] = batch
				arg, _ := ev.After[0].Value.SQLArg()
				ids = append(ids, fmt.Sprint(arg))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids, ","); got != "1,2,3,4,5,6" {
		t.Errorf("ids read %s, want 1,2,3,4,5,6", got)
	}
	if progressed != handed || handed == 0 {
		t.Errorf("progress counted %d messages, %d were handed over", progressed, handed)
	}
	if rs.Len() != 0 {
		t.Errorf("Len %d, want 0 (unknown)", rs.Len())
	}
}
