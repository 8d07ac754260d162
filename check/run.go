// Package check checks a cachewarden deployment before it runs: the config
// file, the rule files it names, their rule tests, and, given a database,
// the rules against the live schema (see Schema). It backs `cachewarden
// check`; the result is a Report of findings, each located in the file
// that causes it.
//
// Nothing from a rule or a config becomes SQL text except the rules' own
// load, recount and keys queries, which are prepared (and explained) with
// '?' placeholders bound to typed sample values; schema and table names
// are only ever bound as parameters of information_schema queries.
//
// It is not a consistency check of a running cache (packages verify and
// observer): it reads memcached and Kafka not at all, and MySQL only for
// its schema and query plans.
package check

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/readfile"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/ruletest"
)

// DefaultTimeout bounds the whole schema check (connecting, every
// information_schema query, prepare and EXPLAIN); connecting alone is
// bounded by DefaultConnectTimeout.
const DefaultTimeout = 30 * time.Second

// Options says what Run checks.
type Options struct {
	// Config is the daemon's config file; required.
	Config string
	// Tests are rule test files or directories (whose *.yaml and *.yml
	// files are tests). nil means the tests/ subdirectory of every rule
	// directory the config names, where there is one.
	Tests []string
	// DSN is a go-sql-driver/mysql DSN; "" skips the schema check. Load
	// and recount queries run in its database, as in the daemon.
	DSN string
	// ConfigDSN checks the schema of the config's mysql.dsn (which may
	// take its password from the environment) instead of DSN's.
	ConfigDSN bool
	// Databases maps a database named in rules (`table: shop.users`) to
	// the schema on the server that holds its tables. A database absent
	// from it is looked up under its own name, and, when the server has
	// no database of that name, in the DSN's database.
	Databases map[string]string
	// Timeout bounds the schema check; 0 means DefaultTimeout.
	Timeout time.Duration
	// Log receives progress at debug level; nil discards.
	Log *slog.Logger
}

// Run checks the config, its rules, the rule tests and, with a DSN, the
// schema. Every problem becomes a Finding; the error is non-nil only when
// ctx ends.
func Run(ctx context.Context, o Options) (*Report, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := &Report{}
	cfg, err := config.Load(o.Config)
	if err != nil {
		rep.add(loadFindings(o.Config, err)...)
		if o.DSN != "" || o.ConfigDSN {
			rep.SchemaSkipped = "the config does not load"
		}
		return rep, nil // the rules cannot be checked further
	}
	rs := cfg.RuleSet
	rep.countRules(rs)
	log.Debug("config and rules loaded", "config", o.Config, "rules", rep.Rules)

	tests := o.Tests
	if tests == nil {
		tests = defaultTests(cfg.Rules)
	}
	runTests(rep, tests)

	dsn, ok := rep.schemaDSN(o, cfg)
	if !ok || dsn == "" || rs == nil {
		return rep, nil
	}
	return rep, rep.checkSchema(ctx, o, dsn, rs, log)
}

// countRules records the number of rules of rs and of their files.
func (rep *Report) countRules(rs *rules.RuleSet) {
	if rs == nil {
		return
	}
	files := map[string]bool{}
	for _, r := range rs.Rules() {
		files[r.File] = true
	}
	rep.Rules, rep.RuleFiles = len(rs.Rules()), len(files)
}

// schemaDSN returns the DSN to check the schema on: --dsn, or with
// --config-dsn the config's mysql.dsn ("" for no schema check). ok is
// false, with a finding, when --config-dsn finds none.
func (rep *Report) schemaDSN(o Options, cfg *config.Config) (dsn string, ok bool) {
	if !o.ConfigDSN {
		return o.DSN, true
	}
	if cfg.MySQL.DSN == "" {
		rep.SchemaSkipped = "mysql.dsn is not set"
		rep.add(Finding{File: o.Config, Severity: Error, Message: "mysql.dsn is not set: no database to check the rules against"})
		return "", false
	}
	return cfg.MySQL.DSN, true
}

// checkSchema checks rs against the schema of the server at dsn, within
// o.Timeout (DefaultTimeout when not positive). Every problem, a server
// that does not answer or the bound running out included, becomes a
// finding; the error is ctx's when it ends.
func (rep *Report) checkSchema(ctx context.Context, o Options, dsn string, rs *rules.RuleSet, log *slog.Logger) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	srv, err := openServer(dsn, log)
	if err != nil {
		rep.Server = "an unreadable DSN"
		rep.add(Finding{Severity: Error, Message: err.Error()})
		return nil
	}
	defer srv.close()
	rep.Server = srv.where
	stopped := func(err error) {
		if errors.Is(err, context.DeadlineExceeded) && sctx.Err() != nil {
			err = fmt.Errorf("the check's bound of %v (--timeout) ran out: %w", timeout, err)
		}
		rep.add(Finding{Severity: Error, Message: fmt.Sprintf("schema check on MySQL %s stopped: %v", srv.where, err)})
	}
	if err := srv.connect(sctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if sctx.Err() != nil {
			stopped(err)
		} else {
			rep.add(Finding{Severity: Error, Message: err.Error()})
		}
		return nil
	}
	sc := &Schema{DB: srv.db, Databases: o.Databases, Log: log}
	fs, schemas, err := sc.Check(sctx, rs)
	sortFindings(fs)
	rep.add(fs...)
	rep.Schemas = schemas
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		stopped(err)
	}
	return nil
}

