package decode

import "testing"

// TestSpecialBytes checks specialBytes against a bytewise reading: for
// every byte value at every position of a word of plain bytes, and for
// pairs of special bytes, the lowest flagged byte is the first special
// one.
func TestSpecialBytes(t *testing.T) {
	special := func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' }
	fills := []byte{'a', ' ', '!', '#', '[', ']', 0x7f, 0x80, 0xff, 0x21, 0x23}
	check := func(w [8]byte) {
		t.Helper()
		want := 8
		for k, c := range w {
			if special(c) {
				want = k
				break
			}
		}
		var x uint64
		for k := 7; k >= 0; k-- {
			x = x<<8 | uint64(w[k])
		}
		got := 8
		if m := specialBytes(x); m != 0 {
			for k := range 8 {
				if m>>(8*k+7)&1 != 0 {
					got = k
					break
				}
			}
		}
		if got != want {
			t.Fatalf("word % x: first special byte at %d, want %d", w, got, want)
		}
	}
	for _, fill := range fills {
		for pos := range 8 {
			for c := range 256 {
				var w [8]byte
				for k := range w {
					w[k] = fill
				}
				w[pos] = byte(c)
				check(w)
				for pos2 := pos + 1; pos2 < 8; pos2++ {
					for _, c2 := range []byte{0, 0x1f, '"', '\\', 0x20, 0x21, 0x22, 0x5b, 0x5d, 0x80} {
						w2 := w
						w2[pos2] = c2
						check(w2)
					}
				}
			}
		}
	}
}
