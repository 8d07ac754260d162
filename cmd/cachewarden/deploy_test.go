package main

import (
	"bytes"
	"context"
	"database/sql"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// needTool returns the path of a command-line tool a test runs: missing,
// the test fails under CI=true (make test installs it) and skips
// otherwise.
func needTool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed; CI requires it: %s", name, install)
	}
	t.Skipf("%s is not installed: %s", name, install)
	return ""
}

// TestAlertRules runs promtool's checks and the unit tests of
// deploy/prometheus/alerts.yaml.
func TestAlertRules(t *testing.T) {
	promtool := needTool(t, "promtool", "`make test` installs it (scripts/services.sh start: Debian's prometheus package)")
	for _, args := range [][]string{
		{"check", "rules", "../../deploy/prometheus/alerts.yaml"},
		{"test", "rules", "../../deploy/prometheus/alerts_test.yaml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// metricNames returns the cachewarden metric names in text, sorted and
// without duplicates.
func metricNames(text string) []string {
	names := regexp.MustCompile(`\bcachewarden_[a-z0-9_]+`).FindAllString(text, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// dashboardQueries returns every query of the Grafana dashboard.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/grafana/cachewarden.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("deploy/grafana/cachewarden.json: %v", err)
	}
	var queries []string
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if len(metricNames(q.Expr)) == 0 {
				t.Errorf("panel %q: query %q names no cachewarden metric", p.Title, q.Expr)
			}
			queries = append(queries, q.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			queries = append(queries, v.Definition)
		}
	}
	return queries
}

// TestDashboardAndAlertsNameExportedMetrics runs the daemon, its
// consistency observer on, through planned, recounted and poison
// messages, then checks that every metric
// the Grafana dashboard's queries and the alert rules name is in its
// /metrics.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	queries := dashboardQueries(t)
	alerts, err := os.ReadFile("../../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wanted := map[string][]string{} // metric -> where it is named
	for _, q := range queries {
		for _, n := range metricNames(q) {
			wanted[n] = append(wanted[n], "dashboard")
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(alerts, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, n := range metricNames(r.Expr) {
				wanted[n] = append(wanted[n], "alert "+r.Alert)
			}
		}
	}
	// The descriptions may name a histogram by its base name.
	for _, n := range metricNames(string(alerts)) {
		if _, ok := wanted[n]; !ok {
			wanted[n] = append(wanted[n], "alerts.yaml text")
		}
	}

	mc := testsvc.Memcached(t)
	dsn := testsvc.MySQLDSN(t)
	database := "cwtest_dash_" + testsvc.Unique()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t.Cleanup(func() { dropDatabase(dsn, database) })
	for _, stmt := range []string{
		"CREATE DATABASE " + database,
		"CREATE TABLE " + database + ".comments (id INT PRIMARY KEY, post_id INT NOT NULL, approved TINYINT NOT NULL, KEY (post_id))",
		"INSERT INTO " + database + ".comments VALUES (1, 9, 1), (2, 9, 1)",
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic, topic+".dlq")
	cfgPath := writeCountConfig(t, brokers, topic, mc, strings.TrimSuffix(dsn, "/")+"/"+database)
	// The observer's alerts name its metrics: check every change at 1s.
	observerSection := "observer:\n  enabled: true\n  sample: 1\n  windows: [1s]\n"
	data, err := os.ReadFile(cfgPath)
	if err == nil {
		err = os.WriteFile(cfgPath, append(data, observerSection...), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cfgPath)

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, AllowAutoTopicCreation: true}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UnixMilli()
	for _, v := range []string{
		fmt.Sprintf(`{"op":"c","before":null,"after":{"id":77,"name":"x"},"source":{"db":"shop","table":"users","ts_ms":%d},"ts_ms":%d}`, now, now),
		fmt.Sprintf(`{"op":"u","before":{"id":77,"name":"x"},"after":{"id":77,"name":"y"},"source":{"db":"shop","table":"users","ts_ms":%d},"ts_ms":%d}`, now, now),
		// An update without its before image: a recount from MySQL.
		fmt.Sprintf(`{"op":"u","before":null,"after":{"id":1,"post_id":9,"approved":1},"source":{"db":"blog","table":"comments","ts_ms":%d},"ts_ms":%d}`, now, now),
		// A poison message: to the DLQ, an invalidation lost.
		`{"op":"c","after":`,
	} {
		if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	var missing []string
	waitUntil(t, 30*time.Second, func() string {
		text := d.metricsText()
		missing = missing[:0]
		for _, n := range slices.Sorted(mapsKeys(wanted)) {
			if !regexp.MustCompile(`(?m)^` + n + `(_bucket)?[{ ]`).MatchString(text) {
				missing = append(missing, fmt.Sprintf("%s (%s)", n, strings.Join(slices.Compact(wanted[n]), ", ")))
			}
		}
		if len(missing) > 0 {
			return "metrics named but not exported:\n  " + strings.Join(missing, "\n  ")
		}
		return ""
	})
	if len(wanted) < 25 {
		t.Errorf("only %d metrics named by the dashboard and alerts", len(wanted))
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestKubernetesExample loads each pool's config in
// deploy/kubernetes/cachewarden.yaml with the rules of its ConfigMap, as
// the daemon would in the pod, and checks the Deployments: one per pool,
// each with its own consumer group, probes on /healthz and /readyz, the
// metrics port scraped, the config's variables set.
func TestKubernetesExample(t *testing.T) {
	data, err := os.ReadFile("../../deploy/kubernetes/cachewarden.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Args []string `yaml:"args"`
		Env  []struct {
			Name  string `yaml:"name"`
			Value string `yaml:"value"`
		} `yaml:"env"`
		Resources struct {
			Limits struct {
				Memory string `yaml:"memory"`
			} `yaml:"limits"`
		} `yaml:"resources"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	type object struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
		Spec struct {
			// Selector: a PodDisruptionBudget's or a PodMonitor's.
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			PodMetricsEndpoints []struct {
				Port        string `yaml:"port"`
				Path        string `yaml:"path"`
				Relabelings []struct {
					SourceLabels []string `yaml:"sourceLabels"`
					TargetLabel  string   `yaml:"targetLabel"`
				} `yaml:"relabelings"`
			} `yaml:"podMetricsEndpoints"`
			Template struct {
				Metadata struct {
					Labels      map[string]string `yaml:"labels"`
					Annotations map[string]string `yaml:"annotations"`
				} `yaml:"metadata"`
				Spec struct {
					TopologySpreadConstraints []struct {
						TopologyKey string `yaml:"topologyKey"`
					} `yaml:"topologySpreadConstraints"`
					Containers []yaml.Node `yaml:"containers"`
					Volumes    []struct {
						Name      string `yaml:"name"`
						ConfigMap struct {
							Name string `yaml:"name"`
						} `yaml:"configMap"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	configMaps := map[string]map[string]string{}
	var deployments, budgets, monitors []object
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatal(err)
		}
		switch o.Kind {
		case "ConfigMap":
			configMaps[o.Metadata.Name] = o.Data
		case "Deployment":
			deployments = append(deployments, o)
		case "PodDisruptionBudget":
			budgets = append(budgets, o)
		case "PodMonitor":
			monitors = append(monitors, o)
		}
	}
	if len(deployments) < 2 {
		t.Fatalf("%d Deployments, want one per memcached pool (at least 2)", len(deployments))
	}
	// selects reports whether a selector's labels all hold in labels.
	selects := func(sel, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	// One way to be scraped: a PodMonitor that labels series with the pool.
	if len(monitors) != 1 || len(monitors[0].Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("%d PodMonitors: want one, with one endpoint", len(monitors))
	}
	endpoint := monitors[0].Spec.PodMetricsEndpoints[0]
	poolLabel := false
	for _, r := range endpoint.Relabelings {
		poolLabel = poolLabel || (r.TargetLabel == "pool" && slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_label_cachewarden_pool"}))
	}
	if endpoint.Path != "/metrics" || !poolLabel {
		t.Errorf("PodMonitor endpoint %+v: want /metrics, relabelled with the pod's cachewarden/pool as pool", endpoint)
	}
	groups := map[string]string{}
	for _, dep := range deployments {
		t.Run(dep.Metadata.Name, func(t *testing.T) {
			pod := dep.Spec.Template
			for k := range pod.Metadata.Annotations {
				if strings.HasPrefix(k, "prometheus.io/") {
					t.Errorf("pod annotation %s: with the PodMonitor, a Prometheus honouring annotations scrapes the pod twice", k)
				}
			}
			if !selects(monitors[0].Spec.Selector.MatchLabels, pod.Metadata.Labels) || pod.Metadata.Labels["cachewarden/pool"] == "" {
				t.Errorf("pod labels %v: the PodMonitor does not select them, or no cachewarden/pool", pod.Metadata.Labels)
			}
			budgeted := 0
			for _, b := range budgets {
				if selects(b.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
					budgeted++
					if b.Spec.Selector.MatchLabels["cachewarden/pool"] != pod.Metadata.Labels["cachewarden/pool"] {
						t.Errorf("PodDisruptionBudget %s spans pools", b.Metadata.Name)
					}
				}
			}
			if budgeted != 1 {
				t.Errorf("%d PodDisruptionBudgets select the pool's pods, want 1", budgeted)
			}
			if len(pod.Spec.TopologySpreadConstraints) == 0 {
				t.Errorf("no topologySpreadConstraints: the pool's replicas may share a node")
			}
			if len(pod.Spec.Containers) != 1 {
				t.Fatalf("%d containers", len(pod.Spec.Containers))
			}
			var c container
			if err := pod.Spec.Containers[0].Decode(&c); err != nil {
				t.Fatal(err)
			}
			// yaml tags cannot name two keys: decode the probes apart.
			var probes struct {
				Liveness struct {
					HTTPGet struct{ Path string } `yaml:"httpGet"`
				} `yaml:"livenessProbe"`
				Readiness struct {
					HTTPGet struct{ Path string } `yaml:"httpGet"`
				} `yaml:"readinessProbe"`
			}
			pod.Spec.Containers[0].Decode(&probes)
			if probes.Liveness.HTTPGet.Path != "/healthz" || probes.Readiness.HTTPGet.Path != "/readyz" {
				t.Errorf("probes: liveness %q, readiness %q; want /healthz and /readyz", probes.Liveness.HTTPGet.Path, probes.Readiness.HTTPGet.Path)
			}
			// Mount the ConfigMaps as the pod does.
			dir := t.TempDir()
			mounts := map[string]string{}
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			var cfgPath string
			for _, v := range pod.Spec.Volumes {
				files, ok := configMaps[v.ConfigMap.Name]
				if !ok {
					t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
				}
				target := filepath.Join(dir, mounts[v.Name])
				os.MkdirAll(target, 0o755)
				for name, content := range files {
					os.WriteFile(filepath.Join(target, name), []byte(content), 0o644)
				}
			}
			i := slices.Index(c.Args, "-c")
			if i < 0 || i+1 >= len(c.Args) {
				t.Fatalf("args %q: no -c FILE", c.Args)
			}
			cfgPath = filepath.Join(dir, c.Args[i+1])
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
			}
			lookup := func(name string) (string, bool) {
				if !env[name] {
					return "", false // the config uses a variable the pod does not set
				}
				switch name {
				case "MYSQL_DSN":
					return "cachewarden:pw@tcp(mysql:3306)/app", true
				}
				return "kafka-0.kafka:9092", true
			}
			cfg, err := config.LoadEnv(cfgPath, lookup)
			if err != nil {
				t.Fatalf("the pod's config fails validation:\n%v", err)
			}
			if len(cfg.RuleSet.Rules()) == 0 {
				t.Error("no rules loaded")
			}
			if other, ok := groups[cfg.Kafka.Group]; ok {
				t.Errorf("consumer group %s is also %s's: every pool needs a group of its own", cfg.Kafka.Group, other)
			}
			groups[cfg.Kafka.Group] = dep.Metadata.Name
			port := strings.TrimPrefix(cfg.HTTP.Listen, ":")
			if !strings.HasPrefix(cfg.HTTP.Listen, ":") {
				t.Errorf("http.listen %q: want all interfaces", cfg.HTTP.Listen)
			}
			if len(c.Ports) == 0 || fmt.Sprint(c.Ports[0].ContainerPort) != port || c.Ports[0].Name != endpoint.Port {
				t.Errorf("container ports %v do not expose %s as the PodMonitor's port %q", c.Ports, port, endpoint.Port)
			}
			limit, err := mebibytes(c.Resources.Limits.Memory)
			if err != nil {
				t.Fatalf("memory limit: %v", err)
			}
			var soft float64 = -1
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" {
					if soft, err = mebibytes(e.Value); err != nil {
						t.Fatalf("GOMEMLIMIT: %v", err)
					}
				}
			}
			if soft <= 0 || soft > 0.9*limit {
				t.Errorf("GOMEMLIMIT %v MiB: want one under 90%% of the memory limit, %v MiB", soft, limit)
			}
		})
	}
}

// mebibytes reads a Kubernetes quantity in Mi or a GOMEMLIMIT in MiB.
func mebibytes(q string) (float64, error) {
	num, ok := strings.CutSuffix(q, "MiB")
	if !ok {
		num, ok = strings.CutSuffix(q, "Mi")
	}
	if !ok {
		return 0, fmt.Errorf("%q: want a number of Mi or MiB", q)
	}
	return strconv.ParseFloat(num, 64)
}

// imageVersion is the VERSION build argument buildStatic gives the
// Dockerfile's build command.
const imageVersion = "v0.0.0-image-test"

// buildStatic builds the binary with deploy/container/Dockerfile's own
// build command (its build stage's RUN that calls go build), run by sh from
// the repository root with the build argument VERSION=imageVersion and the
// output moved into a temporary folder.
func buildStatic(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/container/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var run string
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			run = strings.TrimPrefix(line, "RUN ")
		}
	}
	if run == "" || !strings.Contains(run, "/out/cachewarden") {
		t.Fatalf("the Dockerfile has no RUN that builds /out/cachewarden")
	}
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(run, "/out/cachewarden", filepath.Join(dir, "cachewarden")))
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "VERSION="+imageVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build command: %v\n%s", err, out)
	}
	return filepath.Join(dir, "cachewarden")
}

