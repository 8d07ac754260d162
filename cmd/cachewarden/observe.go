package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/cachewarden/cachewarden/wiring"
)

// observeHelp is the description `cachewarden observe -h` prints.
const observeHelp = `Runs the consistency observer beside the daemons, without writing to
memcached: consumes the configured CDC topics in a consumer group of
its own (observer.group, default kafka.group followed by "-observer"),
samples the planned changes as the observer section says, and checks
their items after each window through the config's memcached
distribution (docs/operations.md, "The consistency observer").
Serves /metrics and /status on http.listen. SIGINT or SIGTERM stops it.`

// observeCmd implements `observe`: the consistency observer in a process
// of its own.
func (a *app) observeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("observe", "observe -c FILE", observeHelp, stderr)
	cfg, err := parseConfigOnly(fs, "observe", args, stderr)
	if err != nil {
		return err
	}
	if cfg.Source == config.SourceBinlog {
		return fmt.Errorf("observe: %s: source is binlog, and `cachewarden observe` follows Kafka topics as a consumer group of its own; "+
			"with the binary log source turn the observer on in the daemon instead (observer.enabled: true)", cfg.File)
	}
	log := a.configLogger(cfg.Log, stderr)
	stack, err := wiring.NewStack(cfg, log, wiring.StackOptions{ObserveOnly: true, Build: binaryBuild()})
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	defer stack.Close()
	dc := stack.DaemonConfig()
	dc.Group = cfg.ObserverGroup()
	// Checks start from the changes published from now on.
	dc.StartOffset = kafka.StartLatest
	daemon, err := stack.NewDaemon(dc)
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	err = serveWhileRunning(ctx, daemon, cfg.HTTP.Listen, stack.HTTPHandler(daemon.NotReady), log, func(addr net.Addr) {
		log.Info("observing", "group", dc.Group, "sample", stack.Observer.Config().Sample,
			"windows", fmt.Sprint(stack.Observer.Config().Windows), "addr", addr.String())
	})
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	return nil
}
