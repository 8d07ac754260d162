package bench

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// mb converts bytes to megabytes (10^6 bytes), the unit of every memory
// figure the benchmark reports.
func mb(b uint64) float64 { return float64(b) / 1e6 }

// Median returns the median of xs (the mean of the middle two for an even
// count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// SummaryRow holds the medians over the runs of one consumer on one
// workload.
type SummaryRow struct {
	Workload         Distribution
	Consumer         string
	Runs             int
	EventsPerSec     float64
	CPUPerEvent      float64 // µs
	CommandsPerEvent float64
	// WritesPerEvent is the median of memcached requests (TCP data
	// segments) per event; NaN when not counted. WritesPartial is true
	// when a run's count was a lower bound.
	WritesPerEvent float64
	WritesPartial  bool
	PeakRSS        float64 // MB
	MaxPeakRSS     float64 // MB, the largest of the runs
	StartupSec     float64 // time to the first commit, s
	// Recounts and RecountsPerSec are the median counter recounts the
	// daemon stored per run and per second of the run (daemon runs only;
	// NaN otherwise).
	Recounts, RecountsPerSec float64
}

// LatencySummary pools the latency runs: the percentiles are over every
// sample of every run.
type LatencySummary struct {
	Rate, Achieved            float64 // offered, and the median achieved
	P50, P99, P999, Max       time.Duration
	AckP50, AckP99, AckP999   time.Duration
	Samples                   int // over all runs
	Missing                   int // over all runs
	Runs                      int
	MedianRunP99, WorstRunP99 time.Duration
	// EventAge is the daemon's event-age histogram summed over the runs
	// (empty when not scraped).
	EventAge Histogram
	// FetchToApply is the daemon's fetch-to-apply histogram summed over
	// the runs (empty when not scraped).
	FetchToApply Histogram
}

// Summary is the median view of Results.
type Summary struct {
	Rows    []SummaryRow
	Latency *LatencySummary
	// LatencyFetchOnly pools the fetch-only latency runs (the harness
	// reading at the same offered rate, no daemon); nil when not measured.
	LatencyFetchOnly *LatencySummary
	// Ceiling is the median events/s of the fetch-only reads (0 when not
	// measured).
	Ceiling float64
	// CeilingClientCPU is the median CPU µs per event of the client of
	// the fetch-only reads.
	CeilingClientCPU float64
}

// Row returns the summary of consumer on wl, if measured.
func (s Summary) Row(wl Distribution, consumer string) (SummaryRow, bool) {
	for _, r := range s.Rows {
		if r.Workload == wl && r.Consumer == consumer {
			return r, true
		}
	}
	return SummaryRow{}, false
}

// allConsumers lists every consumer in the order the tables show them.
var allConsumers = []string{ConsumerNaive, ConsumerCompetent, ConsumerCachewarden, ConsumerObserved, ConsumerFenced, ConsumerUnfenced}

// Summarize takes the medians over runs and pools the latency samples.
func Summarize(res *Results) Summary {
	var s Summary
	for _, wl := range res.Options.Workloads {
		for _, c := range allConsumers {
			var eps, cpu, cmds, writes, rss, startup, recounts, recountRate []float64
			writesKnown, writesPartial := true, false
			for _, r := range res.Consumers {
				if r.Workload != wl || r.Consumer != c {
					continue
				}
				eps = append(eps, r.EventsPerSec())
				cpu = append(cpu, r.CPUPerEvent())
				cmds = append(cmds, r.CommandsPerEvent())
				writes = append(writes, r.WritesPerEvent())
				writesKnown = writesKnown && r.MCWritesKnown
				writesPartial = writesPartial || r.MCWritesPartial
				rss = append(rss, mb(r.PeakRSS))
				startup = append(startup, r.FirstCommit.Seconds())
				if r.Daemon != nil {
					recounts = append(recounts, r.Daemon.Recounts())
					recountRate = append(recountRate, r.Daemon.Recounts()/r.Elapsed.Seconds())
				}
			}
			if len(eps) == 0 {
				continue
			}
			row := SummaryRow{
				Workload: wl, Consumer: c, Runs: len(eps),
				EventsPerSec: Median(eps), CPUPerEvent: Median(cpu), CommandsPerEvent: Median(cmds),
				WritesPerEvent: math.NaN(), WritesPartial: writesPartial,
				PeakRSS: Median(rss), MaxPeakRSS: slices.Max(rss), StartupSec: Median(startup),
				Recounts: math.NaN(), RecountsPerSec: math.NaN(),
			}
			if writesKnown {
				row.WritesPerEvent = Median(writes)
			}
			if len(recounts) > 0 {
				row.Recounts, row.RecountsPerSec = Median(recounts), Median(recountRate)
			}
			s.Rows = append(s.Rows, row)
		}
	}
	var ceil, ceilCPU []float64
	for _, c := range res.Ceiling {
		ceil = append(ceil, c.EventsPerSec())
		ceilCPU = append(ceilCPU, c.ClientCPUPerEvent())
	}
	s.Ceiling, s.CeilingClientCPU = Median(ceil), Median(ceilCPU)
	if len(res.Latency) > 0 {
		s.Latency = poolLatency(res.Latency)
	}
	if len(res.LatencyFetchOnly) > 0 {
		s.LatencyFetchOnly = poolLatency(res.LatencyFetchOnly)
	}
	return s
}

