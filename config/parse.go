package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"go.yaml.in/yaml/v3"
)

// Load reads the config file at path, expands ${NAME} references from the
// process environment, validates it and loads the rule files it names. The
// error lists every problem of the config and of the rule files at once
// (an *Error and/or a *rules.LoadError, joined).
func Load(path string) (*Config, error) {
	return LoadEnv(path, os.LookupEnv)
}

// LoadEnv is Load with ${NAME} references resolved by lookup.
func LoadEnv(path string, lookup LookupFunc) (*Config, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return LoadBytes(path, data, lookup)
}

// LoadBytes is LoadEnv with the config file's contents given; name locates
// problems and anchors relative rule paths (use a path in the directory
// the rule paths are relative to).
func LoadBytes(name string, data []byte, lookup LookupFunc) (*Config, error) {
	d, cfg := parse(name, data, lookup)
	var rulesErr error
	if len(cfg.Rules) > 0 {
		cfg.RuleSet, cfg.RulesDigest, rulesErr = rulefile.LoadPathsDigest(cfg.Rules...)
		if rulesErr == nil {
			if err := cfg.CheckRuleNeeds(cfg.RuleSet); err != nil {
				if key := err.Setting; d.Readable(key) {
					d.problem(d.Place(key), "%v", err)
				}
			}
		}
	}
	if len(d.problems) > 0 {
		sortProblems(d.problems)
		return nil, errors.Join(&Error{Problems: d.problems}, rulesErr)
	}
	if rulesErr != nil {
		return nil, rulesErr
	}
	return cfg, nil
}

// Parse decodes and validates one config file's contents without reading
// the rule files (RuleSet stays nil); name is used in problem locations
// and to resolve relative rule paths. lookup resolves ${NAME} references;
// nil means no variable is set.
//
// Every problem found is returned at once in an *Error. On success the
// Config has every default applied.
func Parse(name string, data []byte, lookup LookupFunc) (*Config, error) {
	d, cfg := parse(name, data, lookup)
	if len(d.problems) > 0 {
		sortProblems(d.problems)
		return nil, &Error{Problems: d.problems}
	}
	return cfg, nil
}

func parse(name string, data []byte, lookup LookupFunc) (*decoder, *Config) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	d := newDecoder(name, lookup)
	cfg := &Config{File: name}
	d.decodeFile(data, cfg)
	if d.parsed {
		d.validate(cfg)
	}
	cfg.resolvePaths()
	return d, cfg
}

// CheckRuleNeeds reports rule files that hold no rule at all (the daemon
// would consume and apply nothing), and a setting that rs requires and c
// lacks: a rule with a load or recount query needs mysql.dsn. It
// returns nil when the rules can run. Load checks the rules it loads;
// the daemon checks the rules it reloads.
func (c *Config) CheckRuleNeeds(rs *rules.RuleSet) *RuleNeedError {
	if len(rs.Rules()) == 0 {
		return &RuleNeedError{Setting: "rules", Reason: fmt.Sprintf("no rule in %s: nothing would be applied (a rule file of comments alone holds none)",
			strings.Join(c.Rules, ", "))}
	}
	if c.MySQL.DSN != "" {
		return nil
	}
	for _, r := range rs.Rules() {
		if r.Query != "" {
			return &RuleNeedError{Setting: "mysql.dsn", Reason: fmt.Sprintf("required: rule %q (%s:%d:%d) queries MySQL", r.Name, r.File, r.Line, r.Column)}
		}
	}
	return nil
}

// RuleNeedError is CheckRuleNeeds' finding: the setting it concerns
// ("rules" or "mysql.dsn") and why.
type RuleNeedError struct {
	Setting, Reason string
}

func (e *RuleNeedError) Error() string { return e.Setting + ": " + e.Reason }

// resolvePaths makes relative rule paths relative to the config file.
func (c *Config) resolvePaths() {
	if c.File == "" {
		return
	}
	dir := filepath.Dir(c.File)
	for i, p := range c.Rules {
		if !filepath.IsAbs(p) {
			c.Rules[i] = filepath.Join(dir, p)
		}
	}
}

// decoder decodes one config file: yamlfile.Decoder reads the values
// into Config, declared by its struct tags, and remembers where each was
// written; validation places its problems with it.
type decoder struct {
	yamlfile.Decoder
	file     string
	problems []Problem
	// parsed is set once the YAML itself was read, so that validation
	// still runs (and reports more) when only values were wrong.
	parsed bool
}

func newDecoder(file string, lookup LookupFunc) *decoder {
	d := &decoder{file: file}
	d.NullIsEmpty = true
	d.Errorf = func(n *yaml.Node, format string, args ...any) {
		d.problem(yamlfile.At(n), format, args...)
	}
	d.Text = func(s string) (string, error) { return expandEnv(s, lookup) }
	return d
}

func (d *decoder) problem(p yamlfile.Pos, format string, args ...any) {
	d.problems = append(d.problems, Problem{File: d.file, Line: p.Line, Column: p.Column, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) decodeFile(data []byte, cfg *Config) {
	root, err := yamlfile.Parse(data)
	var ye *yamlfile.Error
	if errors.As(err, &ye) {
		d.problem(yamlfile.Pos{Line: ye.Line, Column: ye.Column}, "%s", ye.Msg)
	}
	if err != nil && root == nil {
		return
	}
	d.parsed = true
	if root == nil {
		return // an empty file: report what is missing
	}
	d.Decode(root, "", cfg)
}
