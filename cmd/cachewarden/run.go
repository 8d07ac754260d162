package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	var path string
	fs.StringVar(&path, "c", "", "config file (required)")
	fs.StringVar(&path, "config", "", "same as -c")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("run: unexpected argument %q", fs.Arg(0))
	}
	if path == "" {
		fs.Usage()
		return usageErrorf("run: -c FILE is required")
	}
	cfg, err := config.Load(path)
	if err != nil {
		// Every problem, one "file:line:col: message" per line.
		fmt.Fprintln(stderr, err)
		return errReported
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

	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("run: http.listen: %w", err)
	}
	srv := &http.Server{
		Handler:           stack.HTTPHandler(daemon.NotReady),
		ReadHeaderTimeout: 5 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())

	runErr := daemon.Run(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("http server shutdown", "error", err.Error())
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("http server failed", "error", err.Error())
	}
	if runErr != nil {
		return fmt.Errorf("run: %w", runErr)
	}
	log.Info("stopped")
	return nil
}