// poolLatency pools the samples of the latency runs.
func poolLatency(runs []LatencyResult) *LatencySummary {
	l := &LatencySummary{Rate: runs[0].Rate, Runs: len(runs)}
	var lat, ack []time.Duration
	var ach, p99 []float64
	for _, r := range runs {
		lat = append(lat, r.Latencies...)
		ack = append(ack, r.AckLatencies...)
		ach = append(ach, r.Achieved)
		p99 = append(p99, float64(r.P99))
		l.Samples += r.Samples
		l.Missing += r.Missing
		l.WorstRunP99 = max(l.WorstRunP99, r.P99)
		l.EventAge = l.EventAge.plus(r.EventAge)
		l.FetchToApply = l.FetchToApply.plus(r.FetchToApply)
	}
	slices.Sort(lat)
	slices.Sort(ack)
	l.P50, l.P99, l.P999 = Percentile(lat, 0.5), Percentile(lat, 0.99), Percentile(lat, 0.999)
	if len(lat) > 0 {
		l.Max = lat[len(lat)-1]
	}
	l.AckP50, l.AckP99, l.AckP999 = Percentile(ack, 0.5), Percentile(ack, 0.99), Percentile(ack, 0.999)
	l.Achieved = Median(ach)
	l.MedianRunP99 = time.Duration(Median(p99))
	return l
}

// Target is one of the performance goals the results are checked against.
type Target struct {
	Name     string
	Measured string
	Met      bool
	Known    bool // false when the run did not measure it
}

// The goals (docs/benchmarks.md, "Goals"): ratios against what the same
// run measures, since absolute figures depend on the machine.
const (
	// goalFetchCPURatio bounds the daemon's CPU per event (uniform) as a
	// multiple of the fetch-only client's: the least any consumer
	// fetching with the daemon's settings spends.
	goalFetchCPURatio     = 1.5
	goalCompetentRatio    = 8.0
	goalCompetentCPUShare = 0.1
	goalLatencyRate       = 50_000
	// goalOwnP99 bounds the p99 of the daemon's own latency, from a
	// record's fetch to its batch applied (its histogram, pooled).
	goalOwnP99 = 25 * time.Millisecond
	// goalEndToEndRatio bounds the pooled end-to-end p99 as a multiple of
	// the fetch-only reader's pooled p99 in the same run.
	goalEndToEndRatio = 1.2
	// goalFencedShare is the least share of the unfenced counter
	// workload's events/s the fenced one reaches.
	goalFencedShare = 0.8
	goalPeakRSS     = 150.0 // MB
	// goalObserverShare is the least share of the daemon's events/s kept
	// with the consistency observer on (at 1% sampling).
	goalObserverShare = 0.95
)