// TestContainerBuild checks what can be checked of the container build
// without a Docker engine: the Dockerfile's sources exist, its Go version
// is go.mod's, the final stage runs a static binary as a non-root user
// with no shell; and the static build works, links no C library and runs.
func TestContainerBuild(t *testing.T) {
	data, err := os.ReadFile("../../deploy/container/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string // instructions per stage
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], line)
		}
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	gomod, _ := os.ReadFile("../../go.mod")
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil || !strings.Contains(string(data), "ARG GO_VERSION="+string(goVersion[1])) {
		t.Errorf("the build stage's Go is not go.mod's %s", goVersion[1])
	}
	for _, stage := range stages {
		for _, ins := range stage {
			if !strings.HasPrefix(ins, "COPY ") || strings.Contains(ins, "--from=") {
				continue
			}
			fields := strings.Fields(ins)
			for _, src := range fields[1 : len(fields)-1] {
				if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
					t.Errorf("%s: %v", ins, err)
				}
			}
		}
	}
	build := strings.Join(stages[0], "\n")
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/cachewarden") {
		t.Errorf("the build stage does not build ./cmd/cachewarden with CGO_ENABLED=0")
	}
	final := stages[1]
	if !strings.Contains(final[0], "distroless/static") && !strings.Contains(final[0], "scratch") {
		t.Errorf("runtime base %q: want distroless static or scratch", final[0])
	}
	var user, entrypoint string
	for _, ins := range final {
		switch {
		case strings.HasPrefix(ins, "RUN "):
			t.Errorf("the runtime stage runs %q: it has no shell", ins)
		case strings.HasPrefix(ins, "USER "):
			user = strings.TrimPrefix(ins, "USER ")
		case strings.HasPrefix(ins, "ENTRYPOINT "):
			entrypoint = strings.TrimPrefix(ins, "ENTRYPOINT ")
		}
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("USER %q: want a non-root user", user)
	}
	var argv []string
	if err := json.Unmarshal([]byte(entrypoint), &argv); err != nil || len(argv) == 0 {
		t.Errorf("ENTRYPOINT %s: want the exec form (no shell)", entrypoint)
	}

	bin := buildStatic(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the static build has a program interpreter: it needs a C library")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the static build links %v", libs)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "CGO_ENABLED 0") {
		t.Errorf("version of the static build:\n%s", out)
	}
}

