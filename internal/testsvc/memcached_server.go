package testsvc

import (
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MemcachedOptions are the settings of a private memcached server.
type MemcachedOptions struct {
	// Addr is the loopback host:port it listens on; empty picks a free
	// port.
	Addr string
	// MemoryMB is its item memory (-m); 0 means 16.
	MemoryMB int
	// Threads is its worker thread count (-t); 0 means 1.
	Threads int
	// Args are more memcached arguments, for example "-c", "1024", or
	// "-Z" and its certificate options for TLS (then readiness is a
	// completed TLS handshake).
	Args []string
}

// MemcachedServer is a memcached of the test's own in a child process,
// for tests that stop, freeze, restart or flush it, which the shared
// server (Memcached) must never see. It listens on the same address
// across restarts. Its methods are safe for concurrent use.
type MemcachedServer struct {
	// Addr is the server's host:port.
	Addr string

	t    testing.TB
	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// MemcachedBinary returns the path of the memcached binary: the one on
// PATH, else /usr/bin/memcached; "" when there is none.
func MemcachedBinary() string {
	if bin, err := exec.LookPath("memcached"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/bin/memcached"); err == nil {
		return "/usr/bin/memcached"
	}
	return ""
}

// PrivateMemcached starts a memcached of the test's own (UDP off) and
// waits until it answers; it is killed when the test ends. Without a
// memcached binary the test fails under CI=true and is skipped otherwise.
func PrivateMemcached(t testing.TB, opts MemcachedOptions) *MemcachedServer {
	t.Helper()
	bin := MemcachedBinary()
	if bin == "" {
		missing(t, "the memcached binary (apt-get install memcached)")
	}
	addr := opts.Addr
	if addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr().String()
		ln.Close()
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("private memcached address %q: %v", addr, err)
	}
	mem, threads := opts.MemoryMB, opts.Threads
	if mem == 0 {
		mem = 16
	}
	if threads == 0 {
		threads = 1
	}
	args := []string{"-l", host, "-p", port, "-U", "0", "-m", strconv.Itoa(mem), "-t", strconv.Itoa(threads)}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody")
	}
	m := &MemcachedServer{Addr: addr, t: t, bin: bin, args: append(args, opts.Args...)}
	m.Start()
	t.Cleanup(m.Kill)
	return m
}

// Start runs the server (again, after Kill) and waits until it answers.
func (m *MemcachedServer) Start() {
	m.t.Helper()
	m.mu.Lock()
	cmd := exec.Command(m.bin, m.args...)
	if err := cmd.Start(); err != nil {
		m.mu.Unlock()
		m.t.Fatalf("start memcached: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for !m.answers() {
		select {
		case err := <-done:
			m.t.Fatalf("memcached on %s exited at start-up: %v", m.Addr, err)
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("memcached on %s does not answer", m.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answers reports whether the server accepts a connection, and over TLS
// (-Z) completes a handshake.
func (m *MemcachedServer) answers() bool {
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	var (
		c   net.Conn
		err error
	)
	if slices.Contains(m.args, "-Z") {
		c, err = tls.DialWithDialer(d, "tcp", m.Addr, &tls.Config{InsecureSkipVerify: true})
	} else {
		c, err = d.Dial("tcp", m.Addr)
	}
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Signal sends sig to the server (SIGSTOP freezes it, SIGCONT resumes it).
func (m *MemcachedServer) Signal(sig syscall.Signal) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		m.t.Fatalf("memcached on %s: send %v: not running", m.Addr, sig)
	}
	if err := m.cmd.Process.Signal(sig); err != nil {
		m.t.Fatalf("memcached on %s: send %v: %v", m.Addr, sig, err)
	}
}

// Kill stops the server with SIGKILL (resuming it first if frozen) and
// waits for it to exit: every item is gone. Killing a stopped server does
// nothing.
func (m *MemcachedServer) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGCONT)
	m.cmd.Process.Kill()
	<-m.done
	m.cmd = nil
}
