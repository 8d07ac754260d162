package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cachewarden/cachewarden/config"
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
	cfg, err := loadConfigFlag(fs, args, stderr)
	if err != nil {
		return err
	}
	log := a.configLogger(cfg.Log, stderr)
	log.Info("config loaded", "config", cfg, "rule_count", len(cfg.RuleSet.Rules()))

	stack, err := consumer.NewStack(cfg, log, consumer.StackOptions{})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer stack.Close()
	daemon, err := stack.NewDaemon(stack.DaemonConfig())
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}

	runErr := serveWhileRunning(ctx, daemon, stack.HTTPHandler(daemon.NotReady), cfg.HTTP.Listen, log,
		func(addr string) { log.Info("serving /metrics, /healthz and /readyz", "addr", addr) })
	if runErr != nil {
		return fmt.Errorf("run: %w", runErr)
	}
	log.Info("stopped")
	return nil
}

// loadConfigFlag parses the -c/--config flag of a command that takes only
// a config file, and loads it. A config with problems is printed to
// stderr, every problem one "file:line:col: message" line (errReported).
func loadConfigFlag(fs *flag.FlagSet, args []string, stderr io.Writer) (*config.Config, error) {
	var path string
	fs.StringVar(&path, "c", "", "config file (required)")
	fs.StringVar(&path, "config", "", "same as -c")
	if err := fs.Parse(args); err != nil {
		return nil, flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, usageErrorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	if path == "" {
		fs.Usage()
		return nil, usageErrorf("%s: -c FILE is required", fs.Name())
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, errReported
	}
	return cfg, nil
}

// serveWhileRunning serves handler on listen while daemon runs, then
// shuts the server down (in-flight scrapes get httpShutdownTimeout) and
// returns what Run returned. listening is told the address once the
// server listens.
func serveWhileRunning(ctx context.Context, daemon *consumer.Daemon, handler http.Handler, listen string, log *slog.Logger, listening func(addr string)) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	listening(ln.Addr().String())

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