// TestSystemdUnit checks the hardening of deploy/systemd/cachewarden.service
// and, where systemd-analyze is installed, that systemd accepts it.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile("../../deploy/systemd/cachewarden.service")
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string][]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[k] = append(settings[k], v)
		}
	}
	for k, want := range map[string]string{
		"DynamicUser":           "yes",
		"ProtectSystem":         "strict",
		"NoNewPrivileges":       "yes",
		"ProtectHome":           "yes",
		"PrivateTmp":            "yes",
		"CapabilityBoundingSet": "",
		"KillSignal":            "SIGTERM",
		"ExecReload":            "/bin/kill -HUP $MAINPID",
		// A config that does not load is not retried forever.
		"RestartPreventExitStatus": strconv.Itoa(exitConfig),
		"StartLimitBurst":          "5",
	} {
		if got := settings[k]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	exec0 := strings.Fields(strings.Join(settings["ExecStart"], ""))
	if len(exec0) < 4 || !slices.Equal(exec0[1:3], []string{"run", "-c"}) {
		t.Errorf("ExecStart %q: want BINARY run -c CONFIG", exec0)
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the unit's syntax is not checked by systemd")
		return
	}
	dir := t.TempDir()
	bin := buildStatic(t)
	unit := filepath.Join(dir, "cachewarden.service")
	os.WriteFile(unit, bytes.ReplaceAll(data, []byte(exec0[0]), []byte(bin)), 0o644)
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command(analyze, "security", "--offline=true", unit).CombinedOutput()
	if err == nil {
		if m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out); m != nil {
			t.Logf("systemd-analyze security: exposure %s", m[1])
			if v, err := strconv.ParseFloat(string(m[1]), 64); err != nil || v > 2 {
				t.Errorf("exposure %s: want 2 or less", m[1])
			}
		}
	}
}

