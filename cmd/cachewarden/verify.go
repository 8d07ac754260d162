package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/verify"
)

// verifyCmd implements `verify`: compare the sets and counters in
// memcached with MySQL.
func (a *app) verifyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseVerifyFlags(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(f.configPath, stderr)
	if err != nil {
		return err
	}
	if cfg.MySQL.DSN == "" {
		return fmt.Errorf("verify: %s has no mysql.dsn; verification needs the database", f.configPath)
	}
	mc, err := verifyMemcached(cfg)
	if err != nil {
		return err
	}
	defer mc.Close()
	db, err := counters.OpenMySQL(cfg.MySQL.DSN, counters.DBConfig{
		// The keys query's cursor holds one connection while the truth
		// queries run on the others.
		MaxOpenConns: max(cfg.MySQL.MaxOpenConns, 2),
		QueryTimeout: cfg.MySQL.QueryTimeout,
	}, a.log)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer db.Close()

	opts := f.options
	// Up to the pool's size, leaving one connection for the keys query
	// that stays open while keys are checked.
	opts.Concurrency = max(1, db.DB().Stats().MaxOpenConnections-1)
	rep, err := verify.New(mc, db, db.DB(), a.log).Verify(ctx, cfg.RuleSet.Rules(), opts)
	if err != nil {
		return err
	}
	if err := rep.WriteText(stdout); err != nil {
		return fmt.Errorf("verify: write report: %w", err)
	}
	if !rep.OK() {
		return fmt.Errorf("verify: %d of %d checked items are wrong", rep.Wrong, rep.Checked)
	}
	return rep.CheckPresent(f.floor)
}

// verifyFlags is verify's command line, checked.
type verifyFlags struct {
	configPath string
	// options lacks Concurrency, which depends on the MySQL pool.
	options verify.Options
	floor   verify.MinPresent
}

// verifyHelp is the description `cachewarden verify -h` prints.
const verifyHelp = `Compares the sets and counters in memcached with what MySQL says they hold.
Keys are listed by each set or count rule's ` + "`keys`" + ` query; a missing item is
consistent, a present one must equal the rule's load or recount result.
Prints every mismatch (key, cached, truth), a table per rule and a summary
with the consistency in percent and nines and how many checked items were
present. Exit status 1 when any item is wrong, or when fewer items than
--min-present were present (an empty cache or a wrong prefix, server list or
distribution makes every key "missing", which is consistent but proves nothing).`

// parseVerifyFlags parses and checks verify's command line; its messages
// go to stderr.
func parseVerifyFlags(args []string, stderr io.Writer) (verifyFlags, error) {
	fs := newFlagSet("verify", "verify -c FILE [--rule NAME]... [--sample N] [--recheck DURATION] [--min-present N|P%]", verifyHelp, stderr)
	configPath := fs.String("c", "", "daemon config file (memcached servers, MySQL DSN, rules; required)")
	var ruleNames stringList
	fs.Var(&ruleNames, "rule", "check only this rule (repeatable; default: every set and count rule with a keys query)")
	sample := fs.Int("sample", 0, "check at most N keys per rule, chosen at random (0: every key)")
	recheck := fs.Duration("recheck", 2*time.Second, "re-read a mismatched key after this delay and count it wrong only if it still differs (0: off); on a live system it lets in-flight changes land")
	minPresent := fs.String("min-present", "0", "fail unless at least N checked items, or P% of them, were present in memcached")
	maxMismatches := fs.Int("max-mismatches", verify.DefaultMaxMismatches, "list at most this many mismatches (the counts stay exact)")
	var f verifyFlags
	if err := parseConfigFlags(fs, "verify", args, configPath); err != nil {
		return f, err
	}
	switch {
	case *sample < 0:
		return f, usageErrorf("verify: --sample must not be negative")
	case *recheck < 0:
		return f, usageErrorf("verify: --recheck must not be negative")
	case *maxMismatches < 0:
		return f, usageErrorf("verify: --max-mismatches must not be negative")
	}
	floor, err := verify.ParseMinPresent(*minPresent)
	if err != nil {
		return f, usageErrorf("%v", err)
	}
	if *maxMismatches == 0 {
		*maxMismatches = -1 // verify.Options: negative keeps none
	}
	return verifyFlags{
		configPath: *configPath,
		options:    verify.Options{Rules: ruleNames, Sample: *sample, Recheck: *recheck, MaxMismatches: *maxMismatches},
		floor:      floor,
	}, nil
}

// verifyMemcached returns a client of the config's memcached servers,
// with its distribution, dialer, timeout and connection cap.
func verifyMemcached(cfg *config.Config) (*memcache.Client, error) {
	servers, err := cfg.Memcached.Selector()
	if err != nil {
		return nil, err
	}
	dial, err := cfg.Memcached.Dialer()
	if err != nil {
		return nil, err
	}
	mc := memcache.NewFromSelector(servers)
	mc.DialContext = dial
	mc.Timeout = cfg.Memcached.Timeout
	mc.MaxIdleConns = cfg.Memcached.MaxConcurrency
	return mc, nil
}
