package config

import (
	"testing"
	"time"
)

func TestCountersSection(t *testing.T) {
	const base = "kafka: {brokers: [localhost:9092], group: cw, topics: [shop]}\nrules: [r.yaml]\nmemcached:\n  servers: [localhost:11211]\n"
	cfg, err := Parse("c.yaml", []byte(base), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Counters.Fencing != "auto" || cfg.Counters.FenceTTL != time.Hour {
		t.Errorf("defaults = %+v, want auto and 1h", cfg.Counters)
	}
	cfg, err = Parse("c.yaml", []byte(base+"counters:\n  fencing: required\n  fence_ttl: 6h\n"), env(nil))
	if err != nil || cfg.Counters.Fencing != "required" || cfg.Counters.FenceTTL != 6*time.Hour {
		t.Fatalf("Parse = %+v, %v", cfg, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"counters:\n  fencing: always\n", `c.yaml:6:12: counters.fencing: "always" is not one of auto, off, required`},
		{"counters:\n  fence_ttl: 0s\n", `c.yaml:6:14: counters.fence_ttl: 0s is outside (0, 720h0m0s]`},
		{"counters:\n  fencing: auto\n  fence: off\n", `c.yaml:7:3: counters: unknown key "fence" (known: fencing, fence_ttl)`},
	} {
		_, err := Parse("c.yaml", []byte(base+tc.yaml), env(nil))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: error %v, want %s", tc.yaml, err, tc.want)
		}
	}
}
