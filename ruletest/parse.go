// Package ruletest runs rule unit tests: YAML files that list CDC message
// values and the cache operations they must produce. Messages go through
// the same decoder (package cdc) and planner (package rules) as in the
// daemon, so a passing test says what the daemon will do.
//
// A test file looks like this (paths are relative to the test file):
//
//	rule_files: [../shop.yaml]
//	format: auto              # optional default for every test
//	table: shop.users         # optional default, for flattened rows
//	tests:
//	  - name: an approved comment moves to another post
//	    events:               # a JSON string, a mapping written as JSON, or null (tombstone)
//	      - '{"op":"u","before":{...},"after":{...},"source":{"db":"blog","table":"comments"}}'
//	    expect:               # every op, in order; [] for none
//	      - {event: 1, rule: post-comments, op: count, key: "blog:comments:9", delta: -1}
//	    errors:               # optional: events that must fail
//	      - {event: 2, contains: "missing column"}
//
// The format is described for users in docs/rules.md.
//
// It talks to no service: it checks what the rules plan, not what memcached
// or MySQL then hold (packages verify and observer do), nor the rules
// against a live schema (package check).
package ruletest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cachewarden/cachewarden/decode"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
)

// Suite is one parsed test file. It is read-only after Parse and safe for
// concurrent use.
type Suite struct {
	// Path is the test file's path as given.
	Path string
	// RuleFiles are the rule files or directories to load, resolved
	// against the test file's directory.
	RuleFiles []string
	Tests     []*Test
}

// Test is one named test case.
type Test struct {
	Name string
	// Line is where the test's entry starts in the file.
	Line   int
	Format decode.Format
	// Table is the db.table of flattened rows that name no table.
	Table  string
	Events []Event
	Expect []ExpectedOp
	// Errors lists the events that must fail to decode or plan.
	Errors []ExpectedError
	// checkArgs is true when some expected op lists args; then every
	// op's args are compared.
	checkArgs bool
}

// Event is one message value of a test.
type Event struct {
	// Value is the message value; nil is a tombstone.
	Value []byte
	// Line is where the event is written in the test file.
	Line int
}

// ExpectedOp is one operation a test expects.
type ExpectedOp struct {
	// Event is the 1-based index of the event that produces the op.
	Event  int
	Rule   string
	Op     rules.OpKind
	Key    string
	Member string
	Delta  int64
	// Args are the expected query arguments as text (nil entries are
	// NULL); compared only when HasArgs is true.
	Args    []*string
	HasArgs bool
	// Line is where the expectation is written.
	Line int
}

// ExpectedError says that an event must fail with a message containing
// Contains.
type ExpectedError struct {
	Event    int
	Contains string
	Line     int
}

// ParseError lists every problem found in a test file.
type ParseError struct {
	// Problems are "file:line:col: message" strings in file order.
	Problems []string
}

func (e *ParseError) Error() string { return strings.Join(e.Problems, "\n") }

// Load reads and parses the test file at path.
func Load(path string) (*Suite, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ruletest: %w", err)
	}
	return Parse(path, data)
}

// Parse parses a test file's contents. path names the file in error
// messages and anchors relative rule_files. Unknown fields, duplicate
// fields, missing required fields and values of the wrong type are errors;
// all of them are returned together as a *ParseError.
func Parse(path string, data []byte) (*Suite, error) {
	p := &parser{file: path}
	root, err := yamlfile.Parse(data)
	var ye *yamlfile.Error
	if errors.As(err, &ye) {
		p.errorf(&yaml.Node{Line: ye.Line, Column: ye.Column}, "%s", ye.Msg)
		if root == nil {
			return nil, p.result()
		}
	}
	s := &Suite{Path: path}
	if root == nil {
		return nil, &ParseError{Problems: []string{path + ":1:1: empty test file"}}
	}
	p.suite(s, root)
	if len(p.problems) > 0 {
		return nil, p.result()
	}
	return s, nil
}

type parser struct {
	file     string
	problems []problem
}

type problem struct {
	line, col int
	msg       string
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.problems = append(p.problems, problem{n.Line, n.Column, fmt.Sprintf(format, args...)})
}

// result returns the problems sorted by position.
func (p *parser) result() error {
	sort.SliceStable(p.problems, func(i, j int) bool {
		return p.problems[i].line < p.problems[j].line ||
			p.problems[i].line == p.problems[j].line && p.problems[i].col < p.problems[j].col
	})
	out := make([]string, len(p.problems))
	for i, pr := range p.problems {
		out[i] = fmt.Sprintf("%s:%d:%d: %s", p.file, pr.line, pr.col, pr.msg)
	}
	return &ParseError{Problems: out}
}

