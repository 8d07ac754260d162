package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestRunSmall runs the whole benchmark at a tiny size: both consumers
// over both workloads, the latency measurement, the table and the
// Markdown results. It builds cachewarden and cwbroker first.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and runs every process of the benchmark")
	}
	m := privateMemcached(t) // skips or fails as the service rules say
	dsn := testsvc.MySQLBinlogDSN(t)
	memcachedBin := m.proc.Cmd.Path
	m.Stop()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binaries with")
	}
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg string }{
		{"cachewarden", "../cmd/cachewarden"},
		{"cwbroker", "./cmd/cwbroker"},
		{"cwbench", "./cmd/cwbench"},
	} {
		cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, b.out), b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	doc := filepath.Join(dir, "benchmarks.md")
	orig, err := os.ReadFile("../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(doc, orig, 0o644); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Events: 3000, Runs: 1, Keys: 200, Partitions: 2,
		LatencyRate: 2000, LatencyDuration: time.Second, LatencyWarmup: 500 * time.Millisecond, LatencySamplesPerSec: 50,
		CachewardenBin: filepath.Join(dir, "cachewarden"), BrokerBin: filepath.Join(dir, "cwbroker"),
		MemcachedBin: memcachedBin, SelfBin: filepath.Join(dir, "cwbench"),
		MySQLDSN: dsn, CounterMissEvery: 4,
		RunTimeout: time.Minute, Doc: doc, Command: "`cwbench -events 3000`", Out: &out, Log: testLogger(t),
	})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Consumers) != 8 {
		t.Fatalf("%d consumer runs, want 8", len(res.Consumers))
	}
	for _, r := range res.Consumers {
		if r.Elapsed <= 0 || r.PeakRSS == 0 || r.MCCommands == 0 {
			t.Errorf("%s %s: implausible result %+v", r.Workload, r.Consumer, r)
		}
		if !isDaemon(r.Consumer) && r.MCCommands < uint64(r.Events) {
			t.Errorf("%s sent %d memcached commands for %d events, want at least one each", r.Consumer, r.MCCommands, r.Events)
		}
		if isDaemon(r.Consumer) && (r.Daemon == nil || r.Daemon.Events["planned"] != float64(r.Events)) {
			t.Errorf("%s %s: daemon counts %+v, want %d planned events", r.Workload, r.Consumer, r.Daemon, r.Events)
		}
		if r.Workload == Counter && r.Daemon != nil {
			// A quarter of the comment counters start missing: their
			// first deltas recount, fenced or not as configured.
			fenced, unfenced := r.Daemon.RecountsFenced, r.Daemon.RecountsUnfenced
			if r.Consumer == ConsumerFenced && (fenced == 0 || unfenced != 0) || r.Consumer == ConsumerUnfenced && (unfenced == 0 || fenced != 0) {
				t.Errorf("%s: %v fenced and %v unfenced recounts", r.Consumer, fenced, unfenced)
			}
		}
	}
	if len(res.Latency) != 1 || res.Latency[0].Samples == 0 || res.Latency[0].Missing != 0 {
		t.Errorf("latency %+v", res.Latency)
	}
	got, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| uniform | naive |", "| uniform | competent |", "| zipf | cachewarden |", "p99.9", "| cachewarden, fences on |", "Command: `cwbench -events 3000`", "## Memory-flatness results"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("updated doc lacks %q", want)
		}
	}
	if !strings.Contains(out.String(), "targets:") {
		t.Error("no targets in the printed summary")
	}
}
