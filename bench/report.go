package bench

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
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
}

// LatencySummary holds the medians of the latency runs.
type LatencySummary struct {
	Rate, Achieved float64
	P50, P99, Max  time.Duration
	AckP50, AckP99 time.Duration
	Samples        int // over all runs
	Missing        int // over all runs
	Runs           int
}

// Summary is the median view of Results.
type Summary struct {
	Rows    []SummaryRow
	Latency *LatencySummary
	// Ceiling is the median events/s of the fetch-only reads (0 when not
	// measured).
	Ceiling float64
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

// Summarize takes the medians over runs.
func Summarize(res *Results) Summary {
	var s Summary
	for _, wl := range res.Options.Workloads {
		for _, c := range []string{ConsumerBaseline, ConsumerCachewarden} {
			var eps, cpu, cmds, writes, rss, startup []float64
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
			}
			if len(eps) == 0 {
				continue
			}
			w := math.NaN()
			if writesKnown {
				w = Median(writes)
			}
			s.Rows = append(s.Rows, SummaryRow{
				Workload: wl, Consumer: c, Runs: len(eps),
				EventsPerSec: Median(eps), CPUPerEvent: Median(cpu), CommandsPerEvent: Median(cmds),
				WritesPerEvent: w, WritesPartial: writesPartial,
				PeakRSS: Median(rss), MaxPeakRSS: slices.Max(rss), StartupSec: Median(startup),
			})
		}
	}
	var ceil []float64
	for _, c := range res.Ceiling {
		ceil = append(ceil, c.EventsPerSec())
	}
	s.Ceiling = Median(ceil)
	if len(res.Latency) > 0 {
		var p50, p99, mx, ach, ack50, ack99 []float64
		l := &LatencySummary{Rate: res.Latency[0].Rate, Runs: len(res.Latency)}
		for _, r := range res.Latency {
			p50 = append(p50, float64(r.P50))
			p99 = append(p99, float64(r.P99))
			mx = append(mx, float64(r.Max))
			ack50 = append(ack50, float64(r.AckP50))
			ack99 = append(ack99, float64(r.AckP99))
			ach = append(ach, r.Achieved)
			l.Samples += r.Samples
			l.Missing += r.Missing
		}
		l.P50, l.P99, l.Max = time.Duration(Median(p50)), time.Duration(Median(p99)), time.Duration(Median(mx))
		l.Achieved = Median(ach)
		l.AckP50, l.AckP99 = time.Duration(Median(ack50)), time.Duration(Median(ack99))
		s.Latency = l
	}
	return s
}

// Target is one of the performance goals the results are checked against.
type Target struct {
	Name     string
	Measured string
	Met      bool
	Known    bool // false when the run did not measure it
}

