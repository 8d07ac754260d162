package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/config"
)

// probeHelp is the description `cachewarden probe -h` prints.
const probeHelp = `Asks a running daemon's HTTP endpoint (by default /readyz) and exits 0
when it answers 200, 1 otherwise, printing the answer. The address is
http.listen of the config FILE (after environment expansion), else
--addr; an address that listens on every interface (":9464",
"0.0.0.0:9464") is asked on loopback.`

// probeCmd implements `probe`: asks a running daemon's /readyz (or
// another of its endpoints) and exits 0 only on 200, for images without a
// shell or an HTTP client (a container HEALTHCHECK).
func (a *app) probeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("probe", "probe [-c FILE | --addr HOST:PORT] [--path /readyz] [--timeout 2s]", probeHelp, stderr)
	path := fs.String("c", "", "config file whose http.listen to ask (optional)")
	fs.StringVar(path, "config", "", "same as -c")
	addr := fs.String("addr", config.DefaultHTTPListen, "the daemon's http.listen, when no -c is given")
	endpoint := fs.String("path", "/readyz", "the endpoint to ask: /readyz, /healthz or /version")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	if err := parseFlags(fs, "probe", args); err != nil {
		return err
	}
	if !strings.HasPrefix(*endpoint, "/") || *timeout <= 0 {
		return usageErrorf("probe: --path must start with / and --timeout be positive")
	}
	listen := *addr
	if *path != "" {
		data, err := os.ReadFile(*path)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		cfg, err := config.Parse(*path, data, os.LookupEnv)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return errReported
		}
		listen = cfg.HTTP.Listen
	}
	target, err := probeTarget(listen)
	if err != nil {
		return usageErrorf("probe: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target+*endpoint, nil)
	if err != nil {
		return usageErrorf("probe: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %s%s: %w", target, *endpoint, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "%s%s: %s\n%s", target, *endpoint, resp.Status, body)
		return errReported
	}
	_, err = stdout.Write(body)
	return err
}

// probeTarget is the address to ask for a daemon listening on listen: an
// unspecified host (all interfaces) becomes loopback.
func probeTarget(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("address %q: %v", listen, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}
