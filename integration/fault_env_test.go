package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.yaml.in/yaml/v3"
)

// The processes and network faults of the fault suite: a memcached of the
// suite's own (so that stopping or restarting it disturbs no other test), a
// loopback TCP proxy that cuts MariaDB off, and `cachewarden run` in child
// processes, so that SIGKILL and SIGTERM are real.

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// memcachedProc is a memcached of the test's own (testsvc.MemcachedServer),
// on a loopback port that survives restarts.
type memcachedProc struct {
	*testsvc.MemcachedServer
	addr string
}

// startMemcached starts a memcached of the test's own on a free loopback
// port (64 MB, default 1 MB item limit); it is killed when the test ends.
func startMemcached(t *testing.T) *memcachedProc {
	t.Helper()
	return startMemcachedWith(t)
}

// startMemcachedWith is startMemcached with extra memcached arguments.
func startMemcachedWith(t *testing.T, extra ...string) *memcachedProc {
	t.Helper()
	s := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{
		MemoryMB: 64, Threads: 2, Args: append([]string{"-c", "1024"}, extra...),
	})
	return &memcachedProc{MemcachedServer: s, addr: s.Addr}
}

// memcachedCommand sends one raw command and reads the reply up to the
// line that starts with end ("END", "OK", ...). It is only used with
// commands the test writes itself.
func memcachedCommand(addr, cmd, end string) ([]string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, cmd); err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, end) {
			return lines, nil
		}
		if strings.HasPrefix(line, "ERROR") || strings.HasPrefix(line, "CLIENT_ERROR") || strings.HasPrefix(line, "SERVER_ERROR") {
			return lines, fmt.Errorf("memcached %q: %s", strings.TrimSpace(cmd), line)
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return lines, err
	}
	return lines, io.ErrUnexpectedEOF
}

// memcachedStats returns the server's general statistics.
func memcachedStats(addr string) (map[string]int64, error) {
	lines, err := memcachedCommand(addr, "stats\r\n", "END")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "STAT" {
			if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				out[f[1]] = v
			}
		}
	}
	return out, nil
}

// memcachedKeys lists every key the server holds (lru_crawler metadump),
// decoded from the URI encoding memcached prints them in.
func memcachedKeys(addr string) ([]string, error) {
	lines, err := memcachedCommand(addr, "lru_crawler metadump all\r\n", "END")
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, l := range lines {
		enc, ok := strings.CutPrefix(l, "key=")
		if !ok {
			continue
		}
		enc, _, _ = strings.Cut(enc, " ")
		k, err := url.PathUnescape(enc)
		if err != nil {
			return nil, fmt.Errorf("metadump key %q: %w", enc, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// proxyMode is what faultProxy does with traffic.
type proxyMode int32

const (
	// proxyPass forwards connections to the target.
	proxyPass proxyMode = iota
	// proxyBlackhole accepts connections and drops every byte in both
	// directions, as a network partition does: clients wait for their
	// timeouts. Connections open when it starts are blackholed too.
	proxyBlackhole
	// proxyRefuse resets new connections at once and closes the open
	// ones, as a stopped server does.
	proxyRefuse
)

func (m proxyMode) String() string {
	return [...]string{"pass", "blackhole", "refuse"}[m]
}

// faultProxy is a loopback TCP proxy in front of a server, whose mode
// the test switches to cut the server off.
type faultProxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32

	mu    sync.Mutex
	conns map[*proxyConn]struct{}
	wg    sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	// dead is set once a byte was dropped: the stream can never be
	// forwarded again.
	dead atomic.Bool
}

func (c *proxyConn) close() {
	if tc, ok := c.client.(*net.TCPConn); ok {
		tc.SetLinger(0) // a reset, as from a server that went away
	}
	c.client.Close()
	if c.server != nil {
		c.server.Close()
	}
}

// startProxy listens on a free loopback port and forwards to target until
// the test ends.
func startProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll(func(*proxyConn) bool { return true })
		p.wg.Wait()
	})
	return p
}

// Retarget sends new connections to target and closes the open ones, as
// a virtual IP moved to another server in a failover does.
func (p *faultProxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.closeAll(func(*proxyConn) bool { return true })
}

// Addr returns the proxy's host:port.
func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

// SetMode switches the proxy. Refuse closes every open connection; going
// back to pass closes the connections that lost bytes while blackholed.
func (p *faultProxy) SetMode(m proxyMode) {
	p.mode.Store(int32(m))
	switch m {
	case proxyRefuse:
		p.closeAll(func(*proxyConn) bool { return true })
	case proxyPass:
		p.closeAll(func(c *proxyConn) bool { return c.dead.Load() || c.server == nil })
	}
}