// Targets checks the summary against cachewarden's performance goals.
func (s Summary) Targets() []Target {
	var out []Target
	cw, okCW := s.Row(Uniform, ConsumerCachewarden)
	comp, okComp := s.Row(Uniform, ConsumerCompetent)
	t := Target{Name: fmt.Sprintf("uniform: daemon CPU/event <= %gx the fetch-only client's", goalFetchCPURatio), Known: okCW && s.CeilingClientCPU > 0}
	if t.Known {
		ratio := cw.CPUPerEvent / s.CeilingClientCPU
		t.Measured, t.Met = fmt.Sprintf("%.2fx (%.2f vs %.2f µs)", ratio, cw.CPUPerEvent, s.CeilingClientCPU), ratio <= goalFetchCPURatio
	}
	out = append(out, t)
	t = Target{Name: fmt.Sprintf("uniform >= %gx the competent baseline's events/s", goalCompetentRatio), Known: okCW && okComp}
	if t.Known {
		ratio := cw.EventsPerSec / comp.EventsPerSec
		t.Measured, t.Met = fmt.Sprintf("%.1fx", ratio), ratio >= goalCompetentRatio
	}
	out = append(out, t)
	t = Target{Name: "uniform CPU/event <= 1/10 of the competent baseline's", Known: okCW && okComp}
	if t.Known {
		share := cw.CPUPerEvent / comp.CPUPerEvent
		t.Measured, t.Met = fmt.Sprintf("1/%.1f (%.2f vs %.2f µs)", 1/share, cw.CPUPerEvent, comp.CPUPerEvent), share <= goalCompetentCPUShare
	}
	out = append(out, t)
	for _, wl := range []Distribution{Uniform, Zipf} {
		ob, okOb := s.Row(wl, ConsumerObserved)
		cwl, okCWL := s.Row(wl, ConsumerCachewarden)
		if okOb && okCWL {
			share := ob.EventsPerSec / cwl.EventsPerSec
			out = append(out, Target{Name: fmt.Sprintf("%s: events/s with the observer on >= %.0f%% of without", wl, goalObserverShare*100), Known: true,
				Measured: fmt.Sprintf("%.1f%% (%s vs %s events/s)", share*100, thousands(ob.EventsPerSec), thousands(cwl.EventsPerSec)), Met: share >= goalObserverShare})
		}
	}
	fenced, okF := s.Row(Counter, ConsumerFenced)
	unfenced, okU := s.Row(Counter, ConsumerUnfenced)
	t = Target{Name: fmt.Sprintf("counter workload: fenced >= %gx the unfenced events/s", goalFencedShare), Known: okF && okU}
	if t.Known {
		share := fenced.EventsPerSec / unfenced.EventsPerSec
		t.Measured, t.Met = fmt.Sprintf("%.2fx (%s vs %s events/s)", share, thousands(fenced.EventsPerSec), thousands(unfenced.EventsPerSec)), share >= goalFencedShare
	}
	out = append(out, t)
	l := s.Latency
	atRate := l != nil && l.Rate == goalLatencyRate
	t = Target{Name: fmt.Sprintf("daemon's own p99, fetch to applied, <= %s at %s events/s, pooled", ms(goalOwnP99), thousands(goalLatencyRate)),
		Known: atRate && len(l.FetchToApply.Counts) > 0}
	if t.Known {
		p99 := l.FetchToApply.Quantile(0.99)
		t.Measured = fmt.Sprintf("at most %s (p99.9 at most %s)", histBound(p99), histBound(l.FetchToApply.Quantile(0.999)))
		t.Met = seconds(p99) <= goalOwnP99
	}
	out = append(out, t)
	bare := s.LatencyFetchOnly
	t = Target{Name: fmt.Sprintf("end-to-end p99 <= %gx the fetch-only reader's at %s events/s, pooled", goalEndToEndRatio, thousands(goalLatencyRate)),
		Known: atRate && bare != nil && bare.P99 > 0}
	if t.Known {
		ratio := float64(l.P99) / float64(bare.P99)
		t.Measured = fmt.Sprintf("%.2fx (%s vs %s)", ratio, ms(l.P99), ms(bare.P99))
		t.Met = ratio <= goalEndToEndRatio && l.Missing == 0
	}
	out = append(out, t)
	peak, any := 0.0, false
	for _, r := range s.Rows {
		if isDaemon(r.Consumer) {
			peak, any = max(peak, r.MaxPeakRSS), true
		}
	}
	t = Target{Name: fmt.Sprintf("peak RSS <= %.0f MB", goalPeakRSS), Known: any}
	if any {
		t.Measured, t.Met = fmt.Sprintf("%.1f MB (largest of all daemon runs)", peak), peak <= goalPeakRSS
	}
	out = append(out, t)
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// thousands formats x rounded to an integer with comma separators.
func thousands(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// PrintConsumerRun prints one consumer run as it finishes.
func PrintConsumerRun(w io.Writer, r ConsumerResult) {
	fmt.Fprintf(w, "run %d %-8s %-24s %9s events in %8v: %9s events/s (%s after the first commit), %6.2f CPU µs/event, %5.3f memcached cmds/event, %s memcached requests/event, peak RSS %6.1f MB, first commit after %v; CPU µs/event of broker %.2f, memcached %.2f; cores used: consumer %.2f, broker %.2f, memcached %.2f",
		r.Run, r.Workload, r.Consumer, thousands(float64(r.Events)), r.Elapsed.Round(time.Millisecond),
		thousands(r.EventsPerSec()), rateText(r.SteadyEventsPerSec()), r.CPUPerEvent(), r.CommandsPerEvent(),
		writesText(r.WritesPerEvent(), r.MCWritesKnown, r.MCWritesPartial), mb(r.PeakRSS), r.FirstCommit.Round(time.Millisecond),
		r.BrokerCPUPerEvent(), r.MemcachedCPUPerEvent(),
		r.CPU.Seconds()/r.Elapsed.Seconds(), r.BrokerCPU.Seconds()/r.Elapsed.Seconds(), r.MemcachedCPU.Seconds()/r.Elapsed.Seconds())
	if d := r.Daemon; d != nil {
		fmt.Fprintf(w, "; daemon: %.0f events planned, %.0f poison, %.0f ops applied, %.0f coalesced away",
			d.Events["planned"], d.Events["poison"], d.Ops, d.CoalesceSaved)
		if d.RoundTrips >= 0 {
			fmt.Fprintf(w, ", %.4f memcached round trips/event by its own count", d.RoundTrips/float64(r.Events))
		}
		if r.Workload == Counter {
			fmt.Fprintf(w, ", %.0f recounts (%.0f fenced, %s/s), %.0f deltas skipped by fences",
				d.Recounts(), d.RecountsFenced, thousands(d.Recounts()/r.Elapsed.Seconds()), d.FencedSkips)
		}
	}
	fmt.Fprintln(w)
	if r.LogProblems > 0 {
		fmt.Fprintf(w, "  the consumer logged %d warnings or errors; the first: %s\n", r.LogProblems, r.FirstLogProblem)
	}
}

// PrintLatencyRun prints one latency run.
func PrintLatencyRun(w io.Writer, l LatencyResult) {
	if l.Bare {
		fmt.Fprintf(w, "run %d fetch-only latency (the harness reading, no daemon) at %s events/s offered (%s achieved): p50 %s, p99 %s, p99.9 %s, max %s over %d samples, %d never fetched; "+
			"from broker ack p50 %s, p99 %s; p50 of first/last fifth %s/%s; CPU cores used: %s\n",
			l.Run, thousands(l.Rate), thousands(l.Achieved), ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max), l.Samples, l.Missing,
			ms(l.AckP50), ms(l.AckP99), ms(l.FirstP50), ms(l.LastP50), coresUsed(l))
		return
	}
	fmt.Fprintf(w, "run %d latency at %s events/s offered (%s achieved): p50 %s, p99 %s, p99.9 %s, max %s over %d samples, %d never applied; "+
		"from broker ack p50 %s, p99 %s; p50 of first/last fifth %s/%s; daemon's batch p99 <= %s, commit p99 <= %s, event age p50/p99/p99.9 <= %s, fetch to applied p50/p99/p99.9 <= %s; CPU cores used: %s\n",
		l.Run, thousands(l.Rate), thousands(l.Achieved), ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max), l.Samples, l.Missing,
		ms(l.AckP50), ms(l.AckP99), ms(l.FirstP50), ms(l.LastP50), ms(l.BatchP99), ms(l.CommitP99), ageText(l.EventAge), ageText(l.FetchToApply), coresUsed(l))
}

