package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/cachewarden/cachewarden/"

// deps returns the packages the binary links (go list -deps).
func deps(t *testing.T) []string {
	t.Helper()
	return depsOf(t, ".")
}

// depsOf returns the packages pkg links (go list -deps), pkg included.
func depsOf(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

// TestLinksOneKafkaClient checks that the binary links franz-go as its
// only Kafka client.
func TestLinksOneKafkaClient(t *testing.T) {
	var others []string
	franz := false
	for _, pkg := range deps(t) {
		switch {
		case strings.HasPrefix(pkg, "github.com/twmb/franz-go/"):
			franz = true
		case strings.HasPrefix(pkg, module):
		case strings.Contains(strings.ToLower(pkg), "kafka"), strings.Contains(pkg, "sarama"):
			others = append(others, pkg)
		}
	}
	if !franz || len(others) > 0 {
		t.Errorf("cachewarden links franz-go: %v, and other Kafka packages: %v", franz, others)
	}
}

// TestLinksNoDemoHarness checks that the production binary links neither
// the test and demo harness (package integration, whose home is
// cmd/cachewarden-demo) nor the in-process broker kfake, nor anything of
// the test helpers.
func TestLinksNoDemoHarness(t *testing.T) {
	var linked []string
	for _, pkg := range deps(t) {
		switch {
		case pkg == "github.com/cachewarden/cachewarden/integration",
			strings.HasPrefix(pkg, "github.com/cachewarden/cachewarden/integration/"),
			strings.HasPrefix(pkg, "github.com/cachewarden/cachewarden/internal/testsvc"),
			strings.HasPrefix(pkg, "github.com/cachewarden/cachewarden/internal/pipetest"),
			strings.HasPrefix(pkg, "github.com/twmb/franz-go/pkg/kfake"):
			linked = append(linked, pkg)
		}
	}
	if len(linked) > 0 {
		t.Errorf("cachewarden links the demo's harness: %v (it belongs in cmd/cachewarden-demo)", linked)
	}
}

// TestLayout checks the direction of the daemon's dependencies (README,
// "Layout"): the pipeline knows no source and no Kafka or binary log
// client; sources import the pipeline, never each other, and no config;
// only the wiring turns the config into them.
func TestLayout(t *testing.T) {
	sources := []string{"source/kafka", "source/replay", "source/binlog"}
	forbidden := map[string][]string{
		"pipeline": {module + "source/", module + "wiring", module + "config", "github.com/twmb/franz-go/", "github.com/segmentio/kafka-go", "github.com/go-mysql-org/"},
		// A replay reads streams that other sources open for it.
		"source/replay": {"github.com/twmb/franz-go/", "github.com/go-mysql-org/"},
	}
	for _, src := range sources {
		for _, other := range sources {
			if other != src {
				forbidden[src] = append(forbidden[src], module+other)
			}
		}
		forbidden[src] = append(forbidden[src], module+"wiring", module+"config")
	}
	for pkg, bad := range forbidden {
		if _, err := exec.Command("go", "list", "../../"+pkg).CombinedOutput(); err != nil {
			continue // a source not built yet
		}
		for _, dep := range depsOf(t, "../../"+pkg) {
			for _, b := range bad {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}
