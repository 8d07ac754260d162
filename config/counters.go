package config

import (
	"time"

	"github.com/cachewarden/cachewarden/counters"
)

// Counters is the `counters` section: how counter recounts are fenced
// (docs/exact-counters.md).
type Counters struct {
	// Fencing is "auto" (default: fence when the database can name a
	// snapshot's position, else recount unfenced with a warning), "off"
	// (never fence) or "required" (refuse to start when the database
	// cannot fence).
	Fencing counters.FencingMode `yaml:"fencing"`
	// FenceTTL is how long a recount's fence is kept in memcached; it must
	// exceed the longest consumer lag expected. Default 1h, at most 30
	// days.
	FenceTTL time.Duration `yaml:"fence_ttl"`
}

// Default and limit of the counters section (the fence TTL's default is
// counters.DefaultFenceTTL).
const (
	DefaultCountersFencing = counters.FencingAuto
	MaxCountersFenceTTL    = 30 * 24 * time.Hour
)

func (d *decoder) validateCounters(c *Counters) {
	oneOf(d, "counters.fencing", &c.Fencing, DefaultCountersFencing, FencingModes)
	d.positiveDuration(&c.FenceTTL, "counters.fence_ttl", counters.DefaultFenceTTL, MaxCountersFenceTTL)
}
