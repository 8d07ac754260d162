package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/cachewarden/cachewarden/inspect"
	"github.com/cachewarden/cachewarden/rules"
)

// invalidateHelp is the description `cachewarden invalidate -h` prints.
const invalidateHelp = `Invalidates by hand, in the pool of each config given (one daemon config per
pool), through the daemon's own writer (memcached.protocol) and distribution:
  --rule NAME COLUMN=VALUE...  one entity of a rule: bump its namespace (every
      copy, keys of earlier releases, its evidence bit), or delete its set or
      counter (under the table's current generation); readers reload them.
  --table DB.TABLE  everything cached of a table, as the daemon does for a lost
      change: bump the fallback namespace of its rules and the generation of
      its sets and counters. TABLE alone means the table in any database.
Prints one line per op (pool, server, op, key, result) and logs each. Exit
status 1 when an op failed, naming its servers.`

// invalidateCmd implements `invalidate`: bump a namespace, delete a set
// or counter, or bump a table's fallback namespaces and generation, by
// hand, in every pool given.
func (a *app) invalidateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("invalidate", "invalidate -c FILE [-c FILE]... (--rule NAME COLUMN=VALUE... | --table DB.TABLE) [--dry-run] [--json]", invalidateHelp, stderr)
	paths := poolConfigFlag(fs)
	ruleName := fs.String("rule", "", "the rule whose entity to invalidate")
	table := fs.String("table", "", "the table to invalidate as a whole (db.table, or table)")
	dryRun := fs.Bool("dry-run", false, "print what would be done, send nothing")
	asJSON := fs.Bool("json", false, "print the ops as JSON")
	entity, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkInvalidateArgs(fs, *paths, *ruleName, *table, entity); err != nil {
		return err
	}
	pools, log, closeAll, err := a.openPools(*paths, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	opsOf, err := planInvalidation(ctx, pools, *ruleName, *table, entity)
	if err != nil {
		return err
	}
	var acts []inspect.Action
	for i, p := range pools {
		if len(opsOf[i]) == 0 {
			// A count rule whose table's generation is missing.
			log.Info("nothing to invalidate by hand: no counter of the rule is valid, its table's generation is missing", "pool", p.Name, "rule", *ruleName)
			fmt.Fprintf(stderr, "%s: nothing to invalidate: no counter of rule %q is valid (its table's generation item is missing)\n", p.Name, *ruleName)
			continue
		}
		acts = append(acts, p.Apply(ctx, opsOf[i], *dryRun, log)...)
	}
	if err := writeActions(stdout, acts, *asJSON); err != nil {
		return fmt.Errorf("invalidate: write: %w", err)
	}
	if failed := inspect.FailedServers(acts); len(failed) > 0 {
		return fmt.Errorf("invalidate: ops failed on %s (see the lines above)", strings.Join(failed, ", "))
	}
	return nil
}

// checkInvalidateArgs reports the command-line mistakes of invalidate:
// both or neither of --rule and --table, no -c, arguments with --table, or
// an entity --rule cannot use.
func checkInvalidateArgs(fs *flag.FlagSet, paths []string, ruleName, table string, entity []string) error {
	switch {
	case ruleName != "" && table != "":
		fs.Usage()
		return usageErrorf("invalidate: give --rule or --table, not both")
	case table != "":
		if len(paths) == 0 {
			fs.Usage()
			return usageErrorf("invalidate: -c FILE is required")
		}
		if len(entity) > 0 {
			fs.Usage()
			return usageErrorf("invalidate: unexpected argument %q with --table", entity[0])
		}
	case ruleName == "":
		fs.Usage()
		return usageErrorf("invalidate: give --rule NAME COLUMN=VALUE... or --table DB.TABLE")
	default:
		return checkEntityArgs(fs, "invalidate", paths, ruleName, entity)
	}
	return nil
}

// planInvalidation builds every pool's ops (of table when given, else of
// the rule's entity) before any is sent, so that a mistake (a rule or
// table a pool's config lacks) changes nothing.
func planInvalidation(ctx context.Context, pools []*inspect.Pool, ruleName, table string, entity []string) ([][]rules.Op, error) {
	opsOf := make([][]rules.Op, len(pools))
	for i, p := range pools {
		var err error
		if table != "" {
			opsOf[i], err = p.TableOps(table)
		} else {
			opsOf[i], err = p.EntityOps(ctx, ruleName, entity)
		}
		if err != nil {
			return nil, fmt.Errorf("invalidate: %w", err)
		}
	}
	return opsOf, nil
}

// writeActions writes acts to w: indented JSON, or one line each.
func writeActions(w io.Writer, acts []inspect.Action, asJSON bool) error {
	if !asJSON {
		return inspect.WriteActions(w, acts)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(acts)
}
