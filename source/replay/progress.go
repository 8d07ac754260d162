package replay

import (
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Progress line settings.
const (
	// DefaultProgressInterval is how often a plain progress line is
	// written when the output is not a terminal.
	DefaultProgressInterval = 5 * time.Second
	// terminalRedraw is how often the in-place line is redrawn on a
	// terminal.
	terminalRedraw = 250 * time.Millisecond
)

// Progress writes a replay's progress line:
//
//	replay: 120000/500000 messages (24.0%), 3100 msg/s, ETA 2m2s
//
// Messages are Kafka offsets (a range's offsets count even when
// compaction removed their record) or input lines; the rate is the
// average since the start. Without a known total the line has no share
// and no ETA. While recounts run, the line ends with
// ", recounting N counter keys". On a terminal the line is redrawn in place ("\r") a few
// times a second and left on screen at the end; otherwise a plain line is
// written every interval (none when interval <= 0).
//
// Everything else a replay writes to the same output (error reports,
// logs) must go through Writer, which moves an in-place line out of the
// way. A Progress is safe for concurrent use.
type Progress struct {
	w        io.Writer
	terminal bool
	interval time.Duration

	done  atomic.Int64
	total atomic.Int64

	mu      sync.Mutex
	start   time.Time
	note    string // what the replay does besides reading, e.g. recounting
	drawn   bool   // an in-place line is on screen
	running bool
	stop    chan struct{}
	stopped chan struct{}
}

// NewProgress returns a progress line writer on w. terminal says
// whether w is a terminal; interval is the period of plain lines
// (DefaultProgressInterval when zero, none when negative).
func NewProgress(w io.Writer, terminal bool, interval time.Duration) *Progress {
	if interval == 0 {
		interval = DefaultProgressInterval
	}
	if terminal {
		interval = terminalRedraw
	}
	return &Progress{w: w, terminal: terminal, interval: interval}
}

// Writer returns a writer to the same output for other lines: on a
// terminal it erases the progress line, writes, and draws it again. Each
// Write should be whole lines.
func (p *Progress) Writer() io.Writer { return progressWriter{p} }

type progressWriter struct{ p *Progress }

func (pw progressWriter) Write(b []byte) (int, error) {
	p := pw.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		io.WriteString(p.w, "\r\x1b[K")
		p.drawn = false
	}
	n, err := p.w.Write(b)
	if p.terminal && p.running {
		p.drawLocked(time.Now())
	}
	return n, err
}

// begin starts the clock and the periodic line for a replay of total
// messages (0: unknown).
func (p *Progress) begin(total int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done.Store(0)
	p.total.Store(total)
	p.start = time.Now()
	p.note = ""
	p.running = true
	if p.interval <= 0 {
		return
	}
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	go p.loop(p.stop, p.stopped)
}

func (p *Progress) loop(stop, stopped chan struct{}) {
	defer close(stopped)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p.mu.Lock()
			if p.terminal {
				p.drawLocked(now)
			} else {
				fmt.Fprintln(p.w, p.lineLocked(now))
			}
			p.mu.Unlock()
		}
	}
}

// add records n more messages done.
func (p *Progress) add(n int64) {
	if p != nil && n > 0 {
		p.done.Add(n)
	}
}

// setNote adds a note to the line, such as the recounts running; ""
// removes it.
func (p *Progress) setNote(note string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.note = note
	p.mu.Unlock()
}

// end stops the periodic line; on a terminal the last state stays on
// screen, followed by a newline.
func (p *Progress) end() {
	if p == nil {
		return
	}
	p.mu.Lock()
	stop, stopped := p.stop, p.stopped
	p.stop, p.stopped = nil, nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-stopped
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal && p.running {
		p.drawLocked(time.Now())
		io.WriteString(p.w, "\n")
		p.drawn = false
	}
	p.running = false
}

func (p *Progress) drawLocked(now time.Time) {
	io.WriteString(p.w, "\r"+p.lineLocked(now)+"\x1b[K")
	p.drawn = true
}

func (p *Progress) lineLocked(now time.Time) string {
	line := formatReplayProgress(p.done.Load(), p.total.Load(), now.Sub(p.start))
	if p.note != "" {
		line += ", " + p.note
	}
	return line
}

// formatReplayProgress renders the progress line (see Progress).
func formatReplayProgress(done, total int64, elapsed time.Duration) string {
	b := make([]byte, 0, 80)
	b = append(b, "replay: "...)
	b = strconv.AppendInt(b, done, 10)
	if total > 0 {
		b = append(b, '/')
		b = strconv.AppendInt(b, total, 10)
	}
	b = append(b, " messages"...)
	if total > 0 {
		b = fmt.Appendf(b, " (%.1f%%)", 100*float64(done)/float64(total))
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	b = append(b, ", "...)
	b = appendRate(b, rate)
	b = append(b, " msg/s"...)
	if total > 0 {
		b = append(b, ", ETA "...)
		switch {
		case done >= total:
			b = append(b, '0', 's')
		case rate <= 0:
			b = append(b, '?')
		default:
			eta := time.Duration(float64(total-done) / rate * float64(time.Second))
			b = append(b, eta.Round(time.Second).String()...)
		}
	}
	return string(b)
}

// appendRate writes a rate with one decimal below 10 and none above.
func appendRate(b []byte, rate float64) []byte {
	if rate < 10 {
		return strconv.AppendFloat(b, rate, 'f', 1, 64)
	}
	return strconv.AppendFloat(b, rate, 'f', 0, 64)
}