// Targets checks the summary against cachewarden's performance goals:
// uniform >= 400k events/s and >= 40x the baseline, Zipf >= 500k
// events/s, p99 event-to-applied latency <= 50ms at 50k events/s, and
// peak RSS <= 150 MB in every run.
func (s Summary) Targets() []Target {
	var out []Target
	cw, okCW := s.Row(Uniform, ConsumerCachewarden)
	base, okBase := s.Row(Uniform, ConsumerBaseline)
	t := Target{Name: "uniform >= 400,000 events/s", Known: okCW}
	if okCW {
		t.Measured, t.Met = fmt.Sprintf("%s events/s", thousands(cw.EventsPerSec)), cw.EventsPerSec >= 400_000
	}
	out = append(out, t)
	t = Target{Name: "uniform >= 40x baseline", Known: okCW && okBase}
	if t.Known {
		ratio := cw.EventsPerSec / base.EventsPerSec
		t.Measured, t.Met = fmt.Sprintf("%.1fx", ratio), ratio >= 40
	}
	out = append(out, t)
	z, okZ := s.Row(Zipf, ConsumerCachewarden)
	t = Target{Name: "zipf >= 500,000 events/s", Known: okZ}
	if okZ {
		t.Measured, t.Met = fmt.Sprintf("%s events/s", thousands(z.EventsPerSec)), z.EventsPerSec >= 500_000
	}
	out = append(out, t)
	t = Target{Name: "p99 event-to-applied <= 50 ms at 50,000 events/s", Known: s.Latency != nil && s.Latency.Rate == 50_000}
	if s.Latency != nil {
		t.Measured = fmt.Sprintf("%s at %s events/s offered", ms(s.Latency.P99), thousands(s.Latency.Rate))
		t.Met = t.Known && s.Latency.P99 <= 50*time.Millisecond && s.Latency.Missing == 0
	}
	out = append(out, t)
	peak, any := 0.0, false
	for _, r := range s.Rows {
		if r.Consumer == ConsumerCachewarden {
			peak, any = max(peak, r.MaxPeakRSS), true
		}
	}
	t = Target{Name: "peak RSS <= 150 MB", Known: any}
	if any {
		t.Measured, t.Met = fmt.Sprintf("%.1f MB (largest of all runs)", peak), peak <= 150
	}
	out = append(out, t)
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// thousands formats x rounded to an integer with comma separators.
func thousands(x float64) string {
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
	fmt.Fprintf(w, "run %d %-8s %-12s %9s events in %8v: %9s events/s (%s after the first commit), %6.2f CPU µs/event, %5.3f memcached cmds/event, %s memcached requests/event, peak RSS %6.1f MB, first commit after %v; CPU µs/event of broker %.2f, memcached %.2f; cores used: consumer %.2f, broker %.2f, memcached %.2f",
		r.Run, r.Workload, r.Consumer, thousands(float64(r.Events)), r.Elapsed.Round(time.Millisecond),
		thousands(r.EventsPerSec()), rateText(r.SteadyEventsPerSec()), r.CPUPerEvent(), r.CommandsPerEvent(),
		writesText(r.WritesPerEvent(), r.MCWritesKnown, r.MCWritesPartial), mb(r.PeakRSS), r.FirstCommit.Round(time.Millisecond),
		r.BrokerCPUPerEvent(), r.MemcachedCPUPerEvent(),
		r.CPU.Seconds()/r.Elapsed.Seconds(), r.BrokerCPU.Seconds()/r.Elapsed.Seconds(), r.MemcachedCPU.Seconds()/r.Elapsed.Seconds())
	if d := r.Daemon; d != nil {
		fmt.Fprintf(w, "; daemon: %.0f events planned, %.0f poison, %.0f ops applied, %.0f coalesced away",
			d.Events["planned"], d.Events["poison"], d.Ops, d.CoalesceSaved)
	}
	if d := r.Daemon; d != nil && d.RoundTrips >= 0 {
		fmt.Fprintf(w, ", %.4f memcached round trips/event by its own count", d.RoundTrips/float64(r.Events))
	}
	fmt.Fprintln(w)
	if r.LogProblems > 0 {
		fmt.Fprintf(w, "  the consumer logged %d warnings or errors; the first: %s\n", r.LogProblems, r.FirstLogProblem)
	}
}

// PrintLatencyRun prints one latency run.
func PrintLatencyRun(w io.Writer, l LatencyResult) {
	fmt.Fprintf(w, "run %d latency at %s events/s offered (%s achieved): p50 %s, p99 %s, max %s over %d samples, %d never applied; "+
		"from broker ack p50 %s, p99 %s; p50 of first/last fifth %s/%s; daemon's batch p99 <= %s, commit p99 <= %s; CPU cores used: %s\n",
		l.Run, thousands(l.Rate), thousands(l.Achieved), ms(l.P50), ms(l.P99), ms(l.Max), l.Samples, l.Missing,
		ms(l.AckP50), ms(l.AckP99), ms(l.FirstP50), ms(l.LastP50), ms(l.BatchP99), ms(l.CommitP99), coresUsed(l))
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
	// ratio marks the row of cachewarden's figures over the baseline's.
	ratio bool
}

// summaryTable returns the medians table in the order both renderings
// show it: per workload the baseline, cachewarden and, when both ran,
// their ratio.
func summaryTable(s Summary, workloads []Distribution) []summaryRow {
	var out []summaryRow
	for _, wl := range workloads {
		base, okB := s.Row(wl, ConsumerBaseline)
		cw, okC := s.Row(wl, ConsumerCachewarden)
		for _, r := range []struct {
			row SummaryRow
			ok  bool
		}{{base, okB}, {cw, okC}} {
			if r.ok {
				out = append(out, summaryRow{cells: []string{string(wl), r.row.Consumer, thousands(r.row.EventsPerSec),
					fmt.Sprintf("%.2f", r.row.CPUPerEvent), fmt.Sprintf("%.3f", r.row.CommandsPerEvent),
					writesText(r.row.WritesPerEvent, true, r.row.WritesPartial), fmt.Sprintf("%.1f", r.row.PeakRSS)}})
			}
		}
		if okB && okC {
			out = append(out, summaryRow{ratio: true, cells: []string{string(wl), "cachewarden / baseline",
				fmt.Sprintf("%.1fx", cw.EventsPerSec/base.EventsPerSec), fmt.Sprintf("%.3fx", cw.CPUPerEvent/base.CPUPerEvent),
				fmt.Sprintf("%.3fx", cw.CommandsPerEvent/base.CommandsPerEvent), ratioText(cw.WritesPerEvent, base.WritesPerEvent, "%.3fx"),
				fmt.Sprintf("%.2fx", cw.PeakRSS/base.PeakRSS)}})
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
	if s.Ceiling > 0 {
		fmt.Fprintf(w, "\nfetch-only kafka-go ceiling (no group, commits, decoding or memcached): %s events/s\n", thousands(s.Ceiling))
	}
	if l := s.Latency; l != nil {
		fmt.Fprintf(w, "\ncachewarden event-to-applied latency at %s events/s offered: p50 %s, p99 %s; from broker ack p50 %s, p99 %s (medians of %d runs; %d samples, %d never applied)\n",
			thousands(l.Rate), ms(l.P50), ms(l.P99), ms(l.AckP50), ms(l.AckP99), l.Runs, l.Samples, l.Missing)
	}
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range s.Targets() {
		switch {
		case !t.Known:
			fmt.Fprintf(w, "  %-50s not measured\n", t.Name)
		case t.Met:
			fmt.Fprintf(w, "  %-50s met     (%s)\n", t.Name, t.Measured)
		default:
			fmt.Fprintf(w, "  %-50s MISSED  (%s)\n", t.Name, t.Measured)
		}
	}
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
		if r.ratio {
			r.cells[1], r.cells[2] = "**"+r.cells[1]+"**", "**"+r.cells[2]+"**"
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r.cells, " | "))
	}
	if s.Ceiling > 0 {
		fmt.Fprintf(&b, "\nFor reference, kafka-go alone reading the %s topic as cachewarden's partition fetchers do (a leader connection per partition, no group, "+
			"no commits, no decoding, no memcached) reached %s events/s: the ceiling of broker and client on this machine.\n",
			o.Workloads[0], thousands(s.Ceiling))
	}
	if l := s.Latency; l != nil {
		fmt.Fprintf(&b, "\nEvent-to-applied latency of cachewarden at %s events/s offered (%s achieved by the paced producer): "+
			"**p50 %s, p99 %s** (medians of %d runs; %d samples in all, %d never applied). "+
			"Counted from the broker's acknowledgement of the event instead: p50 %s, p99 %s.\n",
			thousands(l.Rate), thousands(l.Achieved), ms(l.P50), ms(l.P99), l.Runs, l.Samples, l.Missing, ms(l.AckP50), ms(l.AckP99))
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
	b.WriteString("| run | workload | consumer | events/s | events/s after first commit | CPU µs/event | memcached cmds/event | memcached requests/event | peak RSS (MB) | first commit (s) | broker CPU µs/event | memcached CPU µs/event | round trips/event by the daemon's count |\n")
	b.WriteString("|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range res.Consumers {
		own := "n/a"
		if d := r.Daemon; d != nil && d.RoundTrips >= 0 {
			own = fmt.Sprintf("%.4f", d.RoundTrips/float64(r.Events))
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %.2f | %.3f | %s | %.1f | %.2f | %.2f | %.2f | %s |\n", r.Run, r.Workload, r.Consumer,
			thousands(r.EventsPerSec()), rateText(r.SteadyEventsPerSec()), r.CPUPerEvent(), r.CommandsPerEvent(),
			writesText(r.WritesPerEvent(), r.MCWritesKnown, r.MCWritesPartial), mb(r.PeakRSS), r.FirstCommit.Seconds(),
			r.BrokerCPUPerEvent(), r.MemcachedCPUPerEvent(), own)
	}
	if len(res.Ceiling) > 0 {
		b.WriteString("\n| run | fetch-only events/s | broker CPU µs/event |\n|--:|--:|--:|\n")
		for _, c := range res.Ceiling {
			fmt.Fprintf(&b, "| %d | %s | %.2f |\n", c.Run, thousands(c.EventsPerSec()), float64(c.BrokerCPU.Microseconds())/float64(c.Events))
		}
	}
	if len(res.Latency) > 0 {
		b.WriteString("\n| run | offered events/s | achieved events/s | p50 | p99 | max | p50 / p99 from broker ack | p50 first / last fifth | samples | never applied | daemon's batch / commit p99 (at most) | CPU cores used |\n")
		b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
		for _, l := range res.Latency {
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s / %s | %s / %s | %d | %d | %s / %s | %s |\n", l.Run, thousands(l.Rate), thousands(l.Achieved),
				ms(l.P50), ms(l.P99), ms(l.Max), ms(l.AckP50), ms(l.AckP99), ms(l.FirstP50), ms(l.LastP50), l.Samples, l.Missing,
				ms(l.BatchP99), ms(l.CommitP99), coresUsed(l))
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
