package config

import (
	"time"
)

// Observer is the `observer` section: the consistency observer
// (docs/operations.md, "The consistency observer"). Off by default.
// Settings left out (zero) take the observer package's defaults, given
// here for reference.
type Observer struct {
	// Enabled turns the observer on in `cachewarden run`; `cachewarden
	// observe` runs it whatever this says.
	Enabled bool `yaml:"enabled"`
	// Sample is the share of applied changes checked, in (0, 1]; 0 (left
	// out) means the observer's default, 1%.
	Sample float64 `yaml:"sample,omitempty"`
	// MaxPerSecond bounds the changes sampled per rule and second;
	// default 10.
	MaxPerSecond float64 `yaml:"max_per_second,omitempty"`
	// Windows are the delays after a change at which it is checked;
	// default [1s, 10s, 1m].
	Windows []time.Duration `yaml:"windows,omitempty"`
	// ConfirmAfter is how long after a mismatch with MySQL both sides are
	// read again (for a counter judged at a binary log position: how long
	// it waits for the daemon to reach the recount's position); default
	// 5s.
	ConfirmAfter time.Duration `yaml:"confirm_after,omitempty"`
	// MySQLQueriesPerSecond and MemcachedReadsPerSecond are the
	// observer's budgets; defaults 50 and 500.
	MySQLQueriesPerSecond   float64 `yaml:"mysql_queries_per_second,omitempty"`
	MemcachedReadsPerSecond float64 `yaml:"memcached_reads_per_second,omitempty"`
	// MaxPending bounds the sampled changes waiting for their checks;
	// default 10,000.
	MaxPending int `yaml:"max_pending,omitempty"`
	// ClockSkew is how far the clocks of the processes that create
	// namespaces may disagree; default 1s.
	ClockSkew time.Duration `yaml:"clock_skew,omitempty"`
	// ReportEvery is how often the nines are logged; default 1m.
	ReportEvery time.Duration `yaml:"report_every,omitempty"`
	// Group is the consumer group of `cachewarden observe`; "" means
	// kafka.group followed by "-observer" (Config.ObserverGroup). `run`
	// does not use it.
	Group string `yaml:"group,omitempty"`
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

func (d *decoder) validateObserver(o *Observer, k *Kafka) {
	const p = "observer."
	if d.Set(p+"sample") && d.Readable(p+"sample") && (o.Sample <= 0 || o.Sample > 1) {
		d.wrong(p+"sample", "%g is outside (0, 1]: the share of applied changes checked", o.Sample)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"max_per_second", o.MaxPerSecond}, {"mysql_queries_per_second", o.MySQLQueriesPerSecond}, {"memcached_reads_per_second", o.MemcachedReadsPerSecond}} {
		if d.Set(p+f.name) && d.Readable(p+f.name) && f.v <= 0 {
			d.wrong(p+f.name, "%g must be positive", f.v)
		}
	}
	if d.Set(p+"max_pending") && d.Readable(p+"max_pending") && o.MaxPending < 1 {
		d.wrong(p+"max_pending", "%d must be at least 1", o.MaxPending)
	}
	if d.Set(p+"windows") && d.Readable(p+"windows") {
		switch {
		case len(o.Windows) == 0:
			d.wrong(p+"windows", "list at least one window")
		case len(o.Windows) > MaxObserverWindows:
			d.wrong(p+"windows", "%d windows, at most %d", len(o.Windows), MaxObserverWindows)
		}
		seen := map[time.Duration]bool{}
		for _, w := range o.Windows {
			if w <= 0 || w > MaxObserverWindow {
				d.wrong(p+"windows", "%s is outside (0, %s]", w, MaxObserverWindow)
			} else if seen[w] {
				d.wrong(p+"windows", "%s is listed twice", w)
			}
			seen[w] = true
		}
	}
	for _, name := range []string{"confirm_after", "clock_skew", "report_every"} {
		path := p + name
		v := map[string]time.Duration{"confirm_after": o.ConfirmAfter, "clock_skew": o.ClockSkew, "report_every": o.ReportEvery}[name]
		if d.Set(path) && d.Readable(path) && (v <= 0 || v > MaxObserverWindow) {
			d.wrong(path, "%s is outside (0, %s]", v, MaxObserverWindow)
		}
	}
	if o.Group != "" && o.Group == k.Group {
		d.wrong(p+"group", "%q is kafka.group: `cachewarden observe` needs a consumer group of its own, or it would take partitions from the daemons", o.Group)
	}
}
