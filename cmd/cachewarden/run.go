package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cachewarden/cachewarden/check"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/wiring"
)

// httpShutdownTimeout bounds how long in-flight scrapes may finish at exit.
const httpShutdownTimeout = 5 * time.Second

// collationCheckTimeout bounds the check of the rules' collations at
// start (connecting included).
const collationCheckTimeout = 10 * time.Second

// checkCollations refuses rules whose key, member or args columns have a
// collation that folds (check.Folding), printing each as check does, one
// "file:line:col: error: message" per line. A server that cannot be
// reached within collationCheckTimeout is logged and the daemon starts,
// as it does when MySQL is down: `cachewarden check --dsn` checks the
// same. It returns nil when ctx ends meanwhile.
func checkCollations(ctx context.Context, cfg *config.Config, log *slog.Logger, stderr io.Writer) error {
	refused, err := foldingErrors(ctx, cfg, cfg.RuleSet, log)
	if ctx.Err() != nil {
		return nil // stopped before starting; runCmd returns
	}
	if refused != "" {
		fmt.Fprintln(stderr, refused)
		fmt.Fprintln(stderr, "run: "+refusedFolding)
		return errConfigReported
	}
	if err != nil {
		log.Warn("collations of key columns not checked (cachewarden check --dsn checks them)", "error", err.Error())
	}
	return nil
}

// refusedFolding says why rules with folding key columns are refused.
const refusedFolding = "refusing rules whose keys fold values the database finds equal (docs/rules.md, \"Collations\")"

// foldingErrors checks the collations of rs's key, member and args
// columns (check.Folding) within collationCheckTimeout and returns the
// findings that refuse the rules, one "file:line:col: error: message" a
// line ("" when none), and why the check could not run (then the rules
// are not refused: `check --dsn` checks the same).
func foldingErrors(ctx context.Context, cfg *config.Config, rs *rules.RuleSet, log *slog.Logger) (string, error) {
	if cfg.MySQL.DSN == "" {
		log.Info("collations of key columns not checked: no mysql.dsn (cachewarden check --dsn checks them)")
		return "", nil
	}
	cctx, cancel := context.WithTimeout(ctx, collationCheckTimeout)
	defer cancel()
	fs, err := check.Folding(cctx, cfg.MySQL.DSN, rs, log)
	var refused []string
	for _, f := range fs {
		if f.Severity == check.Error {
			refused = append(refused, f.String())
		}
	}
	return strings.Join(refused, "\n"), err
}

// reloadOnSignal reloads the rules (Stack.ReloadRules) on each signal of
// sig until ctx ends: checked as at start, collations included, and kept
// as they were on any error. Each reload is logged once.
func reloadOnSignal(ctx context.Context, sig <-chan os.Signal, cfg *config.Config, stack *wiring.Stack, log *slog.Logger) {
	digest := cfg.RulesDigest
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		rs, next, err := stack.ReloadRules(func(rs *rules.RuleSet) error {
			refused, err := foldingErrors(ctx, cfg, rs, log)
			if refused != "" {
				return fmt.Errorf("%s\n%s", refused, refusedFolding)
			}
			if err != nil {
				log.Warn("collations of the reloaded rules' key columns not checked (cachewarden check --dsn checks them)", "error", err.Error())
			}
			return nil
		})
		if err != nil {
			log.Error("rules not reloaded: the rules loaded before stay", "error", err.Error(), "digest", digest)
			continue
		}
		log.Info("rules reloaded", "rule_count", len(rs.Rules()), "digest", next, "previous_digest", digest)
		digest = next
	}
}

// runHelp is the description `cachewarden run -h` prints.
const runHelp = `Runs the daemon: consumes the configured CDC topics as a member of the
consumer group, applies the rules' cache operations to memcached, and
serves /metrics, /healthz and /readyz on http.listen. It refuses rules
whose key, member or args columns have a collation that folds case,
accents or trailing spaces (as check --dsn reports them), unless the
rule says collation: accept-folding. SIGHUP reloads the rule files
(checked first; on any error the rules stay as they were and the log
says why). SIGINT or SIGTERM
stops it gracefully (exit status 0). The config's log section sets the
log format and level; the global --log-format and --log-level, when
given, override it.`

// runCmd implements `run`: the daemon.
func (a *app) runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", "run -c FILE", runHelp, stderr)
	cfg, err := parseConfigOnly(fs, "run", args, stderr)
	if err != nil {
		return err
	}
	log := a.configLogger(cfg.Log, stderr)
	build := binaryBuild()
	log.Info("starting", "version", build.Version, "revision", build.Revision, "go_version", build.GoVersion)
	log.Info("config loaded", "config", cfg, "rule_count", len(cfg.RuleSet.Rules()), "rules_digest", cfg.RulesDigest)
	if err := checkCollations(ctx, cfg, log, stderr); err != nil || ctx.Err() != nil {
		return err // nil when stopped by a signal meanwhile, as below
	}

	stack, err := wiring.NewStack(cfg, log, wiring.StackOptions{Build: build})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer stack.Close()
	daemon, err := stack.NewSource()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	// SIGHUP reloads the rules; the reloads end before the stack closes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reloadCtx, stopReloads := context.WithCancel(ctx)
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		reloadOnSignal(reloadCtx, hup, cfg, stack, log)
	}()
	defer func() {
		signal.Stop(hup)
		stopReloads()
		<-reloaded
	}()

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
func serveWhileRunning(ctx context.Context, daemon wiring.Source, listen string, handler http.Handler, log *slog.Logger, started func(net.Addr)) error {
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
