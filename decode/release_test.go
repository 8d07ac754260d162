package decode

import (
	"fmt"
	"runtime"
	"testing"
	"weak"

	"github.com/cachewarden/cachewarden/rules"
)

// TestReleaseDropsMessages: once Released, a Decoded keeps no message
// it decoded alive, neither the last one nor an earlier, larger one whose
// columns lay past the last one's in the scratch memory.
func TestReleaseDropsMessages(t *testing.T) {
	message := func(cols int) []byte {
		b := []byte(`{"op":"u","source":{"db":"shop","table":"users","file":"mysql-bin.000001","pos":4},"before":{"id":1`)
		for i := range cols {
			b = fmt.Appendf(b, `,"c%d":"before %d"`, i, i)
		}
		b = append(b, `},"after":{"id":1`...)
		for i := range cols {
			b = fmt.Appendf(b, `,"c%d":"after %d"`, i, i)
		}
		return append(b, `}}`...)
	}
	var d Decoder
	var out Decoded
	big, small := message(40), message(2)
	wBig, wSmall := weak.Make(&big[0]), weak.Make(&small[0])
	for _, m := range [][]byte{big, small} {
		if err := d.Decode(m, rules.Position{Topic: "t"}, &out); err != nil {
			t.Fatal(err)
		}
	}
	if len(out.Events) != 1 || len(out.Events[0].After) != 3 {
		t.Fatalf("decoded %+v", out.Events)
	}
	big, small = nil, nil
	out.Release()
	runtime.GC()
	runtime.GC()
	if wBig.Value() != nil {
		t.Error("the earlier, larger message is still reachable after Release")
	}
	if wSmall.Value() != nil {
		t.Error("the last message is still reachable after Release")
	}
	runtime.KeepAlive(&out)
	// Still usable.
	if err := d.Decode(message(1), rules.Position{Topic: "t"}, &out); err != nil || len(out.Events) != 1 {
		t.Fatalf("after Release: %v, %+v", err, out.Events)
	}
}
