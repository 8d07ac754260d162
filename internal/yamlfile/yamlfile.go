// Package yamlfile reads the project's strict YAML files: the daemon's
// config (package config), rule files (rules/rulefile) and rule tests
// (ruletest). It parses one document into a yaml.Node tree, locates a
// syntax error at the line and column where the parser stopped, decodes
// a node into the Go structure a file kind declares (Decoder, decode.go:
// each key spelt once, in a struct tag; every value's place recorded by
// its dotted path), and words each mistake every such file can hold once:
//
//	duplicate key "x" (first at line 3)
//	unknown key "x" (known: a, b, c)
//	keys must be plain names
//	merge keys (<<) are not supported; write the keys out
//	missing required key "x"
//	x must be a mapping, not a list
//	x: "many" is not an integer         (and a number, boolean, duration)
//	x must be an integer, not a string  (String and Int, of rule files and tests)
//	only one YAML document is allowed
//	YAML: did not find expected ',' or ']'
//
// Aliases are followed wherever a value is read (Resolve); an anchor that
// is not defined is a syntax error at the alias.
//
// It bounds every file (limits.go): its size (ReadFile reads no more),
// its nesting and what its aliases expand to. Apart from ReadFile it only
// parses bytes (no I/O), so the pure packages may use it. Its functions
// are safe for concurrent use.
//
// It knows no file's keys: config, rulefile and ruletest each declare the
// keys of their own files (tagged structs) and what their values mean
// beyond their type.
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is a mistake found while parsing, at a 1-based line and column.
type Error struct {
	Line, Column int
	Msg          string
}

func (e *Error) Error() string { return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg) }

// MultipleDocuments is the message for a file holding a second document.
const MultipleDocuments = "only one YAML document is allowed"

// Parse parses data as one YAML document and returns its root node, or
// nil when the file holds no document (empty, or only comments). A syntax
// error, or a second document, is returned as an *Error; when the first
// document itself parsed, its root is returned with that error, so that
// a reader can report the problems of the first document too.
//
// A file of more than MaxFileBytes, or whose document nests deeper than
// MaxDepth or expands through aliases beyond MaxAliasBytes, or holds an
// alias to a value that holds it, is refused with an *Error and no root.
func Parse(data []byte) (*yaml.Node, error) {
	if len(data) > MaxFileBytes {
		return nil, tooLarge(len(data))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(data, err)
	}
	var root *yaml.Node
	if doc.Kind != yaml.DocumentNode {
		root = &doc
	} else if len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	if err := bounds(root); err != nil {
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return root, &Error{Line: extra.Line, Column: extra.Column, Msg: MultipleDocuments}
	} else if !errors.Is(err, io.EOF) {
		return root, syntaxError(data, err)
	}
	return root, nil
}

// Resolve follows aliases to the node they name; it returns n itself when
// n is no alias, and nil for nil.
func Resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// IsNull reports whether n (aliases followed) is a null scalar: `~`,
// `null` or nothing.
func IsNull(n *yaml.Node) bool {
	n = Resolve(n)
	return n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// Kind names what n holds, as messages say it: "a mapping", "a list",
// "null", "a string", "an integer", "a number", "a boolean" or "a value".
func Kind(n *yaml.Node) string {
	n = Resolve(n)
	switch {
	case n == nil:
		return "nothing"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind != yaml.ScalarNode:
		return "a value"
	}
	switch n.Tag {
	case "!!null":
		return "null"
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	}
	return "a value"
}

// WrongKind words a value of the wrong type: what names the value, want
// says what it must be ("a mapping", "a list of paths").
func WrongKind(what, want string, n *yaml.Node) string {
	return fmt.Sprintf("%s must be %s, not %s", what, want, Kind(n))
}

// MissingKey words a required key that is left out.
func MissingKey(key string) string { return fmt.Sprintf("missing required key %q", key) }

// DuplicateKey words a key given a second time in one mapping.
func DuplicateKey(key string, firstLine int) string {
	return fmt.Sprintf("duplicate key %q (first at line %d)", key, firstLine)
}

// UnknownKey words a key that the mapping does not have.
func UnknownKey(key string, known []string) string {
	return fmt.Sprintf("unknown key %q (known: %s)", key, strings.Join(known, ", "))
}

// Message texts of mistakes in keys.
const (
	NonScalarKey = "keys must be plain names"
	MergeKey     = "merge keys (<<) are not supported; write the keys out"
)

// In prefixes msg with where ("kafka.sasl", "rule \"x\""), unless where
// is empty (the top level of a file).
func In(where, msg string) string {
	if where == "" {
		return msg
	}
	return where + ": " + msg
}

// Errorf records a problem at a node; the three readers each keep their
// own list.
type Errorf func(n *yaml.Node, format string, args ...any)

// Field is one key of a mapping and its value, aliases followed.
type Field struct {
	Key, Value *yaml.Node
}

// Fields are the known keys of one mapping, in file order.
type Fields []Field

// Get returns the field named name.
func (fs Fields) Get(name string) (Field, bool) {
	for _, f := range fs {
		if f.Key.Value == name {
			return f, true
		}
	}
	return Field{}, false
}

// Has reports whether the field named name is present.
func (fs Fields) Has(name string) bool {
	_, ok := fs.Get(name)
	return ok
}

// Mapping reads the keys of mapping n (aliases followed) and returns the
// known ones, first occurrence only, in file order. It reports through
// errorf, each prefixed with where (see In): a value that is not a
// mapping (null included; ok is false then), keys that are not plain
// names, merge keys, duplicate keys and keys not in known (listed in the
// order given).
func Mapping(n *yaml.Node, where string, known []string, errorf Errorf) (fs Fields, ok bool) {
	n = Resolve(n)
	if n.Kind != yaml.MappingNode {
		what := where
		if what == "" {
			what = "the top level"
		}
		errorf(n, "%s", WrongKind(what, "a mapping", n))
		return nil, false
	}
	return keys(n, where, known, errorf), true
}

// Keys returns the keys of mapping n (its values' aliases followed),
// first occurrence only, in file order, whatever their names: for
// mappings whose keys are data (a map of addresses to weights, say). It
// reports through errorf, each prefixed with where: keys that are not
// plain names, merge keys and duplicate keys.
func Keys(n *yaml.Node, where string, errorf Errorf) Fields {
	return keys(n, where, nil, errorf)
}

// keys is Keys, reporting keys not in known too unless known is nil, every
// problem in file order.
func keys(n *yaml.Node, where string, known []string, errorf Errorf) Fields {
	var fs Fields
	first := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := Resolve(n.Content[i]), Resolve(n.Content[i+1])
		switch {
		case k.Kind != yaml.ScalarNode:
			errorf(k, "%s", In(where, NonScalarKey))
			continue
		case k.Tag == "!!merge":
			errorf(k, "%s", In(where, MergeKey))
			continue
		}
		if line, dup := first[k.Value]; dup {
			errorf(k, "%s", In(where, DuplicateKey(k.Value, line)))
			continue
		}
		first[k.Value] = k.Line
		if known != nil && !slices.Contains(known, k.Value) {
			errorf(k, "%s", In(where, UnknownKey(k.Value, known)))
			continue
		}
		fs = append(fs, Field{Key: k, Value: v})
	}
	return fs
}
