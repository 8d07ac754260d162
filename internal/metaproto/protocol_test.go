package metaproto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
)

// metaFixture is a case of testdata/meta/replies.json: commands written as
// a spec (see metaSpecCommands), the server's reply stream, and the
// replies wanted, one token per command: ok (quiet success), HD, NS, NF,
// EX, EN, VA:<value>:<cas>, Err:<kind> (too-large, client, server),
// resend, invalid (not sent), pending (unsettled when the read failed);
// "tok*N" repeats a token. err is a substring of the read error, "" when
// the read must succeed.
type metaFixture struct {
	Name     string `json:"name"`
	Commands string `json:"commands"`
	Stream   string `json:"stream"`
	Want     string `json:"want"`
	Err      string `json:"err"`
}

func loadMetaFixtures(t testing.TB) []metaFixture {
	t.Helper()
	data, err := os.ReadFile("testdata/meta/replies.json")
	if err != nil {
		t.Fatal(err)
	}
	var fixtures []metaFixture
	if err := json.Unmarshal(data, &fixtures); err != nil {
		t.Fatalf("testdata/meta/replies.json: %v", err)
	}
	return fixtures
}

// metaSpecCommands builds commands from a spec: each letter, optionally
// followed by a count, is that many commands: q a quiet append, b a quiet
// bump (vivifying increment), l a loud increment, v a loud decrement asking for the value, g a get, x a command
// with an invalid key. Spaces are ignored; at most limit commands are made.
func metaSpecCommands(spec string, limit int) []Cmd {
	var cmds []Cmd
	for i := 0; i < len(spec) && len(cmds) < limit; {
		c := spec[i]
		i++
		n := 0
		for i < len(spec) && spec[i] >= '0' && spec[i] <= '9' && n < limit {
			n = n*10 + int(spec[i]-'0')
			i++
		}
		n = max(n, 1)
		var cmd Cmd
		switch c {
		case 'q':
			cmd = Cmd{Verb: VerbSet, Mode: ModeAppend, Quiet: true, Data: "+m "}
		case 'b':
			cmd = Cmd{Verb: VerbArith, Quiet: true, Delta: 1, Vivify: true, Initial: 1}
		case 'l':
			cmd = Cmd{Verb: VerbArith, Delta: 1}
		case 'v':
			cmd = Cmd{Verb: VerbArith, Mode: ModeDecr, Delta: 1, ReturnValue: true}
		case 'g':
			cmd = Cmd{Verb: VerbGet}
		case 'x':
			cmd = Cmd{Verb: VerbGet, Key: "bad key"}
		default:
			continue
		}
		for range min(n, limit-len(cmds)) {
			if c != 'x' {
				cmd.Key = "k" + strconv.Itoa(len(cmds))
			}
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

// metaReplyToken renders a reply in the fixtures' notation.
func metaReplyToken(rep Reply) string {
	switch rep.Status {
	case Pending:
		return "pending"
	case QuietOK:
		return "ok"
	case HD:
		return "HD"
	case VA:
		return fmt.Sprintf("VA:%s:%d", rep.Value, rep.CAS)
	case EN:
		return "EN"
	case NF:
		return "NF"
	case NS:
		return "NS"
	case EX:
		return "EX"
	case Failed:
		switch {
		case rep.Resend:
			return "resend"
		case errors.Is(rep.Err, itemformat.ErrInvalidKey):
			return "invalid"
		case errors.Is(rep.Err, ErrTooLarge):
			return "err:too-large"
		case errors.Is(rep.Err, memcache.ErrServerError):
			return "err:server"
		case IsClientError(rep.Err) || errors.Is(rep.Err, ErrRejected):
			return "err:client"
		}
		return "err:" + rep.Err.Error()
	}
	return "status " + strconv.Itoa(int(rep.Status))
}

func expandWant(want string) []string {
	var out []string
	for _, f := range strings.Fields(want) {
		tok, count, ok := strings.Cut(f, "*")
		n := 1
		if ok {
			n, _ = strconv.Atoi(count)
		}
		for range n {
			out = append(out, tok)
		}
	}
	return out
}

// readFixture writes the fixture's commands (checking they are well
// formed) and reads its stream.
func readFixture(cmds []Cmd, stream string) ([]Reply, error) {
	replies := make([]Reply, len(cmds))
	appendPipeline(nil, cmds, replies)
	r := bufio.NewReaderSize(strings.NewReader(stream), 64)
	err := readReplies(r, cmds, replies)
	return replies, err
}

func TestMetaReadReplies(t *testing.T) {
	for _, fx := range loadMetaFixtures(t) {
		t.Run(fx.Name, func(t *testing.T) {
			cmds := metaSpecCommands(fx.Commands, 1000)
			replies, err := readFixture(cmds, fx.Stream)
			switch {
			case fx.Err == "" && err != nil:
				t.Fatalf("read: %v", err)
			case fx.Err != "" && (err == nil || !strings.Contains(err.Error(), fx.Err)):
				t.Fatalf("read error = %v, want one containing %q", err, fx.Err)
			}
			want := expandWant(fx.Want)
			if len(want) != len(cmds) {
				t.Fatalf("fixture wants %d replies for %d commands", len(want), len(cmds))
			}
			for i, rep := range replies {
				if got := metaReplyToken(rep); got != want[i] {
					t.Errorf("reply %d = %s, want %s (err %v)", i, got, want[i], rep.Err)
				}
			}
		})
	}
}

func TestMetaAppendPipeline(t *testing.T) {
	cmds := []Cmd{
		{Verb: VerbArith, Key: "ns:1", Quiet: true, Delta: 1, Vivify: true, TTL: 3600, Initial: 1700000000123},
		{Verb: VerbSet, Key: "set:1", Mode: ModeAppend, Quiet: true, Data: "+a -b "},
		{Verb: VerbGet, Key: "set:1"},
		{Verb: VerbSet, Key: "set:1", Data: "+a ", CAS: 99, TTL: 60, HasTTL: true},
		{Verb: VerbSet, Key: "c:1", Mode: ModeAdd, Data: "12"},
		{Verb: VerbArith, Key: "c:1", Mode: ModeDecr, Delta: 1 << 63, ReturnValue: true},
		{Verb: VerbDelete, Key: "c:1"},
		{Verb: VerbGet, Key: "has space"},
		{Verb: VerbSet, Key: "data\r\nmg x", Data: "v"},
		{Verb: VerbSet, Key: "value", Data: "x\r\nmn\r\n"},
	}
	replies := make([]Reply, len(cmds))
	buf, sent := appendPipeline(nil, cmds, replies)
	want := "ma ns:1 D1 N3600 J1700000000123 q O0\r\n" +
		"ms set:1 6 MA q O1\r\n+a -b \r\n" +
		"mg set:1 c v O2\r\n" +
		"ms set:1 3 T60 C99 O3\r\n+a \r\n" +
		"ms c:1 2 ME O4\r\n12\r\n" +
		"ma c:1 MD D9223372036854775808 v O5\r\n" +
		"md c:1 O6\r\n" +
		"ms value 7 O9\r\nx\r\nmn\r\n\r\n" +
		"mn\r\n"
	if string(buf) != want {
		t.Errorf("pipeline:\n%q\nwant\n%q", buf, want)
	}
	if sent != 8 {
		t.Errorf("sent = %d, want 8", sent)
	}
	for _, i := range []int{7, 8} {
		if replies[i].Status != Failed || !errors.Is(replies[i].Err, itemformat.ErrInvalidKey) || replies[i].Unknown {
			t.Errorf("reply %d = %+v, want an invalid key failure", i, replies[i])
		}
	}
}

// FuzzMetaReadReplies feeds arbitrary reply streams to the reader: it must
// never panic, and a read that succeeds must settle every command with a
// reply that fits it.
func FuzzMetaReadReplies(f *testing.F) {
	for _, fx := range loadMetaFixtures(f) {
		f.Add(fx.Commands, fx.Stream)
	}
	f.Fuzz(func(t *testing.T, spec, stream string) {
		cmds := metaSpecCommands(spec, 100)
		replies, err := readFixture(cmds, stream)
		if err != nil {
			return
		}
		for i, rep := range replies {
			cmd := &cmds[i]
			switch {
			case rep.Status == Pending:
				t.Fatalf("command %d unsettled after a successful read", i)
			case rep.Status == QuietOK && !cmd.Quiet:
				t.Fatalf("loud command %d settled without a reply", i)
			case rep.Status == VA && cmd.Verb != VerbGet && !cmd.ReturnValue:
				t.Fatalf("command %d got a value it did not ask for", i)
			case rep.Status == Failed && rep.Err == nil:
				t.Fatalf("command %d failed without an error", i)
			case rep.Unknown:
				t.Fatalf("command %d has an unknown outcome after a successful read", i)
			}
		}
	})
}

// metaTestConn opens a connection to addr for exchange tests.
func metaTestConn(t testing.TB, addr string) *Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &Conn{nc: nc, r: bufio.NewReaderSize(nc, readBuffer), timeout: 2 * time.Second}
}

func metaExchange(t testing.TB, c *Conn, cmds ...Cmd) []Reply {
	t.Helper()
	replies := make([]Reply, len(cmds))
	if _, err := c.Exchange(context.Background(), cmds, replies); err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return replies
}

// TestMetaVivify pins down memcached's autovivifying arithmetic, on which
// bumps rely: on a miss the item is created holding J exactly (the delta
// is not applied), with N as its TTL, and the creation is answered even in
// quiet mode; an increment of an existing item is not.
func TestMetaVivify(t *testing.T) {
	addr := testsvc.Memcached(t)
	c := metaTestConn(t, addr)
	prefix := "cwmeta:" + testsvc.Unique() + ":"
	bump := func(key string, quiet bool) Cmd {
		return Cmd{Verb: VerbArith, Key: key, Quiet: quiet, Delta: 1, Vivify: true, TTL: 3600, Initial: 1000, ReturnValue: !quiet}
	}
	get := func(key string) Cmd { return Cmd{Verb: VerbGet, Key: key} }
	k1, k2 := prefix+"quiet", prefix+"loud"
	reps := metaExchange(t, c, bump(k1, true), get(k1), bump(k1, true), get(k1), bump(k2, false), bump(k2, false))
	got := make([]string, len(reps))
	for i, r := range reps {
		got[i] = metaReplyToken(r)
		if r.Status == VA {
			got[i] = "VA:" + string(r.Value)
		}
	}
	want := []string{"HD", "VA:1000", "ok", "VA:1001", "VA:1000", "VA:1001"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("replies = %v, want %v", got, want)
	}
	ttl := metaExchange(t, c, Cmd{Verb: VerbGet, Key: k1, ReturnTTL: true})[0].TTL
	if ttl < 3590 || ttl > 3600 {
		t.Errorf("ttl of the created item = %d, want 3600 (N)", ttl)
	}
}

// TestMetaExchangeErrors runs a pipeline against the real server in which
// errors (answered without opaque) sit among quiet commands.
func TestMetaExchangeErrors(t *testing.T) {
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	prefix := "cwmeta:" + testsvc.Unique() + ":"
	text, set := prefix+"text", prefix+"set"
	number := prefix + "number"
	for key, v := range map[string]string{text: "not a number", set: "+a ", number: "5"} {
		if err := mc.Set(&memcache.Item{Key: key, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	c := metaTestConn(t, addr)
	appendTo := func(key string) Cmd {
		return Cmd{Verb: VerbSet, Key: key, Mode: ModeAppend, Quiet: true, Data: "+b "}
	}
	incr := Cmd{Verb: VerbArith, Key: text, Delta: 1}
	quietIncr := incr
	quietIncr.Quiet = true

	// The loud incr's error is placed exactly; the quiet appends succeed.
	reps := metaExchange(t, c, appendTo(set), incr, appendTo(prefix+"missing"), appendTo(set))
	if got := []string{metaReplyToken(reps[0]), metaReplyToken(reps[1]), metaReplyToken(reps[2]), metaReplyToken(reps[3])}; strings.Join(got, " ") != "ok err:client NS ok" {
		t.Fatalf("replies = %v", got)
	}
	// A quiet incr's error among quiet appends is placed by its kind.
	reps = metaExchange(t, c, appendTo(set), quietIncr, appendTo(set))
	if got := metaReplyToken(reps[0]) + " " + metaReplyToken(reps[1]) + " " + metaReplyToken(reps[2]); got != "ok err:client ok" {
		t.Errorf("replies = %s", got)
	}
	// Among quiet incrs, it cannot be: they are resendable.
	numberIncr := Cmd{Verb: VerbArith, Key: number, Quiet: true, Delta: 1}
	reps = metaExchange(t, c, numberIncr, quietIncr, appendTo(set))
	if got := metaReplyToken(reps[0]) + " " + metaReplyToken(reps[1]) + " " + metaReplyToken(reps[2]); got != "resend resend ok" {
		t.Errorf("replies = %s", got)
	}
	it, err := mc.Get(set)
	if err != nil || string(it.Value) != "+a +b +b +b +b +b " {
		t.Fatalf("set = %v, %v", it, err)
	}
	// The connection is still in step.
	if reps := metaExchange(t, c, Cmd{Verb: VerbGet, Key: set}); reps[0].Status != VA {
		t.Fatalf("get after errors: %s", metaReplyToken(reps[0]))
	}
}

// TestMetaExchangeLarge sends more commands and bigger replies than socket
// buffers hold, so that writing and reading must overlap.
func TestMetaExchangeLarge(t *testing.T) {
	addr := testsvc.Memcached(t)
	c := metaTestConn(t, addr)
	prefix := "cwmeta:" + testsvc.Unique() + ":"
	value := strings.Repeat("v", 64<<10)
	const n = 64
	var cmds []Cmd
	for i := range n {
		cmds = append(cmds, Cmd{Verb: VerbSet, Key: prefix + strconv.Itoa(i), Data: value, Quiet: true})
	}
	for i := range n {
		cmds = append(cmds, Cmd{Verb: VerbGet, Key: prefix + strconv.Itoa(i)})
	}
	reps := metaExchange(t, c, cmds...)
	for i, r := range reps {
		want := QuietOK
		if i >= n {
			want = VA
		}
		if r.Status != want || (want == VA && !bytes.Equal(r.Value, []byte(value))) {
			t.Fatalf("reply %d = %s", i, metaReplyToken(r))
		}
	}
}
