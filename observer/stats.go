package observer

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Counts are check results.
type Counts struct {
	Consistent   uint64 `json:"consistent"`
	Inconsistent uint64 `json:"inconsistent"`
	Missing      uint64 `json:"missing"`
	NotJudged    uint64 `json:"not_judged"`
}

func (c *Counts) add(r Result, n uint64) {
	switch r {
	case Consistent:
		c.Consistent += n
	case Inconsistent:
		c.Inconsistent += n
	case Missing:
		c.Missing += n
	default:
		c.NotJudged += n
	}
}

// Judged is the number of items judged: consistent, missing or
// inconsistent.
func (c Counts) Judged() uint64 { return c.Consistent + c.Missing + c.Inconsistent }

// Nines returns -log10(1 - good/judged), good being the consistent and
// missing items: 2 for 99%, 3 for 99.9%. It is +Inf when nothing judged
// was inconsistent, and NaN when nothing was judged.
func (c Counts) Nines() float64 {
	j := c.Judged()
	if j == 0 {
		return math.NaN()
	}
	if c.Inconsistent == 0 {
		return math.Inf(1)
	}
	// Abs: all judged inconsistent is 0 nines, not -0.
	return math.Abs(-math.Log10(float64(c.Inconsistent) / float64(j)))
}

// NinesText renders Nines for logs: "all" when nothing judged was
// inconsistent, "none judged", or the value with two decimals.
func (c Counts) NinesText() string {
	n := c.Nines()
	switch {
	case math.IsNaN(n):
		return "none judged"
	case math.IsInf(n, 1):
		return "all"
	}
	return strconv.FormatFloat(n, 'f', 2, 64)
}

// Nines is a number of nines in JSON: a number, "+Inf" when nothing judged
// was inconsistent, null when nothing was judged.
type Nines float64

// MarshalJSON implements json.Marshaler.
func (n Nines) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte("null"), nil
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	}
	return strconv.AppendFloat(nil, f, 'f', 3, 64), nil
}

// WindowStatus is the status of one window.
type WindowStatus struct {
	Window string `json:"window"`
	// Total counts every check since the observer started, Last those of
	// the last report interval (ReportEvery).
	Total Counts `json:"total"`
	// TotalJudged is Total.Judged(), the items TotalNines rest on.
	TotalJudged uint64 `json:"total_judged"`
	TotalNines  Nines  `json:"total_nines"`
	Last        Counts `json:"last_interval"`
	// LastJudged is Last.Judged(), the items LastNines rest on.
	LastJudged uint64 `json:"last_interval_judged"`
	LastNines  Nines  `json:"last_interval_nines"`
}

// Status is what StatusHandler serves.
type Status struct {
	Enabled  bool      `json:"enabled"`
	Detached bool      `json:"detached,omitempty"`
	Sample   float64   `json:"sample,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	// LastInterval is when the last report interval ended.
	LastInterval time.Time      `json:"last_interval_end,omitzero"`
	Windows      []WindowStatus `json:"windows,omitempty"`
	// Rules counts each rule's checks since the start, per window.
	Rules map[string][]WindowStatus `json:"rules,omitempty"`
}

// stats keeps the counts the status page and the report show.
type stats struct {
	mu      sync.Mutex
	windows []time.Duration
	since   time.Time
	lastEnd time.Time
	total   []Counts
	current []Counts
	last    []Counts
	rules   map[string][]Counts
}

func newStats(windows []time.Duration, now time.Time) *stats {
	n := len(windows)
	return &stats{windows: windows, since: now, total: make([]Counts, n), current: make([]Counts, n), last: make([]Counts, n), rules: map[string][]Counts{}}
}

func (s *stats) add(rule string, w int, r Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total[w].add(r, 1)
	s.current[w].add(r, 1)
	rc := s.rules[rule]
	if rc == nil {
		rc = make([]Counts, len(s.windows))
		s.rules[rule] = rc
	}
	rc[w].add(r, 1)
}

// rotate ends a report interval and returns its counts.
func (s *stats) rotate(now time.Time) []Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.last, s.current)
	clear(s.current)
	s.lastEnd = now
	return append([]Counts(nil), s.last...)
}

func (s *stats) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Enabled: true, Since: s.since, LastInterval: s.lastEnd, Rules: map[string][]WindowStatus{}}
	for i, w := range s.windows {
		st.Windows = append(st.Windows, WindowStatus{Window: w.String(), Total: s.total[i], TotalJudged: s.total[i].Judged(), TotalNines: Nines(s.total[i].Nines()),
			Last: s.last[i], LastJudged: s.last[i].Judged(), LastNines: Nines(s.last[i].Nines())})
	}
	for rule, rc := range s.rules {
		for i, w := range s.windows {
			st.Rules[rule] = append(st.Rules[rule], WindowStatus{Window: w.String(), Total: rc[i], TotalJudged: rc[i].Judged(), TotalNines: Nines(rc[i].Nines())})
		}
	}
	return st
}

// Status returns the observer's counts.
func (o *Observer) Status() Status {
	st := o.stats.status()
	st.Detached, st.Sample = o.cfg.Detached, o.cfg.Sample
	return st
}

// Totals returns the counts of every check since the start, per window
// (in Config.Windows order).
func (o *Observer) Totals() []Counts {
	o.stats.mu.Lock()
	defer o.stats.mu.Unlock()
	return append([]Counts(nil), o.stats.total...)
}

// report logs each window's counts and nines every ReportEvery.
func (o *Observer) report() {
	defer o.wg.Done()
	tick := time.NewTicker(o.cfg.ReportEvery)
	defer tick.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-tick.C:
		}
		for i, c := range o.stats.rotate(o.deps.Now()) {
			o.log.Info("consistency", "window", o.cfg.Windows[i].String(), "interval", o.cfg.ReportEvery.String(),
				"nines", c.NinesText(), "judged", c.Judged(), "consistent", c.Consistent, "missing", c.Missing,
				"inconsistent", c.Inconsistent, "not_judged", c.NotJudged)
		}
	}
}

// StatusHandler serves the observer's Status as JSON (`/status`); with a
// nil observer it serves {"enabled": false}. It is safe for concurrent
// use.
func StatusHandler(o *Observer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := Status{}
		if o != nil {
			st = o.Status()
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Observer Status `json:"observer"`
		}{st})
	})
}
