package integration

import (
	"bufio"
	"context"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/wiring"
)

// The observer against faults injected from outside the project's code:
// a TCP proxy between the daemons and memcached that turns chosen bumps
// into increments by 0 (memcached answers as to a real one), and an
// outside writer that re-adds set members right after the daemon removed
// them.

// rewritingProxy forwards a memcached connection, parsing the client's
// commands (text and meta protocol): a bump (ma, incr) of a key lose
// selects is sent as an increment by 0, and each set token an append
// carries is passed to token (add: a "+member" token).
type rewritingProxy struct {
	ln     net.Listener
	target string
	lose   func(key string) bool
	token  func(key, member string, add bool)
	wg     sync.WaitGroup
}

func newRewritingProxy(t *testing.T, target string, lose func(string) bool, token func(key, member string, add bool)) *rewritingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rewritingProxy{ln: ln, target: target, lose: lose, token: token}
	p.wg.Go(p.accept)
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *rewritingProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Go(func() { io.Copy(c, s); c.Close() })
		p.wg.Go(func() { p.forward(c, s); s.Close() })
	}
}

// forward copies commands from c to s, rewriting them.
func (p *rewritingProxy) forward(c, s net.Conn) {
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriter(s)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		payload := -1
		appendTokens := false
		if len(f) >= 2 {
			switch f[0] {
			case "ma":
				if p.lose(f[1]) {
					delta := false
					for i := range f[2:] {
						if strings.HasPrefix(f[2+i], "D") {
							f[2+i], delta = "D0", true
						}
					}
					if !delta {
						f = append(f, "D0")
					}
					line = strings.Join(f, " ") + "\r\n"
				}
			case "incr":
				if len(f) >= 3 && p.lose(f[1]) {
					f[2] = "0"
					line = strings.Join(f, " ") + "\r\n"
				}
			case "ms":
				if len(f) >= 3 {
					payload, _ = strconv.Atoi(f[2])
					appendTokens = slices.Contains(f[3:], "MA")
				}
			case "set", "add", "replace", "append", "prepend", "cas":
				if len(f) >= 5 {
					payload, _ = strconv.Atoi(f[4])
					appendTokens = f[0] == "append"
				}
			}
		}
		if _, err := w.WriteString(line); err != nil {
			return
		}
		if payload >= 0 {
			data := make([]byte, payload+2)
			if _, err := io.ReadFull(r, data); err != nil {
				return
			}
			if _, err := w.Write(data); err != nil {
				return
			}
			if appendTokens {
				for _, tok := range itemformat.SetTokens(data[:payload]) {
					if len(tok) > 1 && (tok[0] == '-' || tok[0] == '+') {
						p.token(f[1], string(tok[1:]), tok[0] == '+')
					}
				}
			}
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// fault is one injected fault: its key, when it was injected, and the
// member an outside writer re-added ("" for a lost bump).
type fault struct {
	key    string
	member string
	at     time.Time
	// value is a namespace's value when its first bump was lost.
	value string
}

var timeAttr = regexp.MustCompile(`\btime=(\S+)`)

// TestObserverInjectedFaults: two daemons share a group, each with the
// observer (every change sampled, a 1s window, a 2s confirm_after),
// writing through a proxy that loses the bumps of chosen products by
// sending them as increments by 0, while an outside writer re-adds set
// members right after the daemons removed them. Every fault still
// visible in memcached once the round is over (a namespace whose every
// bump was lost, a set holding a member the daemons last removed) is
// reported, naming the key, the server, the pool (the daemons' group) and
// the evidence with the key's history; the median time
// to report is at most window + confirm_after.
func TestObserverInjectedFaults(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var mu sync.Mutex
	armed := false
	direct := memcache.New(s.Services.Memcached)
	lost := map[string]*fault{}    // namespace key -> its first lost bump
	readded := map[string]*fault{} // set key -> the member re-added
	// last is the daemons' latest token per set key and member, as the
	// proxy saw it: true for an add.
	last := map[[2]string]bool{}
	lose := func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		if !armed || !strings.Contains(key, "ns:product:") {
			return false
		}
		if lost[key] == nil {
			if len(lost) >= 30 {
				return false
			}
			// The value the lost bump leaves: a namespace missing now is
			// created by the increment (a new namespace is correct).
			it, err := direct.Get(key)
			if err != nil {
				return false
			}
			lost[key] = &fault{key: key, at: time.Now(), value: string(it.Value)}
		}
		return true
	}
	outside := make(chan fault, 1024)
	token := func(key, member string, add bool) {
		mu.Lock()
		defer mu.Unlock()
		last[[2]string{key, member}] = add
		// Only the rules' sets: the delayed-bump journal (a token log at
		// a "%rebump:" key) is the daemon's own, not a set readers read.
		if strings.Contains(key, "%rebump:") {
			return
		}
		if !add && armed && readded[key] == nil && len(readded) < 30 {
			f := &fault{key: key, member: member}
			readded[key] = f
			outside <- *f
		}
	}
	proxy := newRewritingProxy(t, s.Services.Memcached, lose, token)
	// The outside writer: re-adds the member 20ms after the daemon's
	// removal passed the proxy, straight to memcached.
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		mc := memcache.New(s.Services.Memcached)
		for f := range outside {
			time.Sleep(20 * time.Millisecond)
			if err := mc.Append(&memcache.Item{Key: f.key, Value: []byte("+" + f.member + " ")}); err != nil {
				mu.Lock()
				delete(readded, f.key) // the set was gone: nothing faulted
				mu.Unlock()
				continue
			}
			mu.Lock()
			readded[f.key].at = time.Now()
			mu.Unlock()
		}
	}()

	cf := s.ConfigFile("")
	cf.Memcached.Servers = []string{proxy.ln.Addr().String()}
	obs := observerSection(time.Second)
	obs["confirm_after"] = "2s"
	cf.Observer = obs
	cfg, _ := loadConfig(t, cf)
	log, logs := observedLog(t)
	d1 := startObservedDaemon(t, cfg, log, wiring.StackOptions{}, nil)
	d2 := startObservedDaemon(t, cfg, log, wiring.StackOptions{}, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	s.Opts.WarmShare = 1
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	if _, err := s.Round(ctx, 400); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	armed = false
	mu.Unlock()
	close(outside)
	<-writerDone
	c1, c2 := settleObserver(t, d1.Stack.Observer), settleObserver(t, d2.Stack.Observer)
	t.Logf("daemon 1: %+v; daemon 2: %+v", c1, c2)

	// The faults still visible: judged ones must all be reported.
	keys, _ := logs.inconsistencies()
	var lines []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `msg="cache inconsistent with an applied change"`) {
			lines = append(lines, line)
		}
	}
	reportedAt := map[string]time.Time{}
	for _, line := range lines {
		k := keyAttr.FindStringSubmatch(line)
		tm := timeAttr.FindStringSubmatch(line)
		if k == nil || tm == nil {
			t.Errorf("a report without its key or time: %s", line)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, tm[1])
		if err != nil {
			t.Errorf("a report's time: %v: %s", err, line)
			continue
		}
		if key := unquoteAttr(k[1]); reportedAt[key].IsZero() || at.Before(reportedAt[key]) {
			reportedAt[key] = at
		}
		// The server is the one the daemons write to and read: the proxy.
		// The history holds at least the batch of the sampled change.
		for _, want := range []string{"server=" + proxy.ln.Addr().String(), "pool=" + s.Opts.Group + " ", "expected=", "seen=", "history="} {
			if !strings.Contains(line, want) {
				t.Errorf("the evidence lacks %q: %s", want, line)
			}
		}
		if strings.Contains(line, `history="none recorded"`) {
			t.Errorf("the evidence has no history of the key: %s", line)
		}
	}
	var visible []*fault
	mu.Lock()
	for k, f := range lost {
		if it, err := s.MC.Get(k); err == nil && string(it.Value) == f.value {
			visible = append(visible, f)
		}
	}
	for k, f := range readded {
		it, err := s.MC.Get(k)
		if err != nil || f.at.IsZero() || last[[2]string{k, f.member}] {
			continue // gone, or the daemons added the member since
		}
		if slices.Contains(itemformat.DecodeSet(it.Value).Members, f.member) {
			visible = append(visible, f)
		}
	}
	nLost, nReadded := len(lost), len(readded)
	mu.Unlock()
	var delays []time.Duration
	missed := 0
	for _, f := range visible {
		at, ok := reportedAt[f.key]
		if !ok {
			missed++
			t.Errorf("fault on %s (member %q) at %s not reported", f.key, f.member, f.at.Format(time.RFC3339Nano))
			continue
		}
		delays = append(delays, at.Sub(f.at))
	}
	t.Logf("faults: %d namespaces lost bumps, %d sets re-added; %d still visible, %d reported (%d keys reported in all)", nLost, nReadded, len(visible), len(visible)-missed, len(keys))
	if len(visible) < 10 {
		t.Fatalf("only %d faults visible: the test judges too few", len(visible))
	}
	if float64(missed) > 0.01*float64(len(visible)) {
		t.Errorf("%d of %d visible faults not reported", missed, len(visible))
	}
	for k := range keys {
		mu.Lock()
		_, a := lost[k]
		_, b := readded[k]
		mu.Unlock()
		if !a && !b {
			t.Errorf("reported %s, where no fault was injected", k)
		}
	}
	if len(delays) > 0 {
		slices.Sort(delays)
		median := delays[len(delays)/2]
		t.Logf("time to report: median %s, max %s", median.Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond))
		if limit := time.Second + 2*time.Second; median > limit {
			t.Errorf("median time to report %s, want at most window + confirm_after (%s)", median, limit)
		}
	}
}
