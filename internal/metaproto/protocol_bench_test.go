package metaproto

import (
	"bufio"
	"bytes"
	"strconv"
	"testing"
)

// benchExchange is one exchange of the mix the daemon sends: reads with a
// value, loud stores, quiet bumps that vivify, counter deltas that return
// their value; and the replies memcached sends to it.
func benchExchange(n int) (cmds []Cmd, replies []byte) {
	cmds = make([]Cmd, n)
	for i := range cmds {
		key := "cw:bench:" + strconv.Itoa(i)
		switch i % 4 {
		case 0:
			cmds[i] = Cmd{Verb: VerbGet, Key: key, ReturnTTL: true}
			replies = append(replies, "VA 5 c12345 t-1 O"+strconv.Itoa(i)+"\r\nhello\r\n"...)
		case 1:
			cmds[i] = Cmd{Verb: VerbSet, Key: key, Data: "+a +b ", Mode: ModeAppend, HasTTL: true, TTL: 3600}
			replies = append(replies, "HD O"+strconv.Itoa(i)+"\r\n"...)
		case 2:
			cmds[i] = Cmd{Verb: VerbArith, Key: key, Quiet: true, Delta: 1, Vivify: true, TTL: 3600, Initial: 1700000000456}
		case 3:
			cmds[i] = Cmd{Verb: VerbArith, Key: key, Mode: ModeDecr, Delta: 2, ReturnValue: true}
			replies = append(replies, "VA 2 O"+strconv.Itoa(i)+"\r\n40\r\n"...)
		}
		if (i+1)%anchorEvery == 0 || i == n-1 {
			replies = append(replies, "MN\r\n"...)
		}
	}
	return cmds, replies
}

// BenchmarkAppendPipeline encodes an exchange of 2000 commands.
func BenchmarkAppendPipeline(b *testing.B) {
	cmds, _ := benchExchange(2000)
	replies := make([]Reply, len(cmds))
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = appendPipeline(buf[:0], cmds, replies)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkReadReplies reads the replies to an exchange of 2000 commands.
func BenchmarkReadReplies(b *testing.B) {
	cmds, stream := benchExchange(2000)
	replies := make([]Reply, len(cmds))
	src := bytes.NewReader(stream)
	r := bufio.NewReaderSize(src, readBuffer)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(stream)
		r.Reset(src)
		clear(replies)
		if err := readReplies(r, cmds, replies); err != nil {
			b.Fatal(err)
		}
	}
}
