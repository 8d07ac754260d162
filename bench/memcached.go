package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MemcachedArgs are the memcached options of the benchmark: two worker
// threads, 1 GiB of item memory, up to 4096 connections.
var MemcachedArgs = []string{"-t", "2", "-m", "1024", "-c", "4096"}

// Process is a child process started by the harness.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(name string, cmd *exec.Cmd) (*Process, error) {
	// Should the harness die without stopping its children, the kernel
	// kills them (the broker may hold gigabytes).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to grace for the process to exit, then
// kills it. It returns the exit error of a process that did not end
// cleanly after SIGTERM.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return p.err
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("bench: %s did not stop within %v after SIGTERM; killed", p.Name, grace)
	}
}

// Memcached is a memcached process started by the harness.
type Memcached struct {
	Addr string
	proc *Process
}

// StartMemcached starts bin (e.g. /usr/bin/memcached) on a free loopback
// port with MemcachedArgs and waits until it accepts connections.
func StartMemcached(ctx context.Context, bin string) (*Memcached, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := append([]string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0"}, MemcachedArgs...)
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // memcached refuses to run as root
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	proc, err := startProcess("memcached", cmd)
	if err != nil {
		return nil, err
	}
	m := &Memcached{Addr: addr, proc: proc}
	if err := waitDial(ctx, addr, proc, 10*time.Second); err != nil {
		_ = proc.Stop(time.Second)
		return nil, fmt.Errorf("bench: memcached on %s: %w", addr, err)
	}
	return m, nil
}

// Pid is memcached's process id.
func (m *Memcached) Pid() int { return m.proc.Pid() }

// Stop stops memcached.
func (m *Memcached) Stop() error { return m.proc.Stop(5 * time.Second) }

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitDial retries connecting to addr until it succeeds, proc exits, or
// timeout passes.
func waitDial(ctx context.Context, addr string, proc *Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if proc != nil && proc.Exited() {
			return fmt.Errorf("process exited: %v", proc.err)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// MemcachedStats are the counters of memcached's `stats` command.
type MemcachedStats map[string]uint64

// CommandStats lists the `stats` counters that CommandCount adds up: every
// command a client sends that reads or changes an item. cmd_set counts
// set, add, replace, append, prepend and cas alike; cmd_get counts each
// key of a multi-key get.
var CommandStats = []string{
	"cmd_get", "cmd_set", "cmd_touch",
	"incr_hits", "incr_misses", "decr_hits", "decr_misses",
	"delete_hits", "delete_misses",
}

// CommandCount is the number of item commands counted in s.
func (s MemcachedStats) CommandCount() uint64 {
	var n uint64
	for _, k := range CommandStats {
		n += s[k]
	}
	return n
}

// Sub returns s - before, counter by counter (gauges give nonsense).
func (s MemcachedStats) Sub(before MemcachedStats) MemcachedStats {
	out := make(MemcachedStats, len(s))
	for k, v := range s {
		out[k] = v - before[k]
	}
	return out
}

// ParseStats reads the reply of `stats` up to its END line. Values that
// are not unsigned integers (version, rusage) are left out.
func ParseStats(r *bufio.Reader) (MemcachedStats, error) {
	s := MemcachedStats{}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("bench: memcached stats: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "END" {
			return s, nil
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "STAT" {
			return nil, fmt.Errorf("bench: memcached stats: unexpected line %q", line)
		}
		if v, err := strconv.ParseUint(f[2], 10, 64); err == nil {
			s[f[1]] = v
		}
	}
}

// mcConn is a raw text-protocol connection for the harness's own
// bookkeeping commands (stats, flush_all, seeding).
type mcConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialMemcached(addr string) (*mcConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("bench: dial memcached %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	return &mcConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 256<<10)}, nil
}

func (m *mcConn) Close() error { return m.c.Close() }

// expect reads one reply line and checks it.
func (m *mcConn) expect(want string) error {
	line, err := m.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("bench: memcached: %w", err)
	}
	if got := strings.TrimRight(line, "\r\n"); got != want {
		return fmt.Errorf("bench: memcached replied %q, want %q", got, want)
	}
	return nil
}

// Stats returns the server's `stats` counters.
func Stats(addr string) (MemcachedStats, error) {
	m, err := dialMemcached(addr)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	if _, err := io.WriteString(m.c, "stats\r\n"); err != nil {
		return nil, fmt.Errorf("bench: memcached stats: %w", err)
	}
	return ParseStats(m.r)
}

// SeedKeys is how the harness warms the cache before each consumer run:
// for every id of the key space, a namespace version, a small interest
// set and a comment counter, as a cache in service would hold them.
// It first empties the cache (flush_all), so every run starts alike.
func SeedKeys(addr string, keys int) error { return SeedKeysMissing(addr, keys, 0) }

// SeedKeysMissing seeds like SeedKeys but leaves out the comment counter
// of every post whose id is a multiple of counterMissEvery (none when it
// is 0): deltas to those counters miss, and with a recount query each
// first miss is a recount.
func SeedKeysMissing(addr string, keys, counterMissEvery int) error {
	m, err := dialMemcached(addr)
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := m.w.WriteString("flush_all\r\n"); err != nil {
		return fmt.Errorf("bench: flush_all: %w", err)
	}
	if err := m.w.Flush(); err != nil {
		return fmt.Errorf("bench: flush_all: %w", err)
	}
	if err := m.expect("OK"); err != nil {
		return err
	}
	version := strconv.FormatInt(time.Now().UnixMilli(), 10)
	set := func(key, value string) {
		m.w.WriteString("set ")
		m.w.WriteString(key)
		m.w.WriteString(" 0 0 ")
		m.w.WriteString(strconv.Itoa(len(value)))
		m.w.WriteString(" noreply\r\n")
		m.w.WriteString(value)
		m.w.WriteString("\r\n")
	}
	for id := uint64(1); id <= uint64(keys); id++ {
		set(UserKey(id), version)
		set(InterestsKey(id), "+"+strconv.FormatUint(id%500+1, 10)+" +"+strconv.FormatUint((id+250)%500+1, 10)+" ")
		if counterMissEvery <= 0 || id%uint64(counterMissEvery) != 0 {
			set(CommentsKey(id), "1000")
		}
	}
	m.w.WriteString("version\r\n")
	if err := m.w.Flush(); err != nil {
		return fmt.Errorf("bench: seed memcached: %w", err)
	}
	line, err := m.r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "VERSION") {
		return fmt.Errorf("bench: seed memcached: reply %q: %v", line, err)
	}
	return nil
}

// SegmentsIn sums data_segs_in (TCP segments carrying data, as `ss -ti`
// reports them) over memcached's established connections: the requests
// clients flushed to memcached, one segment per write of up to one MSS.
// It approximates network round trips where the command counters cannot
// (a pipelined client sends many commands per write). It needs the ss
// command (iproute2); conns is the number of connections summed.
func (m *Memcached) SegmentsIn() (segs uint64, conns int, err error) {
	_, port, _ := net.SplitHostPort(m.Addr)
	out, err := exec.Command("ss", "-tinH", "state", "established", "( sport = :"+port+" )").Output()
	if err != nil {
		return 0, 0, fmt.Errorf("bench: ss: %w", err)
	}
	return ParseSegmentsIn(string(out))
}

// ParseSegmentsIn sums the data_segs_in fields of `ss -tin` output and
// counts the connections that carry one.
func ParseSegmentsIn(out string) (segs uint64, conns int, err error) {
	for _, f := range strings.Fields(out) {
		v, ok := strings.CutPrefix(f, "data_segs_in:")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: ss: bad field %q", f)
		}
		segs += n
		conns++
	}
	return segs, conns, nil
}
