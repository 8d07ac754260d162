package counters

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

func parsePosition(t *testing.T, s string) BinlogPosition {
	t.Helper()
	if s == "-" {
		return BinlogPosition{}
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		t.Fatalf("bad position %q", s)
	}
	pos, err := strconv.ParseInt(s[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("bad position %q: %v", s, err)
	}
	return BinlogPosition{File: s[:i], Pos: pos}
}

func TestComparePositions(t *testing.T) {
	f, err := os.Open("testdata/positions.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases := 0
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 3 {
			t.Fatalf("positions.txt:%d: want 3 fields: %q", line, text)
		}
		a, b := parsePosition(t, fields[0]), parsePosition(t, fields[1])
		want, wantOK := map[string]int{"<": -1, "=": 0, ">": 1}[fields[2]]
		order, ok := ComparePositions(a, b)
		if ok != wantOK || (ok && order != want) {
			t.Errorf("positions.txt:%d: ComparePositions(%v, %v) = %d, %v; want %s", line, a, b, order, ok, fields[2])
		}
		// The order is antisymmetric.
		back, backOK := ComparePositions(b, a)
		if backOK != ok || back != -order {
			t.Errorf("positions.txt:%d: reversed = %d, %v; want %d, %v", line, back, backOK, -order, ok)
		}
		cases++
	}
	if err := sc.Err(); err != nil || cases < 10 {
		t.Fatalf("read %d cases: %v", cases, err)
	}
}

func TestFenceKey(t *testing.T) {
	if got := FenceKey("shop:comments:9"); got != "shop:comments:9%fence" {
		t.Errorf("FenceKey = %q", got)
	}
	// A counter key at the limit: its fence key is hashed within it, and
	// distinct keys keep distinct fence keys.
	long := strings.Repeat("k", rules.MaxKeyLen)
	other := strings.Repeat("k", rules.MaxKeyLen-1) + "j"
	fl, fo := FenceKey(long), FenceKey(other)
	if len(fl) > rules.MaxKeyLen || len(fo) > rules.MaxKeyLen {
		t.Fatalf("fence keys of %d bytes, limit %d", max(len(fl), len(fo)), rules.MaxKeyLen)
	}
	if fl == fo || fl == long {
		t.Fatalf("fence keys collide: %q %q", fl, fo)
	}
	if FenceKey(long) != fl {
		t.Fatal("FenceKey is not deterministic")
	}
	// A key already hashed by FinishKey still has room for the suffix.
	hashed := rules.FinishKey([]byte(strings.Repeat("x", 300)))
	if got := FenceKey(hashed); got != hashed+FenceKeySuffix {
		t.Errorf("FenceKey(hashed) = %q", got)
	}
	// No byte a memcached key forbids.
	for _, k := range []string{fl, fo, FenceKey("a")} {
		for i := 0; i < len(k); i++ {
			if k[i] <= 0x20 || k[i] == 0x7f {
				t.Fatalf("fence key %q has byte %#x", k, k[i])
			}
		}
	}
}

func TestFenceEncoding(t *testing.T) {
	for _, f := range []Fence{
		{At: BinlogPosition{File: "mysql-bin.000001", Pos: 4}, ID: 1},
		{At: BinlogPosition{File: "host with space-bin.1000000", Pos: 1 << 40}, ID: 4294967295},
		{At: BinlogPosition{File: "mysql-bin.000002", Pos: 328}, ServerID: 7, GTID: "0-7-31,1-2-5", ID: 9},
		{At: BinlogPosition{File: "binlog.000002", Pos: 328}, ServerID: 4294967295, GTID: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100:120,4e11fa47-71ca-11e1-9e33-c80aa9429562:3", ID: 9},
	} {
		got, err := ParseFence(encodeFence(f))
		if err != nil || got != f {
			t.Errorf("round trip of %+v = %+v, %v", f, got, err)
		}
	}
	// Fences written in format 1 are still read.
	if got, err := ParseFence([]byte("1 5 10 f.000001")); err != nil || got != (Fence{At: BinlogPosition{File: "f.000001", Pos: 10}, ID: 5}) {
		t.Errorf("format 1 fence = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "1 5 10", "2 5 10 f.000001", "1 0 10 f.000001", "1 x 10 f.000001",
		"1 5 -1 f.000001", "1 5 10 ", "1 4294967296 10 f.000001", "12345",
		"2 5 10 1 - ", "2 5 10 x - f.000001", "2 5 10 1 0-1 f.000001", "2 5 10 1 uuid:1 f.000001", "3 5 10 1 - f.000001"} {
		if f, err := ParseFence([]byte(bad)); err == nil {
			t.Errorf("ParseFence(%q) = %+v, want an error", bad, f)
		}
	}
}

// FuzzParseFence checks that any fence item either fails to parse or
// round-trips.
func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"1 7 120 mysql-bin.000001", "1 1 4 a", "", "1  7 120 x", "1 7 120 a b c", "0 7 1 f",
		"2 7 120 3 0-3-9,1-1-2 mysql-bin.000001", "2 7 120 3 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5 b.1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		fence, err := ParseFence(v)
		if err != nil {
			return
		}
		if fence.ID == 0 || !fence.At.Known() || fence.At.Pos < 0 {
			t.Fatalf("ParseFence(%q) = %+v", v, fence)
		}
		again, err := ParseFence(encodeFence(fence))
		if err != nil || again != fence {
			t.Fatalf("re-parse of %+v = %+v, %v", fence, again, err)
		}
	})
}