// decode decodes the mapping n into decl (see yamlfile.Decoder); what
// names the mapping in messages. It returns false when n is not a
// mapping.
func (p *parser) decode(n *yaml.Node, what string, decl any) bool {
	d := yamlfile.Decoder{Errorf: p.errorf}
	d.Decode(n, what, decl)
	return d.Readable(what)
}

// The keys of a test file, of a test, of an expected op and of an
// expected error; the parser reads each value.
type (
	suiteDecl struct {
		RuleFiles *yaml.Node `yaml:"rule_files"`
		Format    *yaml.Node `yaml:"format"`
		Table     *yaml.Node `yaml:"table"`
		Tests     *yaml.Node `yaml:"tests"`
	}
	testDecl struct {
		Name   *yaml.Node `yaml:"name"`
		Format *yaml.Node `yaml:"format"`
		Table  *yaml.Node `yaml:"table"`
		Events *yaml.Node `yaml:"events"`
		Expect *yaml.Node `yaml:"expect"`
		Errors *yaml.Node `yaml:"errors"`
	}
	opDecl struct {
		Event  *yaml.Node     `yaml:"event"`
		Rule   *yaml.Node     `yaml:"rule"`
		Op     *yaml.Node     `yaml:"op"`
		Key    *yaml.Node     `yaml:"key"`
		Member yamlfile.Field `yaml:"member"`
		Delta  yamlfile.Field `yaml:"delta"`
		Args   *yaml.Node     `yaml:"args"`
	}
	errorDecl struct {
		Event    *yaml.Node `yaml:"event"`
		Contains *yaml.Node `yaml:"contains"`
	}
)

// missing reports each required key of the mapping n (named what) that
// is left out, given as name, value pairs; it returns false when one is.
func (p *parser) missing(n *yaml.Node, what string, pairs ...any) bool {
	ok := true
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1].(*yaml.Node) == nil {
			p.errorf(n, "%s: %s", what, yamlfile.MissingKey(pairs[i].(string)))
			ok = false
		}
	}
	return ok
}

func (p *parser) suite(s *Suite, n *yaml.Node) {
	var d suiteDecl
	if !p.decode(n, "test file", &d) {
		return
	}
	var format decode.Format
	var table string
	if d.RuleFiles != nil {
		s.RuleFiles = p.ruleFiles(d.RuleFiles)
	}
	if d.Format != nil {
		format, _ = p.format(d.Format)
	}
	if d.Table != nil {
		table, _ = p.table(d.Table)
	}
	tests := d.Tests
	if p.missing(n, "test file", "rule_files", d.RuleFiles, "tests", tests); tests == nil {
		return
	}
	if tests.Kind != yaml.SequenceNode || len(tests.Content) == 0 {
		p.errorf(tests, "tests must be a non-empty list")
		return
	}
	names := make(map[string]int)
	for _, tn := range tests.Content {
		t := p.test(yamlfile.Resolve(tn), format, table)
		if t == nil {
			continue
		}
		if prev, dup := names[t.Name]; dup {
			p.errorf(tn, "test %q: name already used by the test at line %d", t.Name, prev)
		}
		names[t.Name] = t.Line
		s.Tests = append(s.Tests, t)
	}
}

func (p *parser) ruleFiles(n *yaml.Node) []string {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.errorf(n, "rule_files must be a non-empty list of paths")
		return nil
	}
	dir := filepath.Dir(p.file)
	var out []string
	for _, e := range n.Content {
		f, ok := yamlfile.String(yamlfile.Resolve(e), "rule_files entry", p.errorf)
		if !ok {
			continue
		}
		if f == "" {
			p.errorf(e, "rule_files entry is empty")
			continue
		}
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		out = append(out, f)
	}
	return out
}

// table decodes a "db.table" name.
func (p *parser) table(n *yaml.Node) (string, bool) {
	s, ok := yamlfile.String(n, "table", p.errorf)
	if !ok {
		return "", false
	}
	if db, tbl, dotted := strings.Cut(s, "."); !dotted || db == "" || tbl == "" {
		p.errorf(n, "table %q: want db.table", s)
		return "", false
	}
	return s, true
}

