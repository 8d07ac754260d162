package replay

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestFormatReplayProgress(t *testing.T) {
	tests := []struct {
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{120000, 500000, 40 * time.Second, "replay: 120000/500000 messages (24.0%), 3000 msg/s, ETA 2m7s"},
		{0, 500, 0, "replay: 0/500 messages (0.0%), 0.0 msg/s, ETA ?"},
		{3, 10, 2 * time.Second, "replay: 3/10 messages (30.0%), 1.5 msg/s, ETA 5s"},
		{10, 10, time.Second, "replay: 10/10 messages (100.0%), 10 msg/s, ETA 0s"},
		{1234, 0, 2 * time.Second, "replay: 1234 messages, 617 msg/s"},
	}
	for _, tt := range tests {
		if got := formatReplayProgress(tt.done, tt.total, tt.elapsed); got != tt.want {
			t.Errorf("formatReplayProgress(%d, %d, %s) = %q, want %q", tt.done, tt.total, tt.elapsed, got, tt.want)
		}
	}
}

// progressLine matches a plain progress line with a known total.
var progressLine = regexp.MustCompile(`^replay: \d+/\d+ messages \(\d+\.\d%\), \d+(\.\d)? msg/s, ETA (\?|[0-9hms]+)(, recounting \d+ counter keys)?$`)

// TestReplayProgressPlain checks the periodic plain lines written when the
// output is not a terminal, and that other lines pass through untouched.
func TestReplayProgressPlain(t *testing.T) {
	var buf lockedBuffer
	p := NewProgress(&buf, false, 5*time.Millisecond)
	p.begin(1000)
	p.add(250)
	waitFor(t, 5*time.Second, func() string {
		if strings.Count(buf.String(), "\n") < 2 {
			return "fewer than two progress lines"
		}
		return ""
	})
	fmt.Fprintf(p.Writer(), "line 7: bad\n")
	p.add(750)
	p.setNote("recounting 5 counter keys")
	waitFor(t, 5*time.Second, func() string {
		if !strings.Contains(buf.String(), ", ETA 0s, recounting 5 counter keys\n") {
			return "no line with the note"
		}
		return ""
	})
	p.end()
	out := buf.String()
	if strings.ContainsAny(out, "\r\x1b") {
		t.Errorf("terminal control characters in plain output: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	reports := 0
	for _, l := range lines {
		if l == "line 7: bad" {
			reports++
			continue
		}
		if !progressLine.MatchString(l) || !strings.HasPrefix(l, "replay: 250/1000 messages (25.0%)") && !strings.HasPrefix(l, "replay: 1000/1000") {
			t.Errorf("unexpected line %q", l)
		}
	}
	if reports != 1 {
		t.Errorf("the report line appears %d times in %q", reports, out)
	}
	// Nothing more after end.
	time.Sleep(20 * time.Millisecond)
	if buf.String() != out {
		t.Errorf("progress written after end: %q", strings.TrimPrefix(buf.String(), out))
	}
}

// TestReplayProgressTerminal checks the in-place line: drawn with "\r" and
// erased before another line is written through Writer.
func TestReplayProgressTerminal(t *testing.T) {
	var buf lockedBuffer
	p := NewProgress(&buf, true, 0)
	p.begin(4)
	p.add(1)
	waitFor(t, 5*time.Second, func() string {
		if !strings.Contains(buf.String(), "\rreplay: 1/4 messages (25.0%)") {
			return "no in-place line yet"
		}
		return ""
	})
	fmt.Fprintf(p.Writer(), "line 2: bad\n")
	p.add(3)
	p.end()
	out := buf.String()
	if !strings.Contains(out, "\x1b[K"+"\r\x1b[K"+"line 2: bad\n\rreplay: 1/4") {
		t.Errorf("the report does not erase and redraw the line: %q", out)
	}
	if !strings.HasSuffix(out, "\rreplay: 4/4 messages (100.0%), "+lastRate(out)+" msg/s, ETA 0s\x1b[K\n") {
		t.Errorf("the final state is not left on screen: %q", out)
	}
	if strings.Contains(strings.ReplaceAll(out, "line 2: bad\n", ""), "\n\r") || strings.Count(out, "\n") != 2 {
		t.Errorf("progress lines were not drawn in place: %q", out)
	}
}

// lastRate returns the rate of the last progress line in out.
func lastRate(out string) string {
	i := strings.LastIndex(out, "(100.0%), ")
	if i < 0 {
		return "?"
	}
	rest := out[i+len("(100.0%), "):]
	return rest[:strings.Index(rest, " ")]
}
