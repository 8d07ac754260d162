package decode

import (
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// keyCacheMessages are Debezium messages whose member names resemble each
// other: the same names in other orders, names sharing a first or last
// word, long names differing in the middle, escaped names, a space before
// the ':', names at the very end of the message, and bad values after
// names seen before.
var keyCacheMessages = []string{
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"},"source":{"db":"d","table":"t","ts_ms":5,"pos":7,"file":"f","server_id":3},"op":"c","ts_ms":9}`,
	`{"before":null,"after":{"id":1,"name":"a","created_au":"x"},"source":{"db":"d","table":"t","ts_ms":5,"pos":7,"file":"f","server_id":3},"op":"c","ts_ms":9}`,
	`{"before":null,"after":{"idx":1,"nam":"a","created_at":"x"},"source":{"db":"d","table":"u","ts_ms":"6","pos":-7,"file":"g"},"op":"u","ts_ms":9}`,
	`{"before":null,"after":{"i\u0064":2,"name" :"b","created_at":"y"},"source":{"d\u0062":"e","table" :"t","ts_ms":5.0,"pos":1e3},"op":"c"}`,
	`{"after":{"id":3,"a_very_long_column_name_here":1,"a_very_long_XXlumn_name_here":2},"op":"c","before":null,"source":{"table":"t","db":"d","snapshot":"true","ts_ms":12345678901234567890}}`,
	`{"after":{"id":3,"a_very_long_column_name_here":1,"a_very_long_column_name_herf":2},"op":"r","source":{"table":"t","db":"d","snapshot":1,"snapshot":"last","server_id":0,"server_id":4294967296}}`,
	`{"before":{"id":1},"op":"d","source":{"db":"d","table":"t","pos":0123}}`,
	`{"before":{"id":1},"op":"d","source":{"db":"d","table":"t","pos":01}}`,
	`{"before":null,"after":{"id":tru,"name":"a"},"source":{"db":"d","table":"t"},"op":"c"}`,
	`{"before":null,"after":{"id":1,"name":"a\x01"},"source":{"db":"d","table":"t"},"op":"c"}`,
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"},"source":{"db":"d","table":"t","ts_ms":5,"pos":7,"file":"f\"","server_id":3},"op":"c","ts_ms":9}`,
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"},"source":{"db":"d","table":"t","ts_ms":-5,"pos":7,"file":"f","server_id":3},"op":"c","ts_ms":9}`,
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"},"source":{"db":"d","table":"t","ts_ms":5,"pos":7,"file":"f","server_id":3},"op":"c","ts_ms":9,}`,
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"},"source":{"db":"d","table":"t","ts_ms":5,"pos":7 "file":"f"},"op":"c"}`,
	`{"before":null,"after":{"id":1,"name":"a","created_at":"x"} ,"source" : {"db" :"d", "table":"t"} , "op":"c"}`,
	`{"op":"c","after":{"id":1},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"db":"d","table":"t"},"ts_ms"`,
	`{"op":"c","after":{"id":1},"source":{"db":"d","table":"t"},"op":`,
	`{"schema":{},"payload":{"before":null,"after":{"id":1,"name":"a"},"source":{"db":"d","table":"t"},"op":"c"}}`,
	`{"payload":{"op":"c","after":{"id":1,"name":"a"},"source":{"db":"d","table":"t"}},"schema":{}}`,
	`{"id":1,"name":"a","__op":"c","__db":"d","__table":"t","__source_pos":4}`,
	`{"op":"c","after":{"id":1,"abcdefghijklmnopq":1,"abcdefghijklmnopqrstu":2},"source":{"db":"d","table":"t"}}`,
	`{"op":"c","after":{"id":1,"abcdefgXijklmnopq":1,"abcdefghijklmnopqrstuv":2},"source":{"db":"d","table":"t"}}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000042","pos":1,"row":0,"query":null},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000043","pos":1,"row":0,"query":null},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000043","pos":1,"row":0.5,"query":null},"ts_ms":1}`,
	"{\"op\":\"c\",\"after\":{\"id\":1},\"source\":{\"version\":\"1.0\",\"db\":\"d\",\"table\":\"t\",\"file\":\"mysql-bin.00000004\x01\",\"pos\":1,\"row\":0,\"query\":null},\"ts_ms\":1}",
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000043","pos":12,"row":0,"query":nul},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000043","pos":1,"row":0,"query":null,"x":1},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d\u0041","table":"t","file":"mysql-bin.000000043","pos":1,"row":0,"query":null} ,"ts_ms":1}`,
	"{\"op\":\"c\",\"after\":{\"id\":1},\"source\":{\"version\":\"1.\x01\",\"db\":\"d\",\"table\":\"t\",\"file\":\"mysql-bin.000000043\"},\"ts_ms\":1}",
	`{"op":"c","after":{"id":1},"source":{"version":"1.0", "db":"d","table":"t","file":"mysql-bin.000000043","pos":1,"row":0,"query":null},"ts_ms":1}`,
	`{"op":"c","after":{"id":1},"source":{"version":"1.0","db":"d","table":"t","file":"mysql-bin.000000043","pos":1,"row":0,"query":null}`,
	`{"op":"c","after":{"id":1,"flag":true,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-here","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"flag":true,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-here","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"flag":false,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-here","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"flag":false,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-here","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"flag":true,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-herf","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"flag":true,"n":null,"s":"a\"b","f":1.5,"x":"plain-value-here\u0041","o":{"a":1}},"source":{"db":"d","table":"t"},"ts_ms":1}`,
	`{"op":"c","after":{"id":1,"q\"x":1,"r\u0001":2},"source":{"db":"d","table":"t"}}`,
	`{"op":"c","after":{"id":1,"q"x":1},"source":{"db":"d","table":"t"}}`,
	"{\"op\":\"c\",\"after\":{\"id\":1,\"q\\\"x\":1,\"r\x01\":2},\"source\":{\"db\":\"d\",\"table\":\"t\"}}",
}

