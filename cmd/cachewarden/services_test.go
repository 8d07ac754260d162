package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	for _, unwanted := range []string{"installing", "apt-get", "3308", "3309", "binary log on listening", "replica"} {
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

// TestServicesStopChecksWhatItKills gives `scripts/services.sh stop` pid
// files that name processes it did not start: a stale file whose number
// now belongs to some other process is removed and that process left
// alone; a process that is the script's memcached but outlives SIGTERM
// makes stop fail, naming it, instead of reporting it stopped.
func TestServicesStopChecksWhatItKills(t *testing.T) {
	dir := t.TempDir()
	port := strings.TrimPrefix(closedAddr(t), "127.0.0.1:")
	pidFile := filepath.Join(dir, "memcached-"+port+".pid")

	other := exec.Command("sleep", "300")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(other.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := services(t, dir, port, "stop")
	if !running(other.Process.Pid) {
		t.Fatalf("stop killed pid %d, which a stale pid file named but is no memcached:\n%s", other.Process.Pid, out)
	}
	if !strings.Contains(out, "stale pid file") || strings.Contains(out, "stopped memcached") {
		t.Errorf("stop's output does not say the pid file was stale:\n%s", out)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("the stale pid file is still there (%v)", err)
	}

	// A process with memcached's command line that ignores SIGTERM.
	stubborn := exec.Command("bash", "-c", `trap '' TERM; exec -a "memcached -d -u nobody -l 127.0.0.1 -p `+port+` -U 0" sleep 300`)
	if err := stubborn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stubborn.Process.Kill(); stubborn.Wait() })
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(stubborn.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for { // until bash has exec'd the process with its new command line
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", stubborn.Process.Pid))
		if strings.HasPrefix(string(cmdline), "memcached -d") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in never took memcached's command line: %q", cmdline)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd := exec.Command("../../scripts/services.sh", "stop")
	cmd.Env = append(os.Environ(), "CACHEWARDEN_SERVICES_DIR="+dir, "CACHEWARDEN_MEMCACHED_PORT="+port)
	stopOut, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("stop succeeded although pid %d outlived SIGTERM:\n%s", stubborn.Process.Pid, stopOut)
	}
	if !strings.Contains(string(stopOut), "still runs") || strings.Contains(string(stopOut), "stopped memcached") {
		t.Errorf("stop's output does not say the process outlived the wait:\n%s", stopOut)
	}
}

// running reports whether pid is a live process: not gone, and not a
// zombie that a signal already ended but its parent has not reaped.
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, so read after the last ')'.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
