package config

import (
	"time"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"go.yaml.in/yaml/v3"
)

// Observer is the `observer` section: the consistency observer
// (docs/operations.md, "The consistency observer"). Off by default.
// Settings left out (zero) take the observer package's defaults, given
// here for reference.
type Observer struct {
	// Enabled turns the observer on in `cachewarden run`; `cachewarden
	// observe` runs it whatever this says.
	Enabled bool
	// Sample is the share of applied changes checked, in (0, 1]; 0 (left
	// out) means the observer's default, 1%.
	Sample float64
	// MaxPerSecond bounds the changes sampled per rule and second;
	// default 10.
	MaxPerSecond float64
	// Windows are the delays after a change at which it is checked;
	// default [1s, 10s, 1m].
	Windows []time.Duration
	// ConfirmAfter is how long after a mismatch with MySQL both sides are
	// read again (for a counter judged at a binary log position: how long
	// it waits for the daemon to reach the recount's position); default
	// 5s.
	ConfirmAfter time.Duration
	// MySQLQueriesPerSecond and MemcachedReadsPerSecond are the
	// observer's budgets; defaults 50 and 500.
	MySQLQueriesPerSecond, MemcachedReadsPerSecond float64
	// MaxPending bounds the sampled changes waiting for their checks;
	// default 10,000.
	MaxPending int
	// ClockSkew is how far the clocks of the processes that create
	// namespaces may disagree; default 1s.
	ClockSkew time.Duration
	// ReportEvery is how often the nines are logged; default 1m.
	ReportEvery time.Duration
	// Group is the consumer group of `cachewarden observe`; "" means
	// kafka.group followed by "-observer" (Config.ObserverGroup). `run`
	// does not use it.
	Group string
}

// ObserverGroup returns the consumer group of `cachewarden observe`.
func (c *Config) ObserverGroup() string {
	if c.Observer.Group != "" {
		return c.Observer.Group
	}
	return c.Kafka.Group + "-observer"
}

// Limits of the observer section.
const (
	MaxObserverWindow  = 24 * time.Hour
	MaxObserverWindows = 10
)

func (d *decoder) observer(n *yaml.Node, o *Observer) {
	const p = "observer."
	d.mapping(n, "observer", map[string]func(*yaml.Node){
		"enabled":                    func(v *yaml.Node) { o.Enabled = d.boolean(v, p+"enabled") },
		"sample":                     func(v *yaml.Node) { o.Sample = d.float(v, p+"sample") },
		"max_per_second":             func(v *yaml.Node) { o.MaxPerSecond = d.float(v, p+"max_per_second") },
		"windows":                    func(v *yaml.Node) { o.Windows = d.durations(v, p+"windows") },
		"confirm_after":              func(v *yaml.Node) { o.ConfirmAfter = d.duration(v, p+"confirm_after") },
		"mysql_queries_per_second":   func(v *yaml.Node) { o.MySQLQueriesPerSecond = d.float(v, p+"mysql_queries_per_second") },
		"memcached_reads_per_second": func(v *yaml.Node) { o.MemcachedReadsPerSecond = d.float(v, p+"memcached_reads_per_second") },
		"max_pending":                func(v *yaml.Node) { o.MaxPending = d.integer(v, p+"max_pending") },
		"clock_skew":                 func(v *yaml.Node) { o.ClockSkew = d.duration(v, p+"clock_skew") },
		"report_every":               func(v *yaml.Node) { o.ReportEvery = d.duration(v, p+"report_every") },
		"group":                      func(v *yaml.Node) { o.Group = d.str(v, p+"group") },
	})
}

// durations decodes a list of durations at path.
func (d *decoder) durations(n *yaml.Node, path string) []time.Duration {
	var out []time.Duration
	if n = yamlfile.Resolve(n); n.Kind != yaml.SequenceNode {
		d.unreadable(n, path, "%s", yamlfile.WrongKind(path, "a list of durations such as [1s, 10s, 1m]", n))
		return nil
	}
	for _, item := range n.Content {
		out = append(out, d.duration(item, path))
	}
	return out
}

func (d *decoder) validateObserver(o *Observer, k *Kafka) {
	const p = "observer."
	if d.set(p+"sample") && d.readable(p+"sample") && (o.Sample <= 0 || o.Sample > 1) {
		d.problem(d.place(p+"sample"), "observer.sample: %g is outside (0, 1]: the share of applied changes checked", o.Sample)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"max_per_second", o.MaxPerSecond}, {"mysql_queries_per_second", o.MySQLQueriesPerSecond}, {"memcached_reads_per_second", o.MemcachedReadsPerSecond}} {
		if d.set(p+f.name) && d.readable(p+f.name) && f.v <= 0 {
			d.problem(d.place(p+f.name), "observer.%s: %g must be positive", f.name, f.v)
		}
	}
	if d.set(p+"max_pending") && d.readable(p+"max_pending") && o.MaxPending < 1 {
		d.problem(d.place(p+"max_pending"), "observer.max_pending: %d must be at least 1", o.MaxPending)
	}
	if d.set(p+"windows") && d.readable(p+"windows") {
		switch {
		case len(o.Windows) == 0:
			d.problem(d.place(p+"windows"), "observer.windows: list at least one window")
		case len(o.Windows) > MaxObserverWindows:
			d.problem(d.place(p+"windows"), "observer.windows: %d windows, at most %d", len(o.Windows), MaxObserverWindows)
		}
		seen := map[time.Duration]bool{}
		for _, w := range o.Windows {
			if w <= 0 || w > MaxObserverWindow {
				d.problem(d.place(p+"windows"), "observer.windows: %s is outside (0, %s]", w, MaxObserverWindow)
			} else if seen[w] {
				d.problem(d.place(p+"windows"), "observer.windows: %s is listed twice", w)
			}
			seen[w] = true
		}
	}
	for _, name := range []string{"confirm_after", "clock_skew", "report_every"} {
		path := p + name
		v := map[string]time.Duration{"confirm_after": o.ConfirmAfter, "clock_skew": o.ClockSkew, "report_every": o.ReportEvery}[name]
		if d.set(path) && d.readable(path) && (v <= 0 || v > MaxObserverWindow) {
			d.problem(d.place(path), "%s: %s is outside (0, %s]", path, v, MaxObserverWindow)
		}
	}
	if o.Group != "" && o.Group == k.Group {
		d.problem(d.place(p+"group"), "observer.group: %q is kafka.group: `cachewarden observe` needs a consumer group of its own, or it would take partitions from the daemons", o.Group)
	}
}