func (p *parser) format(n *yaml.Node) (decode.Format, bool) {
	s, ok := yamlfile.String(n, "format", p.errorf)
	if !ok {
		return decode.FormatAuto, false
	}
	f, err := decode.ParseFileFormat(s)
	if err != nil {
		// Test events are JSON; Avro messages are binary.
		p.errorf(n, "format %q: want %s (test events are JSON)", s, decode.Alternatives(decode.FileNames()))
		return decode.FormatAuto, false
	}
	return f, true
}

func (p *parser) test(n *yaml.Node, format decode.Format, table string) *Test {
	t := &Test{Line: n.Line, Format: format, Table: table}
	var d testDecl
	if !p.decode(n, "test", &d) {
		return nil
	}
	var nameOK bool
	if d.Name != nil {
		t.Name, nameOK = yamlfile.String(d.Name, "name", p.errorf)
	}
	if d.Format != nil {
		t.Format, _ = p.format(d.Format)
	}
	if d.Table != nil {
		t.Table, _ = p.table(d.Table)
	}
	events, expect, errs := d.Events, d.Expect, d.Errors
	if p.missing(n, "test", "name", d.Name) && nameOK && t.Name == "" {
		p.errorf(n, "test: name must not be empty")
	}
	what := fmt.Sprintf("test %q", t.Name)
	if t.Name == "" {
		what = fmt.Sprintf("test at line %d", t.Line)
	}
	if events == nil {
		p.errorf(n, "%s: %s", what, yamlfile.MissingKey("events"))
	} else if events.Kind != yaml.SequenceNode || len(events.Content) == 0 {
		p.errorf(events, "%s: events must be a non-empty list", what)
	} else {
		for _, e := range events.Content {
			t.Events = append(t.Events, p.event(e, what))
		}
	}
	if expect == nil {
		p.errorf(n, "%s: %s (write expect: [] when no op is expected)", what, yamlfile.MissingKey("expect"))
	} else if expect.Kind != yaml.SequenceNode {
		p.errorf(expect, "%s: %s", what, yamlfile.WrongKind("expect", "a list", expect))
	} else {
		for _, e := range expect.Content {
			if op, ok := p.expectedOp(yamlfile.Resolve(e), what, len(t.Events)); ok {
				if len(t.Expect) > 0 && op.Event < t.Expect[len(t.Expect)-1].Event {
					p.errorf(e, "%s: expected ops must be listed in event order (event %d after event %d)", what, op.Event, t.Expect[len(t.Expect)-1].Event)
				}
				t.checkArgs = t.checkArgs || op.HasArgs
				t.Expect = append(t.Expect, op)
			}
		}
	}
	if errs != nil {
		if errs.Kind != yaml.SequenceNode {
			p.errorf(errs, "%s: %s", what, yamlfile.WrongKind("errors", "a list", errs))
		} else {
			byEvent := make(map[int]bool)
			for _, e := range errs.Content {
				ee, ok := p.expectedError(yamlfile.Resolve(e), what, len(t.Events))
				if !ok {
					continue
				}
				if byEvent[ee.Event] {
					p.errorf(e, "%s: event %d already has an expected error", what, ee.Event)
				}
				byEvent[ee.Event] = true
				t.Errors = append(t.Errors, ee)
			}
			sort.SliceStable(t.Errors, func(i, j int) bool { return t.Errors[i].Event < t.Errors[j].Event })
		}
	}
	return t
}

func (p *parser) event(n *yaml.Node, what string) Event {
	ev := Event{Line: n.Line}
	r := yamlfile.Resolve(n)
	switch {
	case r.Kind == yaml.ScalarNode && r.Tag == "!!null":
		// A tombstone.
	case r.Kind == yaml.ScalarNode && r.Tag == "!!str":
		ev.Value = []byte(r.Value)
	case r.Kind == yaml.MappingNode:
		var buf bytes.Buffer
		if err := appendJSON(&buf, r); err != nil {
			p.errorf(err.node, "%s: event: %s", what, err.msg)
		}
		ev.Value = buf.Bytes()
	default:
		p.errorf(n, "%s: an event is a JSON string, a mapping or null (a tombstone)", what)
	}
	return ev
}

func (p *parser) eventIndex(n *yaml.Node, what string, nEvents int) (int, bool) {
	i, ok := yamlfile.Int(n, what+": event", math.MinInt64, math.MaxInt64, p.errorf)
	if !ok {
		return 0, false
	}
	if i < 1 || (nEvents > 0 && i > int64(nEvents)) {
		p.errorf(n, "%s: event %d does not exist (the test has %d events, numbered from 1)", what, i, nEvents)
		return 0, false
	}
	return int(i), true
}