func TestVerdict(t *testing.T) {
	at := func(file string, pos int64) rules.Position { return rules.Position{BinlogFile: file, BinlogPos: pos} }
	fence := Fence{At: BinlogPosition{File: "mysql-bin.000003", Pos: 1000}, ServerID: 1, ID: 77}
	consistent := FenceView{Counter: true, Flags: 77, HasFence: true, Fence: fence}
	gtidFence := fence
	gtidFence.GTID = "0-1-500,1-2-40"
	gtidView := FenceView{Counter: true, Flags: 77, HasFence: true, Fence: gtidFence}
	mysqlFence := fence
	mysqlFence.GTID = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100:120-130"
	mysqlView := FenceView{Counter: true, Flags: 77, HasFence: true, Fence: mysqlFence}
	server := func(p rules.Position, id uint32) rules.Position { p.ServerID = id; return p }
	gtid := func(p rules.Position, g string) rules.Position { p.GTID = g; return p }
	for _, tc := range []struct {
		name string
		view FenceView
		pos  rules.Position
		want Verdict
		why  Why
	}{
		{"before the fence", consistent, at("mysql-bin.000003", 999), Skip, Decided},
		{"at the fence", consistent, at("mysql-bin.000003", 1000), Skip, Decided},
		{"after the fence", consistent, at("mysql-bin.000003", 1001), Apply, Decided},
		{"earlier file", consistent, at("mysql-bin.000002", 999999), Skip, Decided},
		{"later file", consistent, at("mysql-bin.000004", 4), Apply, Decided},
		{"same server id", consistent, server(at("mysql-bin.000003", 999), 1), Skip, Decided},
		{"other server id", consistent, server(at("mysql-bin.000003", 999), 2), Recount, OtherServer},
		{"event server unknown", consistent, server(at("mysql-bin.000003", 999), 0), Skip, Decided},
		{"no position", consistent, rules.Position{Topic: "t", Offset: 5}, Apply, NoPosition},
		{"other server's log", consistent, at("other-bin.000003", 5), Recount, OtherServer},
		{"gtid only, fence without gtid", consistent, gtid(rules.Position{}, "0-1-7"), Apply, NoPosition},
		{"mariadb gtid in the set", gtidView, gtid(rules.Position{}, "0-1-500"), Skip, Decided},
		{"mariadb gtid after the set", gtidView, gtid(rules.Position{}, "0-1-501"), Apply, Decided},
		{"mariadb gtid of an unnamed domain", gtidView, gtid(rules.Position{}, "2-1-1"), Apply, Decided},
		{"gtid wins over another server's position", gtidView, server(gtid(at("mysql-bin.000009", 5), "1-3-40"), 3), Skip, Decided},
		{"mysql gtid in the set", mysqlView, gtid(rules.Position{}, "3E11FA47-71CA-11E1-9E33-C80AA9429562:125"), Skip, Decided},
		{"mysql gtid in a gap", mysqlView, gtid(rules.Position{}, "3e11fa47-71ca-11e1-9e33-c80aa9429562:110"), Apply, Decided},
		{"mysql gtid of another uuid", mysqlView, gtid(rules.Position{}, "4e11fa47-71ca-11e1-9e33-c80aa9429562:1"), Apply, Decided},
		{"gtid kinds differ: position decides", mysqlView, gtid(at("mysql-bin.000003", 5), "0-1-1"), Skip, Decided},
		{"counter missing", FenceView{HasFence: true, Fence: fence}, at("mysql-bin.000003", 5), Apply, Decided},
		{"fence evicted alone", FenceView{Counter: true, Flags: 77}, at("mysql-bin.000003", 5), Recount, FenceMissing},
		{"never fenced", FenceView{Counter: true}, at("mysql-bin.000003", 5), Apply, Decided},
		{"unfenced value over a fence", FenceView{Counter: true, HasFence: true, Fence: fence}, at("mysql-bin.000003", 5), Apply, Decided},
		{"recount in progress", FenceView{Counter: true, Flags: 12, HasFence: true, Fence: fence}, at("mysql-bin.000003", 5), Recount, Decided},
		{"recount in progress, after", FenceView{Counter: true, Flags: 12, HasFence: true, Fence: fence}, at("mysql-bin.000003", 5000), Recount, Decided},
		{"unreadable fence", FenceView{Counter: true, Flags: 77, HasFence: true, BadFence: true}, at("mysql-bin.000003", 5), Recount, Decided},
		{"counted by a reader", FenceView{Counter: true, Flags: itemformat.ReaderCountFlags}, at("mysql-bin.000003", 5), Recount, Decided},
		{"counted by a reader over a fence", FenceView{Counter: true, Flags: itemformat.ReaderCountFlags, HasFence: true, Fence: fence}, at("mysql-bin.000003", 5), Recount, Decided},
		{"counted by a reader, no position", FenceView{Counter: true, Flags: itemformat.ReaderCountFlags}, rules.Position{}, Apply, NoPosition},
	} {
		got, why := tc.view.Verdict(tc.pos)
		if got != tc.want || why != tc.why {
			t.Errorf("%s: Verdict = %v (%v), want %v (%v)", tc.name, got, why, tc.want, tc.why)
		}
	}
}

