package doctor

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/config"
)

// maxReplyLine bounds a memcached reply line the doctor reads.
const maxReplyLine = 1024

// checkMemcached connects to every server as the daemon does (TLS
// included) and asks `version` and, when memcached.protocol is "meta",
// `mn` (the meta no-op, which a server without the meta protocol answers
// with an error).
func checkMemcached(ctx context.Context, cfg *config.Config, rep *Report) {
	const area = "memcached"
	dial, err := cfg.Memcached.Dialer()
	if err != nil {
		rep.add(area, "memcached", Fail, "%v", err)
		return
	}
	for _, server := range cfg.Memcached.Servers {
		version, meta, err := askServer(ctx, dial, server, cfg.Memcached.Timeout)
		switch {
		case err != nil:
			rep.add(area, server, Fail, "%v", err)
		case cfg.Memcached.Protocol == config.ProtocolMeta && !meta:
			rep.add(area, server, Fail, "memcached %s does not answer the meta protocol (mn): use memcached 1.6 or later, or memcached.protocol: text", version)
		default:
			rep.add(area, server, OK, "memcached %s, %s protocol", version, cfg.Memcached.Protocol)
		}
	}
}

// askServer sends `version` then `mn` on one connection and reads their
// answers, each line bounded, the whole exchange within timeout (or
// DefaultTimeout when 0).
func askServer(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), server string, timeout time.Duration) (version string, meta bool, err error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dial(ctx, "tcp", server)
	if err != nil {
		return "", false, fmt.Errorf("unreachable: %w", err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("version\r\nmn\r\n")); err != nil {
		return "", false, fmt.Errorf("write: %w", err)
	}
	r := bufio.NewReaderSize(conn, maxReplyLine)
	line, err := readLine(r)
	if err != nil {
		return "", false, fmt.Errorf("version: %w", err)
	}
	version, ok := strings.CutPrefix(line, "VERSION ")
	if !ok {
		return "", false, fmt.Errorf("version: memcached answered %q", line)
	}
	line, err = readLine(r)
	if err != nil {
		return version, false, fmt.Errorf("mn: %w", err)
	}
	return version, line == "MN", nil
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(line), "\r\n"), nil
}