func (p *parser) expectedOp(n *yaml.Node, what string, nEvents int) (ExpectedOp, bool) {
	op := ExpectedOp{Line: n.Line}
	var d opDecl
	if !p.decode(n, what+": expected op", &d) {
		return op, false
	}
	ok := p.missing(n, what+": expected op", "event", d.Event, "rule", d.Rule, "op", d.Op, "key", d.Key)
	good := true // each value read (a missing one is not)
	if d.Event != nil {
		op.Event, good = p.eventIndex(d.Event, what, nEvents)
		ok = ok && good
	}
	if d.Rule != nil {
		op.Rule, good = yamlfile.String(d.Rule, "rule", p.errorf)
		ok = ok && good
	}
	if d.Op != nil {
		var name string
		if name, good = yamlfile.String(d.Op, "op", p.errorf); good {
			if op.Op, good = rules.ParsePlannedKind(name); !good {
				p.errorf(d.Op, "%s: unknown op %q (want %s)", what, name, plannedKindNames())
			}
		}
		ok = ok && good
	}
	if d.Key != nil {
		op.Key, good = yamlfile.String(d.Key, "key", p.errorf)
		ok = ok && good
	}
	memberNode, deltaNode := d.Member.Key, d.Delta.Key // nil when absent
	if v := d.Member.Value; v != nil {
		op.Member, good = yamlfile.String(v, "member", p.errorf)
		ok = ok && good
	}
	if v := d.Delta.Value; v != nil {
		if op.Delta, good = yamlfile.Int(v, "delta", math.MinInt64, math.MaxInt64, p.errorf); good && op.Delta == 0 {
			p.errorf(v, "%s: delta 0 is never planned", what)
			good = false
		}
		ok = ok && good
	}
	if d.Args != nil {
		op.HasArgs = true
		op.Args, good = p.args(d.Args, what)
		ok = ok && good
	}
	if !ok {
		return op, false
	}
	isSet := op.Op == rules.OpSetAdd || op.Op == rules.OpSetRemove
	if isSet && memberNode == nil {
		p.errorf(n, "%s: %s needs member", what, op.Op)
		ok = false
	}
	if !isSet && memberNode != nil {
		p.errorf(memberNode, "%s: member is only for set_add and set_remove", what)
		ok = false
	}
	if op.Op == rules.OpCount && deltaNode == nil {
		p.errorf(n, "%s: count needs delta", what)
		ok = false
	}
	if op.Op != rules.OpCount && deltaNode != nil {
		p.errorf(deltaNode, "%s: delta is only for count", what)
		ok = false
	}
	return op, ok
}

func (p *parser) args(n *yaml.Node, what string) ([]*string, bool) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, "%s: %s", what, yamlfile.WrongKind("args", "a list", n))
		return nil, false
	}
	out := make([]*string, 0, len(n.Content))
	for _, e := range n.Content {
		e = yamlfile.Resolve(e)
		if e.Kind == yaml.ScalarNode && e.Tag == "!!null" {
			out = append(out, nil)
			continue
		}
		s, ok := yamlfile.String(e, "args entry", p.errorf)
		if !ok {
			return nil, false
		}
		out = append(out, &s)
	}
	return out, true
}

func (p *parser) expectedError(n *yaml.Node, what string, nEvents int) (ExpectedError, bool) {
	ee := ExpectedError{Line: n.Line}
	var d errorDecl
	if !p.decode(n, what+": expected error", &d) {
		return ee, false
	}
	ok := p.missing(n, what+": expected error", "event", d.Event, "contains", d.Contains)
	if d.Event != nil {
		var good bool
		ee.Event, good = p.eventIndex(d.Event, what, nEvents)
		ok = ok && good
	}
	if d.Contains != nil {
		var good bool
		ee.Contains, good = yamlfile.String(d.Contains, "contains", p.errorf)
		ok = ok && good
	}
	return ee, ok
}

// jsonError is a YAML node that has no JSON form.
type jsonError struct {
	node *yaml.Node
	msg  string
}

const (
	// maxEventDepth bounds the nesting of an event written as YAML.
	maxEventDepth = 64
	// maxEventNodes bounds the values of one event, aliases expanded.
	maxEventNodes = 1 << 20
)