// TestVersion checks `cachewarden version` on a built binary (module
// versions come from go.mod) and writeVersion on a fixed build.
func TestVersion(t *testing.T) {
	bin := buildStatic(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	gomod, _ := os.ReadFile("../../go.mod")
	for _, mod := range []string{"github.com/twmb/franz-go", "github.com/go-sql-driver/mysql", "github.com/prometheus/client_golang"} {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + ` (v\S+)`).FindSubmatch(gomod)
		if m == nil {
			t.Fatalf("go.mod does not require %s", mod)
		}
		if want := "  " + mod + " " + string(m[1]) + " h1:"; !strings.Contains(string(out), want) {
			t.Errorf("version lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"module      github.com/cachewarden/cachewarden\n", "go          go1."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("version lacks %q:\n%s", want, out)
		}
	}
	short, _ := exec.Command(bin, "version", "--short").CombinedOutput()
	if strings.Contains(string(short), "modules:") {
		t.Errorf("--short lists modules:\n%s", short)
	}

	if want := "cachewarden " + imageVersion + "\n"; !strings.HasPrefix(string(out), want) {
		t.Errorf("the image's binary does not report the VERSION it was built with, %q:\n%s", imageVersion, out)
	}
	flagOut, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || string(flagOut) != string(short) {
		t.Errorf("--version: %v\n%s\nwant the output of version --short:\n%s", err, flagOut, short)
	}

	var buf bytes.Buffer
	writeVersion(&buf, &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Main:      debug.Module{Path: "github.com/cachewarden/cachewarden", Version: "v1.2.3"},
		Deps: []*debug.Module{
			{Path: "a.example/x", Version: "v0.1.0", Sum: "h1:x="},
			{Path: "b.example/y", Version: "v1.0.0", Replace: &debug.Module{Path: "../y", Version: ""}},
		},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "CGO_ENABLED", Value: "0"}},
	}, "", true)
	want := `cachewarden v1.2.3
module      github.com/cachewarden/cachewarden
go          go1.26.0
revision    abc123 (modified)
CGO_ENABLED 0
modules:
  a.example/x v0.1.0 h1:x=
  b.example/y v1.0.0 => ../y
`
	if buf.String() != want {
		t.Errorf("writeVersion:\n%s\nwant:\n%s", buf.String(), want)
	}

	for _, c := range []struct {
		name    string
		bi      *debug.BuildInfo
		stamped string
		want    string
	}{
		{"stamped wins", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.4.0-3-gabc", "v1.4.0-3-gabc"},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "", "v1.2.3"},
		{"devel with revision", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}}, "", "devel-0123456789ab-dirty"},
		{"nothing known", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", "unknown"},
		{"no build information", nil, "", "unknown"},
	} {
		if got := buildOf(c.bi, c.stamped).Version; got != c.want {
			t.Errorf("%s: version %q, want %q", c.name, got, c.want)
		}
	}
}