func TestRecheckVerdict(t *testing.T) {
	f1 := Fence{At: BinlogPosition{File: "mysql-bin.000003", Pos: 1000}, ID: 1}
	f2 := Fence{At: BinlogPosition{File: "mysql-bin.000003", Pos: 2000}, ID: 2}
	v1 := FenceView{Counter: true, Flags: 1, HasFence: true, Fence: f1}
	v2 := FenceView{Counter: true, Flags: 2, HasFence: true, Fence: f2}
	pos := func(ps ...int64) []rules.Position {
		var out []rules.Position
		for _, p := range ps {
			out = append(out, rules.Position{BinlogFile: "mysql-bin.000003", BinlogPos: p})
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		before, after FenceView
		sources       []rules.Position
		want          Verdict
	}{
		{"nothing stored in between", v1, v1, pos(1500), Apply},
		{"unfenced and unchanged", FenceView{Counter: true}, FenceView{Counter: true}, pos(1500), Apply},
		{"recount at a later fence stored in between", v1, v2, pos(1500), Recount},
		{"the deltas are at the new fence", v1, v2, pos(2000), Recount},
		{"recount at an earlier fence than the deltas", v1, v2, pos(2001), Apply},
		{"one of the deltas is in the new fence", v1, v2, pos(2500, 1999), Recount},
		{"first fence appeared", FenceView{Counter: true}, v2, pos(1500), Recount},
		{"counter deleted in between", v1, FenceView{HasFence: true, Fence: f1}, pos(1500), Apply},
		{"fence rewritten, value not yet", v1, FenceView{Counter: true, Flags: 1, HasFence: true, Fence: f2}, pos(2500), Recount},
		{"unfenced value stored in between", v1, FenceView{Counter: true, HasFence: true, Fence: f1}, pos(2500), Recount},
		{"incomparable new fence", v1, FenceView{Counter: true, Flags: 3, HasFence: true,
			Fence: Fence{At: BinlogPosition{File: "other.000001", Pos: 1}, ID: 3}}, pos(2500), Recount},
	} {
		if got := RecheckVerdict(tc.before, tc.after, tc.sources); got != tc.want {
			t.Errorf("%s: RecheckVerdict = %v, want %v", tc.name, got, tc.want)
		}
	}
}