// ageText renders the p50, p99 and p99.9 of an event-age histogram as the
// upper bounds of their buckets.
func ageText(h Histogram) string {
	if len(h.Counts) == 0 || h.Counts[len(h.Counts)-1] == 0 {
		return "n/a"
	}
	q := func(x float64) string { return histBound(h.Quantile(x)) }
	return q(0.5) + " / " + q(0.99) + " / " + q(0.999)
}

// histBound renders a histogram bucket bound (seconds).
func histBound(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return ms(seconds(s))
}

// coresUsed renders the CPU each process used during a latency run as a
// share of a core.
func coresUsed(l LatencyResult) string {
	var parts []string
	for _, name := range []string{"cachewarden", "broker", "memcached", "harness"} {
		if d, ok := l.CPU[name]; ok && l.Elapsed > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", name, d.Seconds()/l.Elapsed.Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}

// summaryRow is one row of the medians table as text cells: workload,
// consumer, events/s, CPU µs/event, memcached commands and requests per
// event, peak RSS in MB.
type summaryRow struct {
	cells []string
	// ratio marks the rows of cachewarden's figures over a baseline's;
	// main the ratio the goals are about (over the competent baseline).
	ratio, main bool
}

// summaryTable returns the medians table in the order both renderings
// show it: per workload the consumers, then cachewarden's ratios over the
// competent and the naive baseline where they ran.
func summaryTable(s Summary, workloads []Distribution) []summaryRow {
	var out []summaryRow
	for _, wl := range workloads {
		for _, c := range allConsumers {
			r, ok := s.Row(wl, c)
			if !ok {
				continue
			}
			out = append(out, summaryRow{cells: []string{string(wl), r.Consumer, thousands(r.EventsPerSec),
				fmt.Sprintf("%.2f", r.CPUPerEvent), fmt.Sprintf("%.3f", r.CommandsPerEvent),
				writesText(r.WritesPerEvent, true, r.WritesPartial), fmt.Sprintf("%.1f", r.PeakRSS)}})
		}
		cw, okC := s.Row(wl, ConsumerCachewarden)
		if ob, ok := s.Row(wl, ConsumerObserved); ok && okC {
			out = append(out, summaryRow{ratio: true, cells: []string{string(wl), "observer on / off",
				fmt.Sprintf("%.3fx", ob.EventsPerSec/cw.EventsPerSec), fmt.Sprintf("%.3fx", ob.CPUPerEvent/cw.CPUPerEvent),
				fmt.Sprintf("%.3fx", ob.CommandsPerEvent/cw.CommandsPerEvent), ratioText(ob.WritesPerEvent, cw.WritesPerEvent, "%.3fx"),
				fmt.Sprintf("%.2fx", ob.PeakRSS/cw.PeakRSS)}})
		}
		for _, base := range []string{ConsumerCompetent, ConsumerNaive} {
			b, ok := s.Row(wl, base)
			if !ok || !okC {
				continue
			}
			out = append(out, summaryRow{ratio: true, main: base == ConsumerCompetent, cells: []string{string(wl), "cachewarden / " + base,
				fmt.Sprintf("%.1fx", cw.EventsPerSec/b.EventsPerSec), fmt.Sprintf("%.3fx", cw.CPUPerEvent/b.CPUPerEvent),
				fmt.Sprintf("%.3fx", cw.CommandsPerEvent/b.CommandsPerEvent), ratioText(cw.WritesPerEvent, b.WritesPerEvent, "%.3fx"),
				fmt.Sprintf("%.2fx", cw.PeakRSS/b.PeakRSS)}})
		}
	}
	return out
}

// counterTable returns the counter workload's medians as text cells:
// consumer, events/s, CPU µs/event, recounts per run, recounts/s.
func counterTable(s Summary) [][]string {
	var out [][]string
	for _, c := range []string{ConsumerFenced, ConsumerUnfenced} {
		if r, ok := s.Row(Counter, c); ok {
			out = append(out, []string{r.Consumer, thousands(r.EventsPerSec), fmt.Sprintf("%.2f", r.CPUPerEvent),
				thousands(r.Recounts), thousands(r.RecountsPerSec)})
		}
	}
	return out
}

// PrintSummary prints the medians table and the targets.
func PrintSummary(w io.Writer, res *Results) {
	s := Summarize(res)
	fmt.Fprintf(w, "\nmedians of %d run(s), %s events per workload:\n", res.Options.Runs, thousands(float64(res.Options.Events)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tconsumer\tevents/s\tCPU µs/event\tmemcached cmds/event\tmemcached requests/event\tpeak RSS MB\t")
	for _, r := range summaryTable(s, res.Options.Workloads) {
		fmt.Fprintln(tw, strings.Join(r.cells, "\t")+"\t")
	}
	tw.Flush()
	if rows := counterTable(s); len(rows) > 0 {
		fmt.Fprintf(w, "\ncounter workload (MySQL DSN, recount query, %s of the comment counters missing at the start):\n", missShare(res.Options.CounterMissEvery))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "consumer\tevents/s\tCPU µs/event\trecounts\trecounts/s\t")
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		tw.Flush()
	}
	if s.Ceiling > 0 {
		fmt.Fprintf(w, "\nfetch-only ceiling, the daemon's Kafka client alone (no group, commits, decoding or memcached): %s events/s at %.2f client CPU µs/event\n",
			thousands(s.Ceiling), s.CeilingClientCPU)
	}
	if l := s.Latency; l != nil {
		fmt.Fprintf(w, "\ncachewarden event-to-applied latency at %s events/s offered, pooled over %d runs (%d samples, %d never applied): p50 %s, p99 %s, p99.9 %s, max %s; "+
			"per run p99 median %s, worst %s; from broker ack p50 %s, p99 %s, p99.9 %s; the daemon's event age p50/p99/p99.9 <= %s; "+
			"the daemon's own latency (fetch to applied) p50/p99/p99.9 <= %s\n",
			thousands(l.Rate), l.Runs, l.Samples, l.Missing, ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max),
			ms(l.MedianRunP99), ms(l.WorstRunP99), ms(l.AckP50), ms(l.AckP99), ms(l.AckP999), ageText(l.EventAge), ageText(l.FetchToApply))
	}
	if l := s.LatencyFetchOnly; l != nil {
		fmt.Fprintf(w, "fetch-only latency (the harness reading the same paced stream, no daemon), pooled over %d runs (%d samples, %d never fetched): p50 %s, p99 %s, p99.9 %s, max %s\n",
			l.Runs, l.Samples, l.Missing, ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max))
	}
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range s.Targets() {
		switch {
		case !t.Known:
			fmt.Fprintf(w, "  %-58s not measured\n", t.Name)
		case t.Met:
			fmt.Fprintf(w, "  %-58s met     (%s)\n", t.Name, t.Measured)
		default:
			fmt.Fprintf(w, "  %-58s MISSED  (%s)\n", t.Name, t.Measured)
		}
	}
}

// missShare renders the share of comment counters a counter workload run
// starts without, for the reports: "10%" for every 10th.
func missShare(every int) string {
	if every <= 0 {
		return "none"
	}
	return strconv.FormatFloat(100/float64(every), 'g', 3, 64) + "%"
}

// PrintRSS prints the summary of the memory-flatness run.
func PrintRSS(w io.Writer, r *RSSResult) {
	fmt.Fprintf(w, "\n%s events in %v (%s events/s); peak RSS (VmHWM) %.1f MB; RSS %s\n",
		thousands(float64(r.Events)), r.Elapsed.Round(time.Millisecond), thousands(float64(r.Events)/r.Elapsed.Seconds()),
		mb(r.PeakRSS), rssRange(r))
}

// rssRange describes RSS over the second half of the run, where a leak
// would show as growth.
func rssRange(r *RSSResult) string {
	if len(r.Samples) < 2 {
		return "(too few samples)"
	}
	half := r.Samples[len(r.Samples)/2:]
	lo, hi := half[0].RSS, half[0].RSS
	for _, s := range half {
		lo, hi = min(lo, s.RSS), max(hi, s.RSS)
	}
	return fmt.Sprintf("between %.1f and %.1f MB over the second half of the run (first %.1f MB, last %.1f MB)",
		mb(lo), mb(hi), mb(r.Samples[0].RSS), mb(r.Samples[len(r.Samples)-1].RSS))
}

// Markers delimit the sections of docs/benchmarks.md that UpdateDoc
// rewrites; the text around them is kept.
const (
	resultsBegin = "<!-- cwbench:results:begin -->"
	resultsEnd   = "<!-- cwbench:results:end -->"
	rssBegin     = "<!-- cwbench:rss:begin -->"
	rssEnd       = "<!-- cwbench:rss:end -->"
)

// UpdateDoc rewrites, in the Markdown file path, the section between the
// results markers (throughput and latency runs) or the RSS markers (a
// memory-flatness run). The file must hold the markers.
func UpdateDoc(path string, res *Results) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var out []byte
	if res.RSS != nil {
		out, err = ReplaceSection(doc, rssBegin, rssEnd, RenderRSS(res))
	} else {
		out, err = ReplaceSection(doc, resultsBegin, resultsEnd, RenderResults(res))
	}
	if err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// ReplaceSection replaces the text between the lines begin and end.
func ReplaceSection(doc []byte, begin, end, body string) ([]byte, error) {
	i := bytes.Index(doc, []byte(begin))
	j := bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return nil, fmt.Errorf("markers %s ... %s not found", begin, end)
	}
	var b bytes.Buffer
	b.Write(doc[:i+len(begin)])
	b.WriteString("\n")
	b.WriteString(body)
	b.Write(doc[j:])
	return b.Bytes(), nil
}

