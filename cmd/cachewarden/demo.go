package main

import (
	"context"
	"io"
)

// demoCmd implements `demo`, which only points at the demo's own command:
// cmd/cachewarden-demo holds the harness, so that this binary links
// neither package integration nor the in-process Kafka-protocol broker
// (TestLinksNoDemoHarness). It exits with status 2.
func (a *app) demoCmd(_ context.Context, _ []string, _, _ io.Writer) error {
	return usageErrorf("demo: the demo is a command of its own, cachewarden-demo: " +
		"run `make demo` (flags in DEMO_FLAGS=\"...\"), or `go run ./cmd/cachewarden-demo -h` in the source tree")
}
