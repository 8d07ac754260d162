package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/cachewarden/cachewarden/inspect"
	"github.com/cachewarden/cachewarden/wiring"
)

// keyHelp is the description `cachewarden key -h` prints.
const keyHelp = `Shows what memcached holds for one entity of a rule, in the pool of each
config given (one daemon config per pool): each key as the daemon builds it
(hashed long keys, hot-key copies, keys of earlier releases, counters under
their table's generation), the server the configured distribution picks, the
raw item (escaped, at most 256 bytes) and its meaning: the namespace version
(and evidence master), the set's members, the counter's value and fence, the
generation. A missing item is a valid state: readers recompute it. For a set
or count rule with a query and a config with mysql.dsn, it runs the query
(the entity's values bound as parameters) and says whether memcached agrees.
COLUMN=VALUE gives each column of the rule's key (and of its query's args).
It only reads. Exit status 1 when a pool cannot be read or queried.`

// keyCmd implements `key`: one entity's items in every pool, what they
// mean, and what MySQL says.
func (a *app) keyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("key", "key -c FILE [-c FILE]... --rule NAME [--json] COLUMN=VALUE...", keyHelp, stderr)
	paths := poolConfigFlag(fs)
	ruleName := fs.String("rule", "", "the rule whose entity to show (required)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	entity, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkEntityArgs(fs, "key", *paths, *ruleName, entity); err != nil {
		return err
	}
	pools, _, closeAll, err := a.openPools(*paths, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	rep, err := inspect.Key(ctx, pools, *ruleName, entity)
	if err != nil {
		return usageErrorf("key: %v", err)
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("key: write report: %w", err)
	}
	if rep.Failed() {
		return errReported
	}
	return nil
}

// poolConfigFlag adds the repeatable -c and its long form --config to
// fs: the daemon configs of key and invalidate, one per memcached pool.
func poolConfigFlag(fs *flag.FlagSet) *stringList {
	var paths stringList
	fs.Var(&paths, "c", "daemon config file, one per memcached pool (repeatable; at least one)")
	fs.Var(&paths, "config", "same as -c")
	return &paths
}

// parseInterspersed parses fs's flags wherever they stand among the
// positional arguments, which it returns in order ("--" ends the flags).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagError(err)
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// checkEntityArgs reports the command-line mistakes of key and
// invalidate --rule: no config, no rule, no entity.
func checkEntityArgs(fs *flag.FlagSet, command string, paths []string, rule string, entity []string) error {
	switch {
	case len(paths) == 0:
		fs.Usage()
		return usageErrorf("%s: -c FILE is required", command)
	case rule == "":
		fs.Usage()
		return usageErrorf("%s: --rule NAME is required", command)
	case len(entity) == 0:
		fs.Usage()
		return usageErrorf("%s: give the entity as COLUMN=VALUE (the columns of rule %q's key)", command, rule)
	}
	return nil
}

// openPools loads each config and builds its daemon stack (memcached
// client and selector, the Applier on the configured protocol, MySQL when
// the config has a DSN), as `run` does, without connecting. The logger
// follows the first config's log section (and the global log flags).
// closeAll releases every stack.
func (a *app) openPools(paths []string, stderr io.Writer) (pools []*inspect.Pool, log *slog.Logger, closeAll func(), err error) {
	var stacks []*wiring.Stack
	closeAll = func() {
		for _, s := range stacks {
			s.Close()
		}
	}
	for _, path := range paths {
		cfg, err := loadConfig(path, stderr)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		if log == nil {
			log = a.configLogger(cfg.Log, stderr)
		}
		s, err := wiring.NewStack(cfg, log, wiring.StackOptions{NoDLQ: true, MemoryRebumps: true, Build: binaryBuild()})
		if err != nil {
			closeAll()
			return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		stacks = append(stacks, s)
		sel, err := cfg.Memcached.Selector()
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		p := &inspect.Pool{Name: path, Rules: cfg.RuleSet, Servers: sel, Cache: s.Memcache, Applier: s.Applier}
		if s.MySQL != nil {
			p.Truth = s.MySQL
		}
		pools = append(pools, p)
	}
	return pools, log, closeAll, nil
}