func renderMachine(b *strings.Builder, res *Results) {
	m := res.Machine
	fmt.Fprintf(b, "Measured %s on %d CPUs (%s), %s memory, %s, %s, %s; load average (1, 5, 15 min) %s at the start and %s at the end.\n\n",
		time.Now().UTC().Format("2006-01-02"), m.CPUs, m.CPUModel, m.MemTotal, m.Kernel, m.GoVersion, m.Memcached, m.LoadAvg, res.LoadAvgEnd)
	if res.Options.Command != "" {
		fmt.Fprintf(b, "Command: %s\n\n", res.Options.Command)
	}
}

// RenderResults renders the throughput and latency results as Markdown.
func RenderResults(res *Results) string {
	var b strings.Builder
	o := res.Options
	s := Summarize(res)
	renderMachine(&b, res)
	fmt.Fprintf(&b, "%s events per workload, %d partitions, %s users and posts, Zipf s = %.2g; medians of %d runs.\n\n",
		thousands(float64(o.Events)), o.Partitions, thousands(float64(o.Keys)), o.ZipfS, o.Runs)
	b.WriteString("| workload | consumer | events/s | CPU µs/event | memcached cmds/event | memcached requests/event | peak RSS (MB) |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|\n")
	for _, r := range summaryTable(s, o.Workloads) {
		if r.main {
			r.cells[1], r.cells[2], r.cells[3] = "**"+r.cells[1]+"**", "**"+r.cells[2]+"**", "**"+r.cells[3]+"**"
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r.cells, " | "))
	}
	if rows := counterTable(s); len(rows) > 0 {
		fmt.Fprintf(&b, "\nCounter workload (%s, a MySQL DSN and the comment counter's recount query; %s of the comment counters missing at the start):\n\n",
			res.CounterServer, missShare(o.CounterMissEvery))
		b.WriteString("| consumer | events/s | CPU µs/event | recounts per run | recounts/s |\n|---|--:|--:|--:|--:|\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
		}
	}
	if s.Ceiling > 0 {
		fmt.Fprintf(&b, "\nFor reference, the daemon's Kafka client alone (franz-go with the daemon's fetch settings) reading the %s topic, with no group, "+
			"no commits, no decoding and no memcached, reached %s events/s at %.2f CPU µs/event of its own: the ceiling of broker and client on this machine, "+
			"and the least CPU per event a consumer fetching this way spends.\n",
			o.Workloads[0], thousands(s.Ceiling), s.CeilingClientCPU)
	}
	if l := s.Latency; l != nil {
		fmt.Fprintf(&b, "\nEvent-to-applied latency of cachewarden at %s events/s offered (%s achieved by the paced producer), "+
			"pooled over every sample of %d runs (%d samples, %d never applied): **p50 %s, p99 %s, p99.9 %s**, max %s "+
			"(p99 of the runs: median %s, worst %s). Counted from the broker's acknowledgement of the event instead: p50 %s, p99 %s, p99.9 %s. "+
			"The daemon's own event-age histogram (now minus the source time, which the producer sets when it sends the event) over the same runs: "+
			"p50 / p99 / p99.9 at most %s. The daemon's own latency, from each record's fetch to its batch applied "+
			"(its cachewarden_fetch_to_apply_seconds histogram, every record of the runs, warm-up included): p50 / p99 / p99.9 at most %s.\n",
			thousands(l.Rate), thousands(l.Achieved), l.Runs, l.Samples, l.Missing, ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max),
			ms(l.MedianRunP99), ms(l.WorstRunP99), ms(l.AckP50), ms(l.AckP99), ms(l.AckP999), ageText(l.EventAge), ageText(l.FetchToApply))
	}
	if l := s.LatencyFetchOnly; l != nil {
		fmt.Fprintf(&b, "\nFor reference, the same paced stream read by the harness itself with the daemon's Kafka client settings (no group, decoding or memcached; "+
			"a sample counts when its record is fetched), pooled over %d runs (%d samples, %d never fetched): p50 %s, p99 %s, p99.9 %s, max %s: "+
			"the fetch-only latency, what broker, producer and machine leave for any consumer at this rate.\n",
			l.Runs, l.Samples, l.Missing, ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max))
	}
	b.WriteString("\n| target | measured | |\n|---|---|---|\n")
	for _, t := range s.Targets() {
		verdict := "not measured"
		if t.Known && t.Met {
			verdict = "met"
		} else if t.Known {
			verdict = "**missed**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Name, t.Measured, verdict)
	}
	b.WriteString("\n<details><summary>Every run</summary>\n\n")
	b.WriteString("| run | workload | consumer | events/s | events/s after first commit | CPU µs/event | memcached cmds/event | memcached requests/event | peak RSS (MB) | first commit (s) | broker CPU µs/event | memcached CPU µs/event | round trips/event by the daemon's count | recounts (fenced) |\n")
	b.WriteString("|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range res.Consumers {
		own, recounts := "n/a", "n/a"
		if d := r.Daemon; d != nil && d.RoundTrips >= 0 {
			own = fmt.Sprintf("%.4f", d.RoundTrips/float64(r.Events))
		}
		if d := r.Daemon; d != nil && r.Workload == Counter {
			recounts = fmt.Sprintf("%s (%s)", thousands(d.Recounts()), thousands(d.RecountsFenced))
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %.2f | %.3f | %s | %.1f | %.2f | %.2f | %.2f | %s | %s |\n", r.Run, r.Workload, r.Consumer,
			thousands(r.EventsPerSec()), rateText(r.SteadyEventsPerSec()), r.CPUPerEvent(), r.CommandsPerEvent(),
			writesText(r.WritesPerEvent(), r.MCWritesKnown, r.MCWritesPartial), mb(r.PeakRSS), r.FirstCommit.Seconds(),
			r.BrokerCPUPerEvent(), r.MemcachedCPUPerEvent(), own, recounts)
	}
	if len(res.Ceiling) > 0 {
		b.WriteString("\n| run | fetch-only events/s | client CPU µs/event | client page faults/event | broker CPU µs/event |\n|--:|--:|--:|--:|--:|\n")
		for _, c := range res.Ceiling {
			fmt.Fprintf(&b, "| %d | %s | %.2f | %.3f | %.2f |\n", c.Run, thousands(c.EventsPerSec()), c.ClientCPUPerEvent(),
				float64(c.ClientFaults)/float64(c.Events), float64(c.BrokerCPU.Microseconds())/float64(c.Events))
		}
	}
	if len(res.Latency) > 0 {
		b.WriteString("\n| run | offered events/s | achieved events/s | p50 | p99 | p99.9 | max | p50 / p99 from broker ack | p50 first / last fifth | samples | never applied | daemon's batch / commit p99 (at most) | daemon's event age p50 / p99 / p99.9 (at most) | daemon's fetch to applied p50 / p99 / p99.9 (at most) | CPU cores used |\n")
		b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
		for _, l := range slices.Concat(res.Latency, res.LatencyFetchOnly) {
			run, batch, commit := strconv.Itoa(l.Run), ms(l.BatchP99), ms(l.CommitP99)
			if l.Bare {
				run, batch, commit = run+" (fetch-only)", "n/a", "n/a"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %d | %d | %s / %s | %s | %s | %s |\n", run, thousands(l.Rate), thousands(l.Achieved),
				ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max), ms(l.AckP50), ms(l.AckP99), ms(l.FirstP50), ms(l.LastP50), l.Samples, l.Missing,
				batch, commit, ageText(l.EventAge), ageText(l.FetchToApply), coresUsed(l))
		}
	}
	b.WriteString("\n</details>\n")
	return b.String()
}