// TestMakeBuildVersion builds the binary with `make build` and checks that
// it reports the checkout's `git describe`, as its start-up log,
// cachewarden_build_info and /version do.
func TestMakeBuildVersion(t *testing.T) {
	describe, err := exec.Command("git", "-C", "../..", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatalf("git describe: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "cachewarden")
	if out, err := exec.Command("make", "-C", "../..", "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version", "--short").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if want := "cachewarden " + strings.TrimSpace(string(describe)) + "\n"; !strings.HasPrefix(string(out), want) {
		t.Errorf("make build's binary says:\n%s\nwant it to begin %q", out, want)
	}
}

// TestDashboardSplitsPools checks that every dashboard query keeps to the
// chosen pools and instances, and that per-topic figures are split by
// pool: each pool's daemons report the same topics.
func TestDashboardSplitsPools(t *testing.T) {
	for _, q := range dashboardQueries(t) {
		if strings.HasPrefix(q, "label_values(") {
			continue
		}
		for _, sel := range regexp.MustCompile(`cachewarden_\w+\{[^}]*\}`).FindAllString(q, -1) {
			if !strings.Contains(sel, `pool=~"$pool"`) || !strings.Contains(sel, `instance=~"$instance"`) {
				t.Errorf("%s: does not keep to $pool and $instance", sel)
			}
		}
		if strings.Contains(q, "by (topic)") {
			t.Errorf("%s: a topic's figures mix the pools", q)
		}
	}
}

// TestAlertRunbooks checks that every alert's runbook_url points at a
// section of docs/operations.md's "Runbooks" named after the alert, and
// that each section gives commands to run (a sh block).
func TestAlertRunbooks(t *testing.T) {
	data, err := os.ReadFile("../../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, runbooks, ok := strings.Cut(string(doc), "\n## Runbooks\n")
	if !ok {
		t.Fatal("docs/operations.md has no Runbooks section")
	}
	runbooks, _, _ = strings.Cut(runbooks, "\n## ")
	sections := map[string]string{} // anchor -> body
	for _, part := range strings.Split(runbooks, "\n### ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		sections[strings.ToLower(title)] = body
	}
	const base = "https://github.com/cachewarden/cachewarden/blob/main/docs/operations.md#"
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, base)
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, url, base, strings.ToLower(r.Alert))
				continue
			}
			body, ok := sections[anchor]
			if !ok {
				t.Errorf("%s: docs/operations.md has no runbook section ### %s", r.Alert, r.Alert)
				continue
			}
			if !strings.Contains(body, "```sh\n") {
				t.Errorf("%s: its runbook gives no command", r.Alert)
			}
		}
	}
	if alerts != len(sections) {
		t.Errorf("%d alerts, %d runbook sections", alerts, len(sections))
	}
}