// loadFindings turns config.Load's error into findings: the config's and
// the rule files' problems at their positions, anything else at the
// config file.
func loadFindings(file string, err error) []Finding {
	var out []Finding
	var ce *config.Error
	if errors.As(err, &ce) {
		out = append(out, problemFindings(ce.Problems)...)
	}
	var le *rules.LoadError
	if errors.As(err, &le) {
		out = append(out, problemFindings(le.Problems)...)
	}
	if out == nil {
		msg := strings.TrimPrefix(err.Error(), "config: ")
		var tl *readfile.TooLargeError
		if errors.As(err, &tl) {
			msg = tl.Detail() // the finding names the file
		}
		out = append(out, Finding{File: file, Severity: Error, Message: msg})
	}
	return out
}

func problemFindings(ps []rules.Problem) []Finding {
	out := make([]Finding, len(ps))
	for i, p := range ps {
		out[i] = Finding{File: p.File, Line: p.Line, Column: p.Column, Severity: Error, Message: p.Msg}
	}
	return out
}

// defaultTests returns the rule test files in the tests/ subdirectory of
// each rule directory.
func defaultTests(rulePaths []string) []string {
	var out []string
	for _, p := range rulePaths {
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			continue
		}
		dir := filepath.Join(p, "tests")
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			out = append(out, dir)
		}
	}
	return out
}

// testFiles expands directories into their *.yaml and *.yml files, in
// name order.
func testFiles(paths []string) (files []string, problems []Finding) {
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			problems = append(problems, Finding{File: p, Severity: Error, Message: "rule tests: " + readfile.Reason(err)})
			continue
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			problems = append(problems, Finding{File: p, Severity: Error, Message: "rule tests: " + readfile.Reason(err)})
			continue
		}
		for _, e := range entries {
			n := e.Name()
			if !e.IsDir() && !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				files = append(files, filepath.Join(p, n))
			}
		}
	}
	return files, problems
}

// eventLine finds the event's line in a rule test failure text.
var eventLine = regexp.MustCompile(`^event \d+ \(line (\d+)\)`)

// problemLine splits "file:line:col: message", the form of rule test
// parse problems.
var problemLine = regexp.MustCompile(`^(.*?):(\d+):(\d+): (.*)$`)

// runTests runs the rule tests of paths and adds a finding per failure.
func runTests(rep *Report, paths []string) {
	files, problems := testFiles(paths)
	rep.add(problems...)
	for _, path := range files {
		rep.TestFiles++
		suite, err := ruletest.Load(path)
		if err != nil {
			var pe *ruletest.ParseError
			if !errors.As(err, &pe) {
				rep.add(Finding{File: path, Severity: Error, Message: "rule test file: " + readfile.Reason(err)})
				continue
			}
			for _, p := range pe.Problems {
				f := Finding{File: path, Severity: Error, Message: p}
				if m := problemLine.FindStringSubmatch(p); m != nil {
					f.File, f.Message = m[1], m[4]
					f.Line, _ = strconv.Atoi(m[2])
					f.Column, _ = strconv.Atoi(m[3])
				}
				rep.add(f)
			}
			continue
		}
		rs, err := suite.LoadRules()
		if err != nil {
			var le *rules.LoadError
			if errors.As(err, &le) {
				for _, f := range problemFindings(le.Problems) {
					f.Message = fmt.Sprintf("rule files of test file %s do not load: %s", path, f.Message)
					rep.add(f)
				}
			} else {
				rep.add(Finding{File: path, Severity: Error, Message: "rule files do not load: " + err.Error()})
			}
			continue
		}
		var found []Finding
		for _, res := range suite.Run(rs) {
			if res.Passed() {
				rep.TestsPassed++
				continue
			}
			rep.TestsFailed++
			for _, failure := range res.Failures {
				f := Finding{File: path, Line: res.Test.Line, Severity: Error,
					Message: fmt.Sprintf("rule test %q failed: %s", res.Test.Name, failure)}
				if m := eventLine.FindStringSubmatch(failure); m != nil {
					f.Line, _ = strconv.Atoi(m[1])
				}
				found = append(found, f)
			}
		}
		sortFindings(found)
		rep.add(found...)
	}
}
