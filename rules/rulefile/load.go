// Package rulefile loads cachewarden's rule files (YAML) into a
// rules.RuleSet, reporting every problem with its file, line and column.
//
// It is the only part of the rules that needs a YAML parser: the planner
// and the types live in package rules, so that programs which build their
// rules another way (rules.NewRuleSet) link no YAML.
//
// It plans nothing (package rules does) and runs no rule tests (package
// ruletest).
package rulefile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/internal/readfile"
	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
)

// File is the content of one rule file; Name is used in problems and in
// Rule.File.
type File struct {
	Name string
	Data []byte
}

// LoadPaths loads rule files. A path is a file, or a directory whose
// *.yaml and *.yml files (not those whose name starts with '.', not
// subdirectories) are loaded in name order. Rules keep the order of the
// paths and of the files. Every problem of every file is reported at once
// in a *rules.LoadError.
func LoadPaths(paths ...string) (*rules.RuleSet, error) {
	rs, _, err := LoadPathsDigest(paths...)
	return rs, err
}

// LoadPathsDigest is LoadPaths, also returning the Digest of the files
// it read ("" with an error).
func LoadPathsDigest(paths ...string) (*rules.RuleSet, string, error) {
	if len(paths) == 0 {
		return nil, "", &rules.LoadError{Problems: []rules.Problem{{File: "rules", Msg: "no rule file given"}}}
	}
	var files []File
	var problems []rules.Problem
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			problems = append(problems, rules.Problem{File: p, Msg: readfile.Reason(err)})
			continue
		}
		if !st.IsDir() {
			data, err := yamlfile.ReadFile(p)
			if err != nil {
				problems = append(problems, rules.Problem{File: p, Msg: readfile.Reason(err)})
				continue
			}
			files = append(files, File{Name: p, Data: data})
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			problems = append(problems, rules.Problem{File: p, Msg: readfile.Reason(err)})
			continue
		}
		found := 0
		for _, e := range entries { // ReadDir sorts by name
			name := e.Name()
			if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
				continue
			}
			full := filepath.Join(p, name)
			st, err := os.Stat(full) // follows symlinks
			if err != nil {
				problems = append(problems, rules.Problem{File: full, Msg: readfile.Reason(err)})
				continue
			}
			if st.IsDir() {
				continue
			}
			data, err := yamlfile.ReadFile(full)
			if err != nil {
				problems = append(problems, rules.Problem{File: full, Msg: readfile.Reason(err)})
				continue
			}
			found++
			files = append(files, File{Name: full, Data: data})
		}
		if found == 0 {
			problems = append(problems, rules.Problem{File: p, Msg: "directory has no *.yaml or *.yml rule file"})
		}
	}
	rs, err := ParseFiles(files...)
	if len(problems) > 0 {
		var le *rules.LoadError
		if errors.As(err, &le) {
			problems = append(problems, le.Problems...)
		}
		return nil, "", &rules.LoadError{Problems: problems}
	}
	if err != nil {
		return nil, "", err
	}
	return rs, Digest(files), nil
}

