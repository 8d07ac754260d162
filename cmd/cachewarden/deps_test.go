package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksOneKafkaClient checks that the binary, demo included, links
// franz-go as its only Kafka client: the demo's harness (package
// integration) publishes and reads with it too.
func TestLinksOneKafkaClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var others []string
	franz := false
	for _, pkg := range strings.Fields(string(out)) {
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
