package decode

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// zeros is an endless stream of zero bytes, as /dev/zero.
type zeros struct{ read int64 }

func (z *zeros) Read(p []byte) (int, error) {
	clear(p)
	z.read += int64(len(p))
	return len(p), nil
}

// TestLineReaderLimit reads lines around MaxLineBytes: a line of exactly
// the limit is read, one byte more is refused, and so is an endless line,
// after reading little more than the limit.
func TestLineReaderLimit(t *testing.T) {
	long := strings.Repeat("x", MaxLineBytes)
	for _, tc := range []struct {
		name  string
		in    io.Reader
		lines []int // lengths of the lines read before the end or the error
		fail  bool
	}{
		{name: "short lines", in: strings.NewReader("a\r\nbb\n\nccc"), lines: []int{1, 2, 0, 3}},
		{name: "a line of the limit", in: strings.NewReader(long + "\r\nz\n"), lines: []int{MaxLineBytes, 1}},
		{name: "a last line of the limit", in: strings.NewReader("z\n" + long), lines: []int{1, MaxLineBytes}},
		{name: "a line over the limit", in: strings.NewReader("z\n" + long + "x\nz\n"), lines: []int{1}, fail: true},
		{name: "a last line over the limit", in: strings.NewReader(long + "x"), fail: true},
		{name: "zeros without end", in: &zeros{}, fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := NewLineReader(tc.in)
			var got []int
			var err error
			for {
				line, ok, rerr := lr.Next()
				if rerr != nil || !ok {
					err = rerr
					break
				}
				got = append(got, len(line))
			}
			if len(got) != len(tc.lines) {
				t.Fatalf("lines of %v bytes, want %v", got, tc.lines)
			}
			for i := range got {
				if got[i] != tc.lines[i] {
					t.Fatalf("lines of %v bytes, want %v", got, tc.lines)
				}
			}
			if tc.fail != (err != nil) || (err != nil && !errors.Is(err, ErrLineTooLong)) {
				t.Fatalf("error %v, want ErrLineTooLong: %v", err, tc.fail)
			}
			if err != nil {
				if _, ok, again := lr.Next(); ok || !errors.Is(again, ErrLineTooLong) {
					t.Errorf("Next after the error: ok %v, error %v", ok, again)
				}
			}
			if z, ok := tc.in.(*zeros); ok && z.read > MaxLineBytes+1<<20 {
				t.Errorf("read %d bytes of zeros for a limit of %d", z.read, MaxLineBytes)
			}
		})
	}
}
