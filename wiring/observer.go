package wiring

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/observer"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// newObserver builds the stack's consistency observer from the config's
// observer section: it reads memcached through the daemon's client (so
// with its distribution) and MySQL through the stack's pool. detached is
// set for `cachewarden observe`.
func newObserver(s *Stack, sel observer.Locator, detached bool) (*observer.Observer, error) {
	c := s.Config.Observer
	deps := observer.Deps{Cache: s.Memcache, Servers: sel, Registerer: s.Registry, Logger: s.Logger.With("component", "observer"), Member: instanceName(),
		// One consumer group per memcached pool (docs/operations.md,
		// "Several memcached pools"): the writers' group (or binlog.name) names the pool.
		Pool: s.Config.DeploymentName()}
	if s.MySQL != nil {
		deps.Truth = s.MySQL
	}
	o, err := observer.New(observer.Config{
		Sample:             c.Sample,
		MaxPerSecond:       c.MaxPerSecond,
		Windows:            c.Windows,
		ConfirmAfter:       c.ConfirmAfter,
		MySQLPerSecond:     c.MySQLQueriesPerSecond,
		MemcachedPerSecond: c.MemcachedReadsPerSecond,
		MaxPending:         c.MaxPending,
		ClockSkew:          c.ClockSkew,
		ReportEvery:        c.ReportEvery,
		Detached:           detached,
	}, deps)
	if err != nil {
		return nil, fmt.Errorf("wiring: %w", err)
	}
	return o, nil
}

// instanceName names this daemon instance in the observer's reports:
// the host name and process id.
func instanceName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// observeOnly is the applier of `cachewarden observe`: it writes nothing
// and reports every op as done, so that the observer checks what another
// daemon applies.
type observeOnly struct{}

func (observeOnly) Apply(_ context.Context, ops []rules.Op, results []cacheops.Result) error {
	for i := range ops {
		results[i] = cacheops.Result{Outcome: cacheops.OutcomeMissing}
	}
	return nil
}

// droppingApplier loses the ops drop selects, reporting them applied, as
// an invalidation lost between the daemon and memcached would be
// (StackOptions.DropOps).
type droppingApplier struct {
	pipeline.Applier
	drop func(*rules.Op) bool
}

func (d droppingApplier) Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error {
	var keep []rules.Op
	var at []int
	for i := range ops {
		if d.drop(&ops[i]) {
			results[i] = cacheops.Result{Outcome: cacheops.OutcomeIncr}
			continue
		}
		keep = append(keep, ops[i])
		at = append(at, i)
	}
	if len(keep) == len(ops) {
		return d.Applier.Apply(ctx, ops, results)
	}
	res := make([]cacheops.Result, len(keep))
	err := d.Applier.Apply(ctx, keep, res)
	for j, i := range at {
		results[i] = res[j]
	}
	return err
}
