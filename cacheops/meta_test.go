package cacheops

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
// EX, EN, VA:<value>:<cas>, err:<kind> (too-large, client, server),
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
func metaSpecCommands(spec string, limit int) []metaCmd {
	var cmds []metaCmd
	for i := 0; i < len(spec) && len(cmds) < limit; {
		c := spec[i]
		i++
		n := 0
		for i < len(spec) && spec[i] >= '0' && spec[i] <= '9' && n < limit {
			n = n*10 + int(spec[i]-'0')
			i++
		}
		n = max(n, 1)
		var cmd metaCmd
		switch c {
		case 'q':
			cmd = metaCmd{verb: metaSet, mode: metaModeAppend, quiet: true, data: "+m "}
		case 'b':
			cmd = metaCmd{verb: metaArith, quiet: true, delta: 1, vivify: true, initial: 1}
		case 'l':
			cmd = metaCmd{verb: metaArith, delta: 1}
		case 'v':
			cmd = metaCmd{verb: metaArith, mode: metaModeDecr, delta: 1, returnValue: true}
		case 'g':
			cmd = metaCmd{verb: metaGet}
		case 'x':
			cmd = metaCmd{verb: metaGet, key: "bad key"}
		default:
			continue
		}
		for range min(n, limit-len(cmds)) {
			if c != 'x' {
				cmd.key = "k" + strconv.Itoa(len(cmds))
			}
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

// metaReplyToken renders a reply in the fixtures' notation.
func metaReplyToken(rep metaReply) string {
	switch rep.status {
	case metaPending:
		return "pending"
	case metaQuietOK:
		return "ok"
	case metaHD:
		return "HD"
	case metaVA:
		return fmt.Sprintf("VA:%s:%d", rep.value, rep.cas)
	case metaEN:
		return "EN"
	case metaNF:
		return "NF"
	case metaNS:
		return "NS"
	case metaEX:
		return "EX"
	case metaFailed:
		switch {
		case rep.resend:
			return "resend"
		case errors.Is(rep.err, ErrInvalidKey):
			return "invalid"
		case errors.Is(rep.err, ErrTooLarge):
			return "err:too-large"
		case errors.Is(rep.err, memcache.ErrServerError):
			return "err:server"
		case metaIsClientError(rep.err) || errors.Is(rep.err, ErrInvalidOp):
			return "err:client"
		}
		return "err:" + rep.err.Error()
	}
	return "status " + strconv.Itoa(int(rep.status))
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
func readFixture(cmds []metaCmd, stream string) ([]metaReply, error) {
	replies := make([]metaReply, len(cmds))
	metaAppendPipeline(nil, cmds, replies)
	r := bufio.NewReaderSize(strings.NewReader(stream), 64)
	err := metaReadReplies(r, cmds, replies)
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
					t.Errorf("reply %d = %s, want %s (err %v)", i, got, want[i], rep.err)
				}
			}
		})
	}
}

func TestMetaAppendPipeline(t *testing.T) {
	cmds := []metaCmd{
		{verb: metaArith, key: "ns:1", quiet: true, delta: 1, vivify: true, ttl: 3600, initial: 1700000000123},
		{verb: metaSet, key: "set:1", mode: metaModeAppend, quiet: true, data: "+a -b "},
		{verb: metaGet, key: "set:1"},
		{verb: metaSet, key: "set:1", data: "+a ", cas: 99, ttl: 60, hasTTL: true},
		{verb: metaSet, key: "c:1", mode: metaModeAdd, data: "12"},
		{verb: metaArith, key: "c:1", mode: metaModeDecr, delta: 1 << 63, returnValue: true},
		{verb: metaDelete, key: "c:1"},
		{verb: metaGet, key: "has space"},
		{verb: metaSet, key: "data\r\nmg x", data: "v"},
		{verb: metaSet, key: "value", data: "x\r\nmn\r\n"},
	}
	replies := make([]metaReply, len(cmds))
	buf, sent := metaAppendPipeline(nil, cmds, replies)
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
		if replies[i].status != metaFailed || !errors.Is(replies[i].err, ErrInvalidKey) || replies[i].unknown {
			t.Errorf("reply %d = %+v, want an invalid key failure", i, replies[i])
		}
	}
}

func TestMetaCheckKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{strings.Repeat("k", 250), true},
		{"caf\xc3\xa9:%20", true},
		{"", false},
		{strings.Repeat("k", 251), false},
		{"a b", false},
		{"a\x00", false},
		{"a\x7f", false},
		{"a\r\n", false},
	} {
		if err := itemformat.CheckKey(tc.key); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidKey)) {
			t.Errorf("itemformat.CheckKey(%q) = %v", tc.key, err)
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
			case rep.status == metaPending:
				t.Fatalf("command %d unsettled after a successful read", i)
			case rep.status == metaQuietOK && !cmd.quiet:
				t.Fatalf("loud command %d settled without a reply", i)
			case rep.status == metaVA && cmd.verb != metaGet && !cmd.returnValue:
				t.Fatalf("command %d got a value it did not ask for", i)
			case rep.status == metaFailed && rep.err == nil:
				t.Fatalf("command %d failed without an error", i)
			case rep.unknown:
				t.Fatalf("command %d has an unknown outcome after a successful read", i)
			}
		}
	})
}

// metaTestConn opens a connection to addr for exchange tests.
func metaTestConn(t testing.TB, addr string) *metaConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &metaConn{nc: nc, r: bufio.NewReaderSize(nc, metaReadBuffer)}
}

func metaExchange(t testing.TB, c *metaConn, cmds ...metaCmd) []metaReply {
	t.Helper()
	replies := make([]metaReply, len(cmds))
	if _, err := c.exchange(context.Background(), cmds, replies, 2*time.Second); err != nil {
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
	bump := func(key string, quiet bool) metaCmd {
		return metaCmd{verb: metaArith, key: key, quiet: quiet, delta: 1, vivify: true, ttl: 3600, initial: 1000, returnValue: !quiet}
	}
	get := func(key string) metaCmd { return metaCmd{verb: metaGet, key: key} }
	k1, k2 := prefix+"quiet", prefix+"loud"
	reps := metaExchange(t, c, bump(k1, true), get(k1), bump(k1, true), get(k1), bump(k2, false), bump(k2, false))
	got := make([]string, len(reps))
	for i, r := range reps {
		got[i] = metaReplyToken(r)
		if r.status == metaVA {
			got[i] = "VA:" + string(r.value)
		}
	}
	want := []string{"HD", "VA:1000", "ok", "VA:1001", "VA:1000", "VA:1001"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("replies = %v, want %v", got, want)
	}
	ttl := plTTL(t, addr, k1)
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
	appendTo := func(key string) metaCmd {
		return metaCmd{verb: metaSet, key: key, mode: metaModeAppend, quiet: true, data: "+b "}
	}
	incr := metaCmd{verb: metaArith, key: text, delta: 1}
	quietIncr := incr
	quietIncr.quiet = true

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
	numberIncr := metaCmd{verb: metaArith, key: number, quiet: true, delta: 1}
	reps = metaExchange(t, c, numberIncr, quietIncr, appendTo(set))
	if got := metaReplyToken(reps[0]) + " " + metaReplyToken(reps[1]) + " " + metaReplyToken(reps[2]); got != "resend resend ok" {
		t.Errorf("replies = %s", got)
	}
	it, err := mc.Get(set)
	if err != nil || string(it.Value) != "+a +b +b +b +b +b " {
		t.Fatalf("set = %v, %v", it, err)
	}
	// The connection is still in step.
	if reps := metaExchange(t, c, metaCmd{verb: metaGet, key: set}); reps[0].status != metaVA {
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
	var cmds []metaCmd
	for i := range n {
		cmds = append(cmds, metaCmd{verb: metaSet, key: prefix + strconv.Itoa(i), data: value, quiet: true})
	}
	for i := range n {
		cmds = append(cmds, metaCmd{verb: metaGet, key: prefix + strconv.Itoa(i)})
	}
	reps := metaExchange(t, c, cmds...)
	for i, r := range reps {
		want := metaQuietOK
		if i >= n {
			want = metaVA
		}
		if r.status != want || (want == metaVA && !bytes.Equal(r.value, []byte(value))) {
			t.Fatalf("reply %d = %s", i, metaReplyToken(r))
		}
	}
}
