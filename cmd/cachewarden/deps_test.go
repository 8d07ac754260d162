package main

import (
	"os/exec"
	"strings"
	"testing"
)

// deps returns the packages the binary links (go list -deps).
func deps(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
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
			strings.HasPrefix(pkg, "github.com/twmb/franz-go/pkg/kfake"):
			linked = append(linked, pkg)
		}
	}
	if len(linked) > 0 {
		t.Errorf("cachewarden links the demo's harness: %v (it belongs in cmd/cachewarden-demo)", linked)
	}
}
