package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/cachewarden/cachewarden/ruletest"
)

const rulesUsage = `Usage: cachewarden rules check PATH...
       cachewarden rules test FILE...

  check  load rule files (a PATH is a file, or a directory whose *.yaml and
         *.yml files load in name order) and report every mistake as
         file:line:col: message
  test   run rule unit tests (see docs/rules.md)
`

// rulesCmd dispatches `rules check` and `rules test`.
func (a *app) rulesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, rulesUsage)
		return usageErrorf("rules: missing subcommand (check or test)")
	}
	switch args[0] {
	case "check":
		return a.rulesCheck(args[1:], stdout, stderr)
	case "test":
		return a.rulesTest(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, rulesUsage)
		return flag.ErrHelp
	}
	fmt.Fprint(stderr, rulesUsage)
	return usageErrorf("rules: unknown subcommand %q (want check or test)", args[0])
}

// rulesCheckHelp is the description `cachewarden rules check -h` prints.
const rulesCheckHelp = `Loads the rule files together (names are unique across all of them) and
prints "N rules in M files OK", or every mistake as file:line:col: message.`

// rulesCheck implements `rules check PATH...`.
func (a *app) rulesCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules check", "rules check PATH...", rulesCheckHelp, stderr)
	paths, err := parseOperands(fs, "rules check", "PATH", args)
	if err != nil {
		return err
	}
	rs, err := rulefile.LoadPaths(paths...)
	if err != nil {
		return reportLoadError(stderr, err)
	}
	nRules, nFiles := countRules(rs)
	fmt.Fprintf(stdout, "%s in %s OK\n", plural(nRules, "rule"), plural(nFiles, "file"))
	return nil
}

// rulesTestHelp is the description `cachewarden rules test -h` prints.
const rulesTestHelp = `Runs the rule unit tests in each FILE and prints every failure and a
summary "N passed, M failed". The file format is described in docs/rules.md.`

// rulesTest implements `rules test FILE...`.
func (a *app) rulesTest(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules test", "rules test FILE...", rulesTestHelp, stderr)
	files, err := parseOperands(fs, "rules test", "FILE", args)
	if err != nil {
		return err
	}
	sum, err := ruletest.RunFiles(stdout, files...)
	if err != nil {
		return fmt.Errorf("rules test: %w", err)
	}
	a.log.Debug("rule tests finished", "passed", sum.Passed, "failed", sum.Failed, "broken_files", sum.BrokenFiles)
	if !sum.OK() {
		return errReported
	}
	return nil
}

// reportLoadError writes a rule loading error to w, one problem per line,
// and returns errReported.
func reportLoadError(w io.Writer, err error) error {
	var le *rules.LoadError
	if errors.As(err, &le) {
		for _, p := range le.Problems {
			fmt.Fprintln(w, p)
		}
		return errReported
	}
	fmt.Fprintln(w, err)
	return errReported
}

// countRules returns the number of rules in rs and of files defining them.
func countRules(rs *rules.RuleSet) (nRules, nFiles int) {
	files := make(map[string]bool)
	for _, r := range rs.Rules() {
		files[r.File] = true
	}
	return len(rs.Rules()), len(files)
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
