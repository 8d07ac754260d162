package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cachewarden/cachewarden/consumer"
)

// httpShutdownTimeout bounds how long in-flight scrapes may finish at exit.
const httpShutdownTimeout = 5 * time.Second

// runCmd implements `run`: the daemon.
func (a *app) runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run",
		"run -c FILE",
		"Runs the daemon: consumes the configured CDC topics as a member of the\n"+
			"consumer group, applies the rules' cache operations to memcached, and\n"+
			"serves /metrics, /healthz and /readyz on http.listen. SIGINT or SIGTERM\n"+
			"stops it gracefully (exit status 0). The config's log section sets the\n"+
			"log format and level; the global --log-format and --log-level, when\n"+
			"given, override it.",
		stderr)
	cfg, err := parseConfigOnly(fs, "run", args, stderr)
	if err != nil {
		return err
	}
	log := a.configLogger(cfg.Log, stderr)
	build := binaryBuild()
	log.Info("starting", "version", build.Version, "revision", build.Revision, "go_version", build.GoVersion)
	log.Info("config loaded", "config", cfg, "rule_count", len(cfg.RuleSet.Rules()))

	stack, err := consumer.NewStack(cfg, log, consumer.StackOptions{Build: build})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer stack.Close()
	daemon, err := stack.NewDaemon(stack.DaemonConfig())
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}

	err = serveWhileRunning(ctx, daemon, cfg.HTTP.Listen, stack.HTTPHandler(daemon.NotReady), log, func(addr net.Addr) {
		log.Info("serving /metrics, /healthz and /readyz", "addr", addr.String())
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	log.Info("stopped")
	return nil
}

// serveWhileRunning serves handler on listen while daemon runs, then shuts
// the server down, giving requests in flight httpShutdownTimeout. started
// is called once the server listens. The error is the listener's or the
// daemon's; a failing server is logged.
func serveWhileRunning(ctx context.Context, daemon *consumer.Daemon, listen string, handler http.Handler, log *slog.Logger, started func(net.Addr)) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	started(ln.Addr())

	runErr := daemon.Run(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("http server shutdown", "error", err.Error())
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("http server failed", "error", err.Error())
	}
	return runErr
}