func (p *faultProxy) closeAll(which func(*proxyConn) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if which(c) {
			c.close()
			delete(p.conns, c)
		}
	}
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		c := &proxyConn{client: client}
		switch proxyMode(p.mode.Load()) {
		case proxyRefuse:
			c.close()
			continue
		case proxyBlackhole:
			c.dead.Store(true)
		default:
			p.mu.Lock()
			target := p.target
			p.mu.Unlock()
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.close()
				continue
			}
			c.server = server
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c, c.client, c.server)
		if c.server != nil {
			p.wg.Add(1)
			go p.pipe(c, c.server, c.client)
		}
	}
}

// pipe copies src to dst while the proxy passes traffic; otherwise the
// bytes are dropped and the connection is dead for good.
func (p *faultProxy) pipe(c *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if proxyMode(p.mode.Load()) != proxyPass || c.dead.Load() || dst == nil {
				c.dead.Store(true)
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			c.close()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
			return
		}
	}
}

// The daemon binary, built once per test binary.
var daemonBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// cachewardenBinary builds ./cmd/cachewarden once for the whole test
// binary (TestMain removes it).
func cachewardenBinary(t *testing.T) string {
	t.Helper()
	daemonBinary.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if daemonBinary.dir, daemonBinary.err = os.MkdirTemp("", "cachewarden-fault-"); daemonBinary.err != nil {
			return
		}
		daemonBinary.path = filepath.Join(daemonBinary.dir, "cachewarden")
		cmd := exec.Command(goTool, "build", "-o", daemonBinary.path, "./cmd/cachewarden")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			daemonBinary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if daemonBinary.err != nil {
		t.Fatal(daemonBinary.err)
	}
	return daemonBinary.path
}

// removeDaemonBinary deletes the built binary.
func removeDaemonBinary() {
	if daemonBinary.dir != "" {
		os.RemoveAll(daemonBinary.dir)
	}
}

// writeFaultConfig writes a daemon config: the scenario's ConfigFile with
// settings that type does not hold (dotted paths such as
// "kafka.client_id") laid over it.
func writeFaultConfig(t *testing.T, path string, c ConfigFile, extra map[string]any) {
	t.Helper()
	data, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		m := doc
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = v
	}
	if data, err = yaml.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// faultDaemon is one `cachewarden run` process of a scenario.
type faultDaemon struct {
	*daemonProcess
	// ClientID is the Kafka client ID the process uses; the suite finds
	// its group member by it.
	ClientID string
	Config   string
}

var httpAddrRE = regexp.MustCompile(`serving /metrics.* addr=(127\.0\.0\.1:[0-9]+)`)

// httpAddr waits for the daemon to log its HTTP address.
func (d *faultDaemon) httpAddr(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := httpAddrRE.FindStringSubmatch(d.stderr.String()); m != nil {
			return m[1]
		}
		if d.exited() || time.Now().After(deadline) {
			t.Fatalf("daemon %s did not log its HTTP address; stderr:\n%s", d.ClientID, d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited reports whether the process has ended.
func (d *faultDaemon) exited() bool {
	select {
	case err := <-d.done:
		d.done <- err // keep it for whoever waits next
		return true
	default:
		return false
	}
}

// sigkill kills the process with SIGKILL and waits for it.
func (d *faultDaemon) sigkill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill daemon %s: %v", d.ClientID, err)
	}
	err := <-d.done
	d.done <- err
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("daemon %s: %v, want death by SIGKILL; stderr:\n%s", d.ClientID, err, d.stderr)
	}
}

// httpGet returns the status and body of a daemon URL path.
func (d *faultDaemon) httpGet(addr, path string) (int, string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric sums the samples of one metric family in the daemon's /metrics
// (label filter: every sample whose line contains match).
func (d *faultDaemon) metric(addr, name, match string) (float64, error) {
	status, body, err := d.httpGet(addr, "/metrics")
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("/metrics: status %d", status)
	}
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		if match != "" && !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// expireMembers removes the group members that the named Kafka clients
// left behind when they were killed, as the broker does once their session
// timeout passes, and returns how many it removed.
func expireMembers(ctx context.Context, b *Broker, group string, clientIDs ...string) (int, error) {
	dead := map[string]bool{}
	for _, id := range clientIDs {
		dead[id] = true
	}
	// kafka-go cannot decode the member metadata of cooperative members:
	// ask with franz-go.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return 0, fmt.Errorf("describe group %s: %w", group, err)
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	for _, m := range described[group].Members {
		if dead[m.ClientID] {
			lm := kmsg.NewLeaveGroupRequestMember()
			lm.MemberID = m.MemberID
			req.Members = append(req.Members, lm)
		}
	}
	if len(req.Members) == 0 {
		return 0, nil
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("expire members of %s: %w", group, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		return 0, fmt.Errorf("expire members of %s: %w", group, err)
	}
	return len(req.Members), nil
}