// TestKeyCacheAgreesWithFreshDecode checks that a Decoded that has read
// other messages decodes each message exactly as a new one does: events,
// format, skip reason and error.
func TestKeyCacheAgreesWithFreshDecode(t *testing.T) {
	msgs := append([]string(nil), keyCacheMessages...)
	files, _ := filepath.Glob(filepath.Join("testdata", "decode", "*.ndjson"))
	for _, file := range files {
		msgs = append(msgs, fixtureLines(t, filepath.Base(file))...)
	}
	// One Decoded per decoder: a Decoded forgets the names it has seen
	// when used with another Keep.
	warm := make([]Decoded, len(fuzzDecoders))
	for round := range 3 {
		for i := range msgs {
			m := msgs[i]
			if round == 1 {
				m = msgs[len(msgs)-1-i] // other orders
			}
			for k, d := range fuzzDecoders {
				compareWarmDecode(t, d, &warm[k], []byte(m))
			}
		}
	}
}

// compareWarmDecode decodes value with d into warm and into a new
// Decoded and fails when the results differ.
func compareWarmDecode(t *testing.T, d Decoder, warm *Decoded, value []byte) {
	t.Helper()
	var fresh Decoded
	pos := rules.Position{Topic: "t", Offset: 1}
	errFresh := d.Decode(value, pos, &fresh)
	errWarm := d.Decode(value, pos, warm)
	if (errFresh == nil) != (errWarm == nil) || (errFresh != nil && errFresh.Error() != errWarm.Error()) {
		t.Fatalf("%v %q: error %v after other messages, %v on its own", d.Format, value, errWarm, errFresh)
	}
	if fresh.Format != warm.Format || fresh.Skip != warm.Skip || (len(fresh.Events) != 0 || len(warm.Events) != 0) && !reflect.DeepEqual(fresh.Events, warm.Events) {
		t.Fatalf("%v %q: decoded %+v (%v, skip %q) after other messages, %+v (%v, skip %q) on its own",
			d.Format, value, warm.Events, warm.Format, warm.Skip, fresh.Events, fresh.Format, fresh.Skip)
	}
}

// TestKeyCacheBounded checks that a Decoded reading messages with ever new
// member names keeps decoding them correctly once it remembers no more.
func TestKeyCacheBounded(t *testing.T) {
	var warm Decoded
	d := Decoder{}
	var b strings.Builder
	for n := range maxKeyNodes/4 + 10 {
		b.Reset()
		b.WriteString(`{"op":"c","after":{`)
		for c := range 5 {
			if c > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"c`)
			b.WriteString(strings.Repeat("x", n%20))
			b.WriteByte(byte('a' + c))
			b.WriteString(strconv.Itoa(n))
			b.WriteString(`":1`)
		}
		b.WriteString(`},"source":{"db":"d","table":"t"}}`)
		compareWarmDecode(t, d, &warm, []byte(b.String()))
	}
	if n := len(warm.st.keys.nodes); n > maxKeyNodes {
		t.Fatalf("%d names remembered, at most %d wanted", n, maxKeyNodes)
	}
}