// RenderRSS renders the memory-flatness run as Markdown.
func RenderRSS(res *Results) string {
	var b strings.Builder
	r := res.RSS
	renderMachine(&b, res)
	fmt.Fprintf(&b, "%s uniform events, %d partitions: consumed in %v (%s events/s); peak RSS (VmHWM) **%.1f MB**; RSS %s.\n\n",
		thousands(float64(r.Events)), res.Options.Partitions, r.Elapsed.Round(time.Millisecond),
		thousands(float64(r.Events)/r.Elapsed.Seconds()), mb(r.PeakRSS), rssRange(r))
	b.WriteString("| t (s) | events committed | RSS (MB) |\n|--:|--:|--:|\n")
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "| %.1f | %s | %.1f |\n", s.At.Seconds(), thousands(float64(s.Committed)), mb(s.RSS))
	}
	return b.String()
}

// writesText renders memcached requests per event: "n/a" when not
// counted, ">=x" for a lower bound.
func writesText(v float64, known, partial bool) string {
	switch {
	case !known || math.IsNaN(v):
		return "n/a"
	case partial:
		return fmt.Sprintf(">=%.3f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// rateText renders an events/s figure, "n/a" for NaN.
func rateText(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return thousands(v)
}

// ratioText renders a / b, or "n/a" when either is unknown.
func ratioText(a, b float64, format string) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, a/b)
}