// Digest returns the SHA-256, in hex, of the files' contents one after
// the other, in their order: what `cat FILE... | sha256sum` prints for
// the files LoadPaths reads, in the order it reads them. It identifies a
// set of rules (the daemon exports it as cachewarden_rules_info).
func Digest(files []File) string {
	h := sha256.New()
	for _, f := range files {
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Parse loads one rule file held in memory; filename is used in problems.
func Parse(filename string, data []byte) (*rules.RuleSet, error) {
	return ParseFiles(File{Name: filename, Data: data})
}

// ParseFiles loads several rule files held in memory as one rule set, in
// the order given. Rule names must be unique across all of them.
//
// A rule file is one YAML document; unknown fields are errors at every
// level, and YAML 1.2 reading keeps `on` a plain key:
//
//	version: 1                 # required, the only version
//	prefix: "shop:"            # optional; legal key bytes (none <= 0x20 or 0x7f), '%' only as %XX
//	rules:
//	  - name: user-profile     # required, unique, no spaces
//	    table: shop.users      # "db.table", or "table" for any database (exact case)
//	    on: [insert, update, delete]  # the default; also read, truncate
//	    when: "active == 1"    # optional predicate (see below)
//	    columns: [name, email] # bump rules only: updates bump only if one changed
//	    bump: "ns:user:{id}"   # exactly one of bump, set, count
//	    rebump_after: 5s       # bump rules only: second bump after this delay
//	    copies: 4              # bump rules only: keep 2..64 copies of each namespace (hot keys)
//	    evidence:              # bump rules only, not with copies: a master namespace
//	      master: "ns:user:master"  # its key (no placeholders)
//	      bits: 64             # the bitmap's size: a multiple of 8 from 8 to 8192
//	      max_set: 16          # roll the master beyond this many bits set; default bits/4
//	    ttl: 3600              # item TTL: seconds, or a duration ("1h", "90s")
//
// set holds key, member, and optionally load (a query with '?'
// placeholders), args and keys; count holds key, and optionally recount,
// args and keys (see rules.Rule.Keys). args are the columns bound to the query's placeholders, by default
// the key template's placeholder columns in order; their number must match
// the '?' placeholders outside quotes and comments; a column may be named
// twice (a query that uses it twice). args without a query is an error.
//
// ttl and rebump_after are an integer number of seconds or a Go duration
// string ("90s", "5m", "1h30m"); a quoted number is neither. ttl must be
// whole seconds and at most 30 days (rules.MaxTTL); 0 means no expiry.
// rebump_after may be fractional ("500ms").
//
// truncate may be listed only by bump rules whose key has no placeholder.
//
// when is a predicate on one row image in a subset of expr's syntax,
// compiled at load time (syntax errors and unsupported constructs are
// reported with their position in the file):
//
//   - column names and literals: integers, floats, strings, true/false,
//     nil (or null), a leading '-' on numbers;
//   - comparisons == != < <= > >= (chained: 1 < x < 5); x in [a, b] and
//     x not in [...]; x startsWith/endsWith/contains "text"; x matches
//     "regexp";
//   - && and, || or, ! not, parentheses; a bare column is a condition.
//
// Semantics: a column the row lacks reads as null; null equals only null
// and an ordering comparison with null is false; numbers compare exactly
// whatever their encoding (integers of any size, decimals, floats,
// booleans as 1/0, and strings whose whole text is a decimal number), so a
// 2^63 id is never rounded (an integer literal beyond 64 bits is written
// as a string: id == "18446744073709551616"); two strings compare as
// bytes ("007" != "7"); a non-numeric string never equals a number and is
// not ordered against one; a bare column is true when it is a non-zero
// number, as in MySQL.
func ParseFiles(files ...File) (*rules.RuleSet, error) {
	var all []*rules.Rule
	var problems []rules.Problem
	names := make(map[*rules.Rule]position)
	for _, f := range files {
		fl := &fileLoader{file: f.Name, data: f.Data, namePos: names}
		loaded := fl.load()
		sort.SliceStable(fl.problems, func(i, j int) bool {
			a, b := fl.problems[i], fl.problems[j]
			if a.Line != b.Line {
				return a.Line < b.Line
			}
			return a.Column < b.Column
		})
		problems = append(problems, fl.problems...)
		all = append(all, loaded...)
	}
	byName := make(map[string]*rules.Rule, len(all))
	for _, r := range all {
		if first, dup := byName[r.Name]; dup {
			at, firstAt := names[r], names[first]
			problems = append(problems, rules.Problem{File: r.File, Line: at.line, Column: at.column,
				Msg: fmt.Sprintf("duplicate rule name %q (first defined at %s:%d:%d)", r.Name, first.File, firstAt.line, firstAt.column)})
			continue
		}
		byName[r.Name] = r
	}
	if len(problems) > 0 {
		sortProblems(problems, files)
		return nil, &rules.LoadError{Problems: problems}
	}
	// The loader checked everything NewRuleSet checks, with positions in
	// the files; NewRuleSet completes the rules.
	return rules.NewRuleSet(all)
}

// position locates a node in a rule file.
type position struct{ line, column int }

// sortProblems orders problems by file (in load order) and position.
func sortProblems(problems []rules.Problem, files []File) {
	order := make(map[string]int, len(files))
	for i, f := range files {
		if _, ok := order[f.Name]; !ok {
			order[f.Name] = i
		}
	}
	sort.SliceStable(problems, func(i, j int) bool {
		a, b := problems[i], problems[j]
		if oa, ob := order[a.File], order[b.File]; oa != ob {
			return oa < ob
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
}

// fileLoader loads one file and collects its problems.
type fileLoader struct {
	file     string
	data     []byte
	lines    []string
	prefix   string
	problems []rules.Problem
	// names records where each rule's name is, for duplicate reports.
	namePos map[*rules.Rule]position
	// fallback is the file's fallback namespace template; nil when none.
	fallback     *rules.Template
	fallbackNode *yaml.Node
}

func (l *fileLoader) errorAt(line, col int, format string, args ...any) {
	l.problems = append(l.problems, rules.Problem{File: l.file, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)})
}

func (l *fileLoader) errorf(n *yaml.Node, format string, args ...any) {
	l.errorAt(n.Line, n.Column, format, args...)
}

func (l *fileLoader) load() []*rules.Rule {
	root, err := yamlfile.Parse(l.data)
	var ye *yamlfile.Error
	if errors.As(err, &ye) {
		l.errorAt(ye.Line, ye.Column, "%s", ye.Msg)
	}
	root = yamlfile.Resolve(root)
	if root == nil || yamlfile.IsNull(root) {
		// A file of comments holds no rules yet; an empty one was more
		// likely emptied by a failed copy or deploy, which must not drop
		// its rules silently.
		if len(l.problems) == 0 && len(bytes.TrimSpace(l.data)) == 0 {
			l.errorAt(0, 0, "rule file is empty (%d bytes, no text): want version: 1 and a rules list (a file of comments alone may stand for no rules yet)", len(l.data))
		}
		return nil
	}
	var file fileDecl
	dec := yamlfile.Decoder{Errorf: l.errorf}
	if dec.Decode(root, "", &file); !dec.Readable("") {
		return nil
	}
	if v := file.Version; v == nil {
		l.errorf(root, "%s (want version: 1)", yamlfile.MissingKey("version"))
	} else if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Value != "1" {
		l.errorf(v, "unsupported version %q (want 1)", v.Value)
	}
	if v := file.Prefix; v != nil {
		if p, ok := l.str(v, "prefix"); ok {
			if err := rules.CheckLiteral(p); err != nil {
				l.errorf(v, "prefix %q: %v", p, err)
			} else {
				l.prefix = p
			}
		}
	}
	if v := file.Fallback; v != nil {
		if t := l.template(v, "fallback"); t != nil {
			for _, c := range t.Columns() {
				if c != "db" && c != "table" {
					l.errorf(v, "fallback: placeholder {%s}: only {db} and {table} are known (the rule's table)", c)
					t = nil
					break
				}
			}
			l.fallback, l.fallbackNode = t, v
		}
	}
	seq := file.Rules
	if seq == nil {
		l.errorf(root, "%s", yamlfile.MissingKey("rules"))
		return nil
	}
	if yamlfile.IsNull(seq) {
		return nil
	}
	if seq.Kind != yaml.SequenceNode {
		l.errorf(seq, "%s", yamlfile.WrongKind("rules", "a list", seq))
		return nil
	}
	var loaded []*rules.Rule
	for _, item := range seq.Content {
		if r := l.rule(yamlfile.Resolve(item)); r != nil {
			loaded = append(loaded, r)
		}
	}
	if l.fallback != nil {
		for _, r := range loaded {
			l.setFallback(r)
		}
	}
	return loaded
}

// setFallback renders the file's fallback namespace key for r's table.
func (l *fileLoader) setFallback(r *rules.Rule) {
	if r.Table == "" {
		return // the rule's table had a problem already
	}
	buf, missing, _ := l.fallback.AppendRendered([]byte(l.prefix), func(c string) (string, bool) {
		switch {
		case c == "table":
			return r.Table, true
		case c == "db" && r.Database != "":
			return r.Database, true
		}
		return "", false
	})
	if missing != "" {
		l.errorf(l.fallbackNode, "fallback: {%s} is unknown for rule %q, whose table %q names no database", missing, r.Name, r.Table)
		return
	}
	r.Fallback = rules.FinishKey(buf)
}

// str returns a scalar's text, which must not be empty; what names the
// field in messages.
func (l *fileLoader) str(n *yaml.Node, what string) (string, bool) {
	s, ok := yamlfile.String(n, what, l.errorf)
	if ok && s == "" {
		l.errorf(n, "%s must not be empty", what)
		return "", false
	}
	return s, ok
}

// optStr is str for an optional key whose value v is nil when the key is
// absent: ok is false then, as when v is not a usable string.
func (l *fileLoader) optStr(v *yaml.Node, what string) (string, bool) {
	if v == nil {
		return "", false
	}
	return l.str(v, what)
}

// names returns a list of column names; a name may repeat only when
// repeats is true (args: a query may use one column twice).
func (l *fileLoader) names(n *yaml.Node, what string, repeats bool) ([]string, bool) {
	if n.Kind != yaml.SequenceNode {
		l.errorf(n, "%s", yamlfile.WrongKind(what, "a list of column names", n))
		return nil, false
	}
	ok := true
	var out []string
	seen := make(map[string]bool)
	for _, item := range n.Content {
		item = yamlfile.Resolve(item)
		s, good := l.str(item, what+" entry")
		if !good {
			ok = false
			continue
		}
		if !validColumnName(s) {
			l.errorf(item, "bad column name %q in %s", s, what)
			ok = false
			continue
		}
		if seen[s] && !repeats {
			l.errorf(item, "column %q listed twice in %s", s, what)
			ok = false
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out, ok
}

// validColumnName rejects names that could never match a column or that
// templates cannot spell.
func validColumnName(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= 0x20 || r == 0x7f || r == '{' || r == '}' {
			return false
		}
	}
	return true
}

func validRuleName(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// template parses a key or member template field.
func (l *fileLoader) template(n *yaml.Node, what string) *rules.Template {
	s, ok := l.str(n, what)
	if !ok {
		return nil
	}
	t, err := rules.ParseTemplate(s)
	if err != nil {
		l.errorf(n, "%s: %v", what, err)
		return nil
	}
	return t
}

// duration reads a TTL-like field: an integer number of seconds or a Go
// duration string such as "90s", "5m" or "1h30m".
func (l *fileLoader) duration(n *yaml.Node, what string) (time.Duration, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!int":
			secs, err := strconv.ParseInt(n.Value, 0, 64)
			if err != nil || secs < 0 || secs > int64(math.MaxInt64/time.Second) {
				l.errorf(n, "%s %q is not a usable number of seconds", what, n.Value)
				return 0, false
			}
			return time.Duration(secs) * time.Second, true
		case "!!str":
			d, err := time.ParseDuration(n.Value)
			if err != nil {
				l.errorf(n, "%s %q: want seconds or a duration such as 30s, 5m, 1h", what, n.Value)
				return 0, false
			}
			if d < 0 {
				l.errorf(n, "%s must not be negative", what)
				return 0, false
			}
			return d, true
		}
	}
	l.errorf(n, "%s", yamlfile.WrongKind(what, "seconds (an integer) or a duration such as 30s, 5m, 1h", n))
	return 0, false
}

// fileDecl declares the keys of a rule file; the loader reads each value
// (versions, templates, predicates and lists have rules of their own).
type fileDecl struct {
	Version  *yaml.Node `yaml:"version"`
	Prefix   *yaml.Node `yaml:"prefix"`
	Fallback *yaml.Node `yaml:"fallback"`
	Rules    *yaml.Node `yaml:"rules"`
}

// ruleDecl declares the keys of a rule. The fields whose key is placed
// in messages are yamlfile.Fields.
type ruleDecl struct {
	Name        *yaml.Node     `yaml:"name"`
	Table       *yaml.Node     `yaml:"table"`
	On          *yaml.Node     `yaml:"on"`
	When        *yaml.Node     `yaml:"when"`
	Columns     yamlfile.Field `yaml:"columns"`
	Bump        yamlfile.Field `yaml:"bump"`
	Set         yamlfile.Field `yaml:"set"`
	Count       yamlfile.Field `yaml:"count"`
	TTL         *yaml.Node     `yaml:"ttl"`
	RebumpAfter yamlfile.Field `yaml:"rebump_after"`
	Copies      yamlfile.Field `yaml:"copies"`
	Evidence    yamlfile.Field `yaml:"evidence"`
	Collation   *yaml.Node     `yaml:"collation"`
}

// setDecl and countDecl declare the keys of a set and a count rule's
// mapping; queryDecl is what both hold, their query named load or
// recount.
type setDecl struct {
	Key    *yaml.Node     `yaml:"key"`
	Member *yaml.Node     `yaml:"member"`
	Load   *yaml.Node     `yaml:"load"`
	Args   yamlfile.Field `yaml:"args"`
	Keys   *yaml.Node     `yaml:"keys"`
}

type countDecl struct {
	Key     *yaml.Node     `yaml:"key"`
	Recount *yaml.Node     `yaml:"recount"`
	Args    yamlfile.Field `yaml:"args"`
	Keys    *yaml.Node     `yaml:"keys"`
}

type queryDecl struct {
	Key, Member, Query, Keys *yaml.Node
	Args                     yamlfile.Field
}

// evidenceDecl declares the keys of a bump rule's evidence.
type evidenceDecl struct {
	Master *yaml.Node `yaml:"master"`
	Bits   *yaml.Node `yaml:"bits"`
	MaxSet *yaml.Node `yaml:"max_set"`
}

// rule loads one rule; it returns nil when the rule has problems (they are
// recorded) except that a rule with a name is returned for duplicate-name
// checks whenever its name is usable.
func (l *fileLoader) rule(n *yaml.Node) *rules.Rule {
	var d ruleDecl
	dec := yamlfile.Decoder{Errorf: l.errorf}
	if dec.Decode(n, "rule", &d); !dec.Readable("rule") {
		return nil
	}
	before := len(l.problems)
	r := &rules.Rule{File: l.file, Line: n.Line, Column: n.Column, Prefix: l.prefix}
	r.At = locations(r.At, "rule", &dec)
	label := l.ruleName(r, n, d.Name)
	l.ruleTable(r, n, d.Table, label)
	l.ruleKind(r, n, &d, label)
	l.ruleOn(r, d.On)
	l.ruleWhen(r, d.When)
	l.ruleBumpOptions(r, &d)
	l.ruleCollation(r, d.Collation)
	if len(l.problems) > before {
		if r.Name != "" {
			// Keep the name for duplicate checks; the load fails anyway.
			return r
		}
		return nil
	}
	return r
}

// ruleName reads the rule's name and returns how messages call the rule.
func (l *fileLoader) ruleName(r *rules.Rule, n, v *yaml.Node) (label string) {
	if v == nil {
		l.errorf(n, "rule: %s", yamlfile.MissingKey("name"))
		return "rule"
	}
	s, ok := l.str(v, "name")
	if !ok {
		return "rule"
	}
	if !validRuleName(s) {
		l.errorf(v, "rule name %q must not contain spaces or control characters", s)
		return "rule"
	}
	r.Name = s
	l.namePos[r] = position{line: v.Line, column: v.Column}
	return fmt.Sprintf("rule %q", s)
}

// ruleTable reads the rule's table: "db.table", or "table" for any
// database.
func (l *fileLoader) ruleTable(r *rules.Rule, n, v *yaml.Node, label string) {
	if v == nil {
		l.errorf(n, "%s: %s", label, yamlfile.MissingKey("table"))
		return
	}
	s, ok := l.str(v, "table")
	if !ok {
		return
	}
	db, table, dotted := strings.Cut(s, ".")
	if !dotted {
		db, table = "", s
	}
	if (dotted && db == "") || table == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= 0x20 || r == 0x7f }) {
		l.errorf(v, "table %q: want db.table or table", s)
		return
	}
	r.Database, r.Table = db, table
}

// ruleKind reads the one of bump, set and count the rule has: its kind,
// key and member templates, query, args and keys query.
func (l *fileLoader) ruleKind(r *rules.Rule, n *yaml.Node, d *ruleDecl, label string) {
	var kinds []yamlfile.Field
	for _, f := range []yamlfile.Field{d.Bump, d.Set, d.Count} {
		if f.Value != nil {
			kinds = append(kinds, f)
		}
	}
	switch {
	case len(kinds) == 0:
		l.errorf(n, "%s needs one of bump, set or count", label)
		return
	case len(kinds) > 1:
		for _, f := range kinds[1:] {
			l.errorf(f.Key, "%s has both %s and %s; a rule has exactly one", label, kinds[0].Key.Value, f.Key.Value)
		}
	}
	switch v := kinds[0].Value; kinds[0] {
	case d.Bump:
		r.Kind = rules.BumpRule
		r.Key = l.template(v, "bump")
	case d.Set:
		r.Kind = rules.SetRule
		var s setDecl
		if l.decode(r, v, "set", &s) != nil {
			l.queried(r, v, "set", "load", queryDecl{Key: s.Key, Member: s.Member, Query: s.Load, Args: s.Args, Keys: s.Keys})
		}
	case d.Count:
		r.Kind = rules.CountRule
		var c countDecl
		if l.decode(r, v, "count", &c) != nil {
			l.queried(r, v, "count", "recount", queryDecl{Key: c.Key, Query: c.Recount, Args: c.Args, Keys: c.Keys})
		}
	}
}

// decode decodes the mapping v of rule r at path into decl, adding where
// its values are to r.At; it returns nil when v is not a mapping.
func (l *fileLoader) decode(r *rules.Rule, v *yaml.Node, path string, decl any) *yamlfile.Decoder {
	dec := &yamlfile.Decoder{Errorf: l.errorf}
	if dec.Decode(v, path, decl); !dec.Readable(path) {
		return nil
	}
	r.At = locations(r.At, "", dec)
	return dec
}

// queried reads the mapping v of a set or count rule (kind), declared
// by q; queryField names its query (load or recount).
func (l *fileLoader) queried(r *rules.Rule, v *yaml.Node, kind, queryField string, q queryDecl) {
	if q.Key != nil {
		r.Key = l.template(q.Key, kind+" key")
	} else {
		l.errorf(v, "%s: %s", kind, yamlfile.MissingKey("key"))
	}
	if kind == "set" {
		if q.Member != nil {
			r.Member = l.template(q.Member, "set member")
		} else {
			l.errorf(v, "set: %s", yamlfile.MissingKey("member"))
		}
	}
	var queryNode, argsNode, keysNode *yaml.Node
	if q.Query != nil {
		if s, ok := l.str(q.Query, queryField); ok {
			r.Query = s
			queryNode = q.Query
		}
	}
	if q.Keys != nil {
		if s, ok := l.str(q.Keys, "keys"); ok {
			r.Keys = s
			keysNode = q.Keys
		}
	}
	argsBad := false
	if f := q.Args; f.Value != nil {
		argsNode = f.Key
		if names, ok := l.names(f.Value, "args", true); ok {
			if len(names) == 0 {
				l.errorf(f.Value, "args must list at least one column")
			}
			r.Args = names
		} else {
			argsBad = true
		}
	}
	l.checkArgs(r, queryField, queryNode, argsNode, argsBad)
	if keysNode != nil {
		l.checkKeysQuery(r, keysNode, queryNode != nil, queryField)
	}
}

// checkArgs checks args against the query: args need a query, and the
// query's '?' placeholders must match args, or by default the key's
// placeholder columns.
func (l *fileLoader) checkArgs(r *rules.Rule, queryField string, queryNode, argsNode *yaml.Node, argsBad bool) {
	if argsNode != nil && queryNode == nil {
		l.errorf(argsNode, "args given without %s", queryField)
		r.Args = nil
	}
	if queryNode == nil {
		return
	}
	argsFrom := "args"
	if argsNode == nil && r.Key != nil {
		r.Args = r.Key.Columns()
		argsFrom = "the key's placeholders (default args)"
	}
	if (argsNode != nil && !argsBad) || (argsNode == nil && r.Key != nil) {
		if got := rules.CountPlaceholders(r.Query); got != len(r.Args) {
			l.errorf(queryNode, "%s has %d '?' placeholder(s) but %s name %d column(s)", queryField, got, argsFrom, len(r.Args))
		}
	}
}

// ruleOn reads the operations the rule acts on; insert, update and delete
// when left out.
func (l *fileLoader) ruleOn(r *rules.Rule, v *yaml.Node) {
	if v == nil {
		r.On = []rules.Operation{rules.Insert, rules.Update, rules.Delete}
		return
	}
	if v.Kind != yaml.SequenceNode {
		l.errorf(v, "%s", yamlfile.WrongKind("on", "a list such as [insert, update, delete]", v))
		return
	}
	if len(v.Content) == 0 {
		l.errorf(v, "on must list at least one operation")
	}
	var listed uint8
	for _, item := range v.Content {
		item = yamlfile.Resolve(item)
		op, ok := rules.Operation(0), false
		if item.Kind == yaml.ScalarNode {
			op, ok = rules.ParseOperation(item.Value)
		}
		if !ok {
			l.errorf(item, "unknown operation %q in on (want insert, update, delete, read or truncate)", item.Value)
			continue
		}
		if listed&(1<<op) != 0 {
			l.errorf(item, "operation %q listed twice in on", item.Value)
			continue
		}
		if op == rules.Truncate {
			switch {
			case r.Kind != rules.BumpRule && r.Kind != 0:
				l.errorf(item, "truncate is allowed only in bump rules")
				continue
			case r.Key != nil && r.Key.HasPlaceholders():
				l.errorf(item, "truncate needs a bump key without placeholders; %q has some", r.Key.String())
				continue
			}
		}
		listed |= 1 << op
		r.On = append(r.On, op)
	}
}

// ruleWhen reads and compiles the rule's predicate, locating its syntax
// errors in the file.
func (l *fileLoader) ruleWhen(r *rules.Rule, v *yaml.Node) {
	s, ok := l.optStr(v, "when")
	if !ok {
		return
	}
	err := rules.CheckPredicate(s)
	if err == nil {
		r.When = s
		return
	}
	var ee *rules.PredicateError
	if !errors.As(err, &ee) {
		l.errorf(v, "when: %v", err)
		return
	}
	line, col, exact := l.locateInScalar(v, ee.Line, ee.Column)
	if exact {
		l.errorAt(line, col, "when: %s", ee.Msg)
	} else {
		l.errorAt(line, col, "when: %s (line %d, column %d of the expression)", ee.Msg, ee.Line, ee.Column+1)
	}
}

// ruleBumpOptions reads columns, ttl, rebump_after, copies and evidence;
// all but ttl are for bump rules only.
func (l *fileLoader) ruleBumpOptions(r *rules.Rule, d *ruleDecl) {
	notBump := r.Kind != rules.BumpRule && r.Kind != 0
	if f := d.Columns; f.Value != nil {
		if notBump {
			l.errorf(f.Key, "columns is allowed only in bump rules")
		} else if names, ok := l.names(f.Value, "columns", false); ok {
			if len(names) == 0 {
				l.errorf(f.Value, "columns must list at least one column")
			}
			r.Columns = names
		}
	}
	if v := d.TTL; v != nil {
		if ttl, ok := l.duration(v, "ttl"); ok {
			switch {
			case ttl%time.Second != 0:
				l.errorf(v, "ttl must be whole seconds")
			case ttl > rules.MaxTTL:
				l.errorf(v, "ttl %s exceeds 30 days, which memcached would read as a Unix time", ttl)
			default:
				r.TTL = ttl
			}
		}
	}
	if f := d.RebumpAfter; f.Value != nil {
		if notBump {
			l.errorf(f.Key, "rebump_after is allowed only in bump rules")
		} else if after, ok := l.duration(f.Value, "rebump_after"); ok {
			r.RebumpAfter = after
		}
	}
	if f := d.Copies; f.Value != nil {
		if notBump {
			l.errorf(f.Key, "copies is allowed only in bump rules")
		} else if n, ok := l.integer(f.Value, "copies", 2, rules.MaxCopies); ok {
			r.Copies = n
		}
	}
	if f := d.Evidence; f.Value != nil {
		switch {
		case notBump:
			l.errorf(f.Key, "evidence is allowed only in bump rules")
		case r.Copies != 0:
			l.errorf(f.Key, "a rule has copies or evidence, not both")
		default:
			r.Evidence = l.evidence(r, f.Value)
		}
	}
}

// AcceptFolding is the one value of a rule's collation field.
const AcceptFolding = "accept-folding"

// ruleCollation reads the rule's collation field: "accept-folding", which
// accepts key, member and args columns whose collation compares different
// bytes as equal (rules.Rule.AcceptFolding).
func (l *fileLoader) ruleCollation(r *rules.Rule, v *yaml.Node) {
	s, ok := l.optStr(v, "collation")
	if !ok {
		return
	}
	if s != AcceptFolding {
		l.errorf(v, "collation %q: want %q (the only value; leave collation out to have folding collations reported)", s, AcceptFolding)
		return
	}
	r.AcceptFolding = true
}

// locations adds where each value dec read is to at, by its path inside
// parent ("rule": "ttl"; "": "set.key").
func locations(at map[string]rules.Location, parent string, dec *yamlfile.Decoder) map[string]rules.Location {
	if at == nil {
		at = make(map[string]rules.Location, len(dec.Places()))
	}
	for path, p := range dec.Places() {
		if parent != "" {
			var ok bool
			if path, ok = strings.CutPrefix(path, parent+"."); !ok {
				continue
			}
		}
		at[path] = rules.Location{Line: p.Line, Column: p.Column}
	}
	return at
}

// integer reads an integer field from lo to hi.
func (l *fileLoader) integer(n *yaml.Node, what string, lo, hi int) (int, bool) {
	v, ok := yamlfile.Int(n, what, int64(lo), int64(hi), l.errorf)
	return int(v), ok
}

// evidence reads a bump rule's evidence mapping: master, bits, max_set.
func (l *fileLoader) evidence(r *rules.Rule, n *yaml.Node) *rules.Evidence {
	var d evidenceDecl
	if l.decode(r, n, "evidence", &d) == nil {
		return nil
	}
	ev := &rules.Evidence{}
	bad := false
	if d.Master == nil {
		l.errorf(n, "evidence: %s", yamlfile.MissingKey("master"))
		bad = true
	} else if ev.Master = l.template(d.Master, "evidence master"); ev.Master == nil {
		bad = true
	} else if ev.Master.HasPlaceholders() {
		l.errorf(d.Master, "evidence master %q must not have placeholders: one master serves every entity", ev.Master.String())
		bad = true
	}
	ev.Bits = rules.DefaultEvidenceBits
	if v := d.Bits; v != nil {
		if b, ok := l.integer(v, "evidence bits", 8, rules.MaxEvidenceBits); !ok {
			bad = true
		} else if b%8 != 0 {
			l.errorf(v, "evidence bits %d must be a multiple of 8", b)
			bad = true
		} else {
			ev.Bits = b
		}
	}
	if v := d.MaxSet; v != nil {
		if m, ok := l.integer(v, "evidence max_set", 1, ev.Bits); ok {
			ev.MaxSet = m
		} else {
			bad = true
		}
	}
	if r.Key != nil {
		cols := map[string]bool{}
		for _, c := range r.Key.Columns() {
			cols[c] = true
		}
		if len(cols) != 1 {
			l.errorf(n, "evidence needs a bump key with one placeholder column, the entity id; %q has %d", r.Key.String(), len(cols))
			bad = true
		}
	}
	if bad {
		return nil
	}
	return ev
}

// checkKeysQuery validates a set or count rule's keys query: it is only
// useful with the query that gives the truth to compare with, takes no
// '?' placeholder, and the key must have placeholders from which every
// argument of that query can be bound.
func (l *fileLoader) checkKeysQuery(r *rules.Rule, keysNode *yaml.Node, hasQuery bool, queryField string) {
	if !hasQuery {
		l.errorf(keysNode, "keys needs %s: verification compares the cache with its result", queryField)
		return
	}
	if n := rules.CountPlaceholders(r.Keys); n > 0 {
		l.errorf(keysNode, "keys must not have '?' placeholders (found %d); it lists every key", n)
		return
	}
	if r.Key == nil {
		return
	}
	if !r.Key.HasPlaceholders() {
		l.errorf(keysNode, "keys is for key templates with placeholders; %q has none", r.Key.String())
		return
	}
	inKey := make(map[string]bool)
	for _, c := range r.Key.Columns() {
		inKey[c] = true
	}
	for _, a := range r.Args {
		if !inKey[a] {
			l.errorf(keysNode, "keys cannot be used: %s argument %q is not a placeholder of key %q", queryField, a, r.Key.String())
			return
		}
	}
}

// locateInScalar maps a position inside a scalar's value (1-based line,
// 0-based rune column) to a file position. exact is false when the
// scalar's style makes that impossible (folded text, escapes before the
// position); the scalar's own position is returned then.
func (l *fileLoader) locateInScalar(n *yaml.Node, line, col int) (fileLine, fileCol int, exact bool) {
	if l.lines == nil {
		l.lines = strings.Split(string(l.data), "\n")
	}
	valueLines := strings.Split(n.Value, "\n")
	if line < 1 || line > len(valueLines) {
		return n.Line, n.Column, false
	}
	want := []rune(valueLines[line-1])
	if col > len(want) {
		return n.Line, n.Column, false
	}
	want = want[:col]
	rawLine := func(i int) []rune {
		if i < 1 || i > len(l.lines) {
			return nil
		}
		return []rune(strings.TrimSuffix(l.lines[i-1], "\r"))
	}
	hasPrefixAt := func(raw []rune, at int) bool {
		if at < 0 || at+len(want) > len(raw) {
			return false
		}
		for i, r := range want {
			if raw[at+i] != r {
				return false
			}
		}
		return true
	}
	switch n.Style {
	case 0, yaml.SingleQuotedStyle, yaml.DoubleQuotedStyle, yaml.FlowStyle:
		if len(valueLines) != 1 {
			break
		}
		at := n.Column - 1
		if n.Style == yaml.SingleQuotedStyle || n.Style == yaml.DoubleQuotedStyle {
			at++
		}
		if hasPrefixAt(rawLine(n.Line), at) {
			return n.Line, at + col + 1, true
		}
	case yaml.LiteralStyle:
		// Content line k is on the k-th file line after the indicator,
		// indented by the block's indentation.
		fl := n.Line + line
		raw := rawLine(fl)
		indent := len(raw) - utf8.RuneCountInString(valueLines[line-1])
		if hasPrefixAt(raw, indent) {
			return fl, indent + col + 1, true
		}
	}
	return n.Line, n.Column, false
}