// appendJSON writes a YAML node as JSON. Scalars keep their literal text:
// an integer or a decimal number is written with exactly the digits given,
// so values beyond float64 precision survive (hexadecimal and octal
// integers are converted to decimal). Mapping keys keep their order;
// aliases are expanded.
func appendJSON(buf *bytes.Buffer, n *yaml.Node) *jsonError {
	budget := maxEventNodes
	return appendJSONNode(buf, n, 0, &budget)
}

func appendJSONNode(buf *bytes.Buffer, n *yaml.Node, depth int, budget *int) *jsonError {
	n = yamlfile.Resolve(n)
	if depth > maxEventDepth {
		return &jsonError{n, "nested too deeply"}
	}
	if *budget--; *budget < 0 {
		return &jsonError{n, fmt.Sprintf("more than %d values (aliases included)", maxEventNodes)}
	}
	switch n.Kind {
	case yaml.MappingNode:
		return appendJSONObject(buf, n, depth, budget)
	case yaml.SequenceNode:
		return appendJSONArray(buf, n, depth, budget)
	case yaml.ScalarNode:
		return appendJSONScalar(buf, n)
	}
	return &jsonError{n, "unsupported YAML node"}
}

// appendJSONObject appends the mapping n, at depth, as a JSON object: its
// keys must be strings, each once.
func appendJSONObject(buf *bytes.Buffer, n *yaml.Node, depth int, budget *int) *jsonError {
	buf.WriteByte('{')
	first := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := yamlfile.Resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			return &jsonError{k, "object keys must be strings"}
		}
		if line, dup := first[k.Value]; dup {
			return &jsonError{k, yamlfile.DuplicateKey(k.Value, line)}
		}
		first[k.Value] = k.Line
		if i > 0 {
			buf.WriteByte(',')
		}
		writeJSONString(buf, k.Value)
		buf.WriteByte(':')
		if err := appendJSONNode(buf, n.Content[i+1], depth+1, budget); err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

// appendJSONArray appends the sequence n, at depth, as a JSON array.
func appendJSONArray(buf *bytes.Buffer, n *yaml.Node, depth int, budget *int) *jsonError {
	buf.WriteByte('[')
	for i, e := range n.Content {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := appendJSONNode(buf, e, depth+1, budget); err != nil {
			return err
		}
	}
	buf.WriteByte(']')
	return nil
}

// appendJSONScalar appends the scalar n as JSON: null, a boolean, a
// number in JSON's syntax, or a string; other tags have no JSON form.
func appendJSONScalar(buf *bytes.Buffer, n *yaml.Node) *jsonError {
	switch n.Tag {
	case "!!null":
		buf.WriteString("null")
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return &jsonError{n, err.Error()}
		}
		if b {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case "!!int":
		if isJSONNumber(n.Value) {
			buf.WriteString(n.Value)
			break
		}
		var i big.Int
		if _, ok := i.SetString(strings.TrimPrefix(n.Value, "+"), 0); !ok {
			return &jsonError{n, fmt.Sprintf("integer %s has no JSON form; quote it", n.Value)}
		}
		buf.WriteString(i.String())
	case "!!float":
		v := strings.TrimPrefix(n.Value, "+")
		if !isJSONNumber(v) {
			return &jsonError{n, fmt.Sprintf("number %s has no JSON form; write it like 1.5 or 2e-3", n.Value)}
		}
		buf.WriteString(v)
	case "!!str":
		writeJSONString(buf, n.Value)
	default:
		return &jsonError{n, fmt.Sprintf("values tagged %s have no JSON form", n.Tag)}
	}
	return nil
}

func writeJSONString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // writing a string to a bytes.Buffer cannot fail
	buf.Truncate(buf.Len() - 1)
}

// isJSONNumber reports whether s is a number in RFC 8259 syntax.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		start := i + 1
		if i = skipDigits(s, start); i == start {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		if i = skipDigits(s, start); i == start {
			return false
		}
	}
	return i == len(s)
}

// skipDigits returns the index of the first byte from i on in s that is
// not a decimal digit.
func skipDigits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// plannedKindNames lists the op names a test may expect: "bump, set_add
// or recount".
func plannedKindNames() string {
	names := make([]string, len(rules.PlannedKinds))
	for i, k := range rules.PlannedKinds {
		names[i] = k.String()
	}
	return decode.Alternatives(names)
}
