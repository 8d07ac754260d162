package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/cachewarden/cachewarden/check"
)

// checkHelp is the description `cachewarden check -h` prints; %v is
// check.DefaultConnectTimeout.
const checkHelp = `Loads the config and the rule files it names, runs the rule tests (by
default the *.yaml files in the tests/ directory of each rule directory),
and, with --dsn, checks the rules against the live schema: tables and
columns exist, key and when columns have usable types, load and recount
queries prepare with the right number of parameters, return what the
daemon reads (a load of the member's column, a recount of one COUNT, a
keys query of the key's columns in order) and use an index,
key, member and args columns compare bytes exactly (a collation that
folds case, accents or trailing spaces is an error unless the rule says
collation: accept-folding); it reports key templates that can exceed
250 bytes (they are hashed).
Prints one line per problem, file:line:col: severity: message, then a
summary. Exit status: 1 when there is an error (or, with
--warnings-as-errors, a warning), 2 on a command-line mistake, else 0.
--config-dsn checks against the config's mysql.dsn, whose password may
come from the environment (${NAME}) rather than the command line.
Connecting waits at most %v (unless the DSN sets timeout= or readTimeout=)
and names an address that sends no MySQL handshake as such.`

// checkCmd implements `check`: config, rules, rule tests and, with a DSN,
// the rules against the live schema (package check).
func (a *app) checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check", "check -c FILE [--dsn DSN | --config-dsn] [--tests PATH]... [--format text|json] [--warnings-as-errors]", fmt.Sprintf(checkHelp, check.DefaultConnectTimeout), stderr)
	var dsn, format string
	var tests, databases stringList
	path := configFlag(fs)
	fs.StringVar(&dsn, "dsn", "", "go-sql-driver/mysql DSN of the database the rules query; left out: no schema check (an empty one is an error)")
	fs.Var(&tests, "tests", "rule test file or directory (repeatable); default: tests/ beside each rule directory")
	fs.Var(&databases, "database", "NAME=SCHEMA: look up tables of rules' database NAME in SCHEMA (repeatable)")
	fs.StringVar(&format, "format", "text", "output format: text or json")
	configDSN := fs.Bool("config-dsn", false, "check against the config's mysql.dsn")
	warnFail := fs.Bool("warnings-as-errors", false, "exit with status 1 on warnings too")
	timeout := fs.Duration("timeout", check.DefaultTimeout,
		fmt.Sprintf("bound on the whole schema check (connecting alone: %v, or the DSN's timeout= and readTimeout=)", check.DefaultConnectTimeout))
	if err := parseConfigFlags(fs, "check", args, path); err != nil {
		return err
	}
	dsnGiven := false
	fs.Visit(func(f *flag.Flag) { dsnGiven = dsnGiven || f.Name == "dsn" })
	switch {
	case dsnGiven && dsn == "":
		return usageErrorf("check: --dsn is empty (an unset variable?): give a DSN, or leave --dsn out to check without the schema")
	case dsn != "" && *configDSN:
		return usageErrorf("check: give --dsn or --config-dsn, not both")
	case format != "text" && format != "json":
		return usageErrorf("check: --format %q: want text or json", format)
	}
	opts := check.Options{Config: *path, DSN: dsn, ConfigDSN: *configDSN, Tests: tests, Timeout: *timeout, Log: a.log}
	for _, d := range databases {
		name, schema, ok := strings.Cut(d, "=")
		if !ok || name == "" || schema == "" {
			return usageErrorf("check: --database %q: want NAME=SCHEMA", d)
		}
		if opts.Databases == nil {
			opts.Databases = map[string]string{}
		}
		opts.Databases[name] = schema
	}
	rep, err := check.Run(ctx, opts)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if format == "json" {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("check: write report: %w", err)
	}
	if rep.Failed(*warnFail) {
		return errReported
	}
	return nil
}
