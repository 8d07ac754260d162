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

// observeCmd implements `observe`: the consistency observer in a process
// of its own.
func (a *app) observeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("observe",
		"observe -c FILE",
		"Runs the consistency observer beside the daemons, without writing to\n"+
			"memcached: consumes the configured CDC topics in a consumer group of\n"+
			"its own (observer.group, default kafka.group followed by \"-observer\"),\n"+
			"samples the planned changes as the observer section says, and checks\n"+
			"their items after each window through the config's memcached\n"+
			"distribution (docs/operations.md, \"The consistency observer\").\n"+
			"Serves /metrics and /status on http.listen. SIGINT or SIGTERM stops it.",
		stderr)
	var path string
	fs.StringVar(&path, "c", "", "config file (required)")
	fs.StringVar(&path, "config", "", "same as -c")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("observe: unexpected argument %q", fs.Arg(0))
	}
	if path == "" {
		fs.Usage()
		return usageErrorf("observe: -c FILE is required")
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	log := cfg.Log.NewLogger(stderr)
	stack, err := consumer.NewStack(cfg, log, consumer.StackOptions{ObserveOnly: true})
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	defer stack.Close()
	dc := stack.DaemonConfig()
	dc.Group = cfg.ObserverGroup()
	// Checks start from the changes published from now on.
	dc.StartOffset = consumer.StartLatest
	daemon, err := stack.NewDaemon(dc)
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("observe: http.listen: %w", err)
	}
	srv := &http.Server{Handler: stack.HTTPHandler(daemon.NotReady), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("observing", "group", dc.Group, "sample", stack.Observer.Config().Sample,
		"windows", fmt.Sprint(stack.Observer.Config().Windows), "addr", ln.Addr().String())

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
		return fmt.Errorf("observe: %w", runErr)
	}
	return nil
}
