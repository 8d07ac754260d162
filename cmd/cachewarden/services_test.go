package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// services runs scripts/services.sh with its state in dir and memcached
// on port, and returns its output.
func services(t *testing.T, dir, port string, args ...string) string {
	t.Helper()
	cmd := exec.Command("../../scripts/services.sh", args...)
	cmd.Env = append(os.Environ(), "CACHEWARDEN_SERVICES_DIR="+dir, "CACHEWARDEN_MEMCACHED_PORT="+port)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("services.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func portOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestServicesScript runs `scripts/services.sh demo` as `make demo` does,
// with its own memcached port and state directory: it starts memcached
// (and no binary-log MariaDB, nor any package installation, everything
// being installed), `status` says it started it, and `stop` stops it.
func TestServicesScript(t *testing.T) {
	needTool(t, "memcached", "`make test` installs it (scripts/services.sh start)")
	testsvc.MySQLDSN(t) // demo reuses the MariaDB `make services` made answer
	dir := t.TempDir()
	port := strings.TrimPrefix(closedAddr(t), "127.0.0.1:")
	addr := "127.0.0.1:" + port
	t.Cleanup(func() {
		if portOpen(addr) {
			services(t, dir, port, "stop")
		}
	})

	out := services(t, dir, port, "demo")
	if !portOpen(addr) {
		t.Fatalf("no memcached on %s after demo:\n%s", addr, out)
	}
	for _, unwanted := range []string{"installing", "apt-get", "3308", "binary log on listening"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("demo's output has %q: it should start only memcached and a MariaDB, and install nothing:\n%s", unwanted, out)
		}
	}
	env, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil || !strings.Contains(string(env), "CACHEWARDEN_TEST_MEMCACHED='"+addr+"'") || !strings.Contains(string(env), "CACHEWARDEN_TEST_MYSQL_DSN=") {
		t.Errorf("env file: %v\n%s", err, env)
	}
	status := services(t, dir, port, "status")
	if !strings.Contains(status, "memcached on "+addr+" (started by scripts/services.sh, pid ") {
		t.Errorf("status does not say it started memcached:\n%s", status)
	}
	if !strings.Contains(status, "make services-stop") {
		t.Errorf("status does not say how to stop:\n%s", status)
	}

	out = services(t, dir, port, "stop")
	if portOpen(addr) {
		t.Fatalf("memcached still answers on %s after stop:\n%s", addr, out)
	}
	if status := services(t, dir, port, "status"); strings.Contains(status, addr) {
		t.Errorf("status after stop:\n%s", status)
	}
}
