package yamlfile

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Pos is a 1-based line and column in a file.
type Pos struct{ Line, Column int }

// At returns where n is.
func At(n *yaml.Node) Pos { return Pos{n.Line, n.Column} }

// Decoder decodes a yaml.Node into a declared Go structure: each struct
// field tagged `yaml:"name"` is the key name of its mapping, spelt once;
// fields without a tag, or tagged "-", are not read. It records where
// every value was written by its dotted path ("kafka.tls.enabled",
// "kafka.topics[2]", `memcached.weights["a:1"]`), so that validation can
// place the problems it finds, and reports every mistake of shape through
// Errorf, each worded once for every file kind:
//
//	kafka: unknown key "x" (known: a, b, c)        (yamlfile.Mapping)
//	kafka.group must be a single value, not a list
//	batch.max_events: "many" is not an integer
//	kafka.tls.enabled: "maybe" is not true or false
//	memcached.compact_ratio: "x" is not a number
//	memcached.timeout: "20" has no unit (write e.g. 20ms or 20s)
//	mysql.query_timeout: "soon" is not a duration (e.g. 20ms, 5s, 1m)
//
// The field types it reads are strings (and types whose kind is string,
// such as the typed enumerations), bool, int, float64, time.Duration
// (a Go duration such as "20ms"; a bare number is refused, the unit is
// never guessed; a negative one too), structs (mappings; null is an empty
// mapping), []string (a list, or with the tag option "commas" a single
// scalar split on commas; empty elements are dropped), []time.Duration,
// map[string]string and map[string]int; a *yaml.Node field takes the
// value as it is (aliases followed), and a Field field its key and value,
// for the file kind to read itself (Value is nil when the key is absent).
// A null scalar is the empty
// string or false, and a mistake for an integer, a number or a duration.
//
// A Decoder is for one file and one goroutine.
type Decoder struct {
	// Errorf records a problem at a node.
	Errorf Errorf
	// Text returns a scalar's text as the file means it (config expands
	// ${NAME} here); nil means the text as written. An error is reported
	// at the value, after its path.
	Text func(string) (string, error)
	// NullIsEmpty reads a null where a mapping is declared as an empty
	// mapping (a config section left empty); else it is a mistake.
	NullIsEmpty bool

	values, keys map[string]Pos
	bad          map[string]bool
}

// Decode decodes n into the struct v points to; path is where n is
// ("" for the top level of a file).
func (d *Decoder) Decode(n *yaml.Node, path string, v any) {
	d.value(n, path, reflect.ValueOf(v).Elem(), nil)
}

// Set reports whether the file wrote the value at path.
func (d *Decoder) Set(path string) bool {
	_, ok := d.values[path]
	return ok
}

// Readable reports whether a value at path could be decoded: one that
// could not was reported already and is not to be checked again.
func (d *Decoder) Readable(path string) bool { return !d.bad[path] }

// MarkBad marks the value at path as unreadable (see Readable).
func (d *Decoder) MarkBad(path string) {
	if d.bad == nil {
		d.bad = make(map[string]bool)
	}
	d.bad[path] = true
}

// Place returns where the value at path was written or, for a value left
// out, the key of the closest enclosing mapping that is present, and
// finally the top of the file (1:1). An element of a list written as one
// string is placed at that string.
func (d *Decoder) Place(path string) Pos {
	if p, ok := d.values[path]; ok {
		return p
	}
	if i := strings.IndexByte(path, '['); i > 0 {
		if p, ok := d.values[path[:i]]; ok {
			return p
		}
	}
	for {
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			return Pos{1, 1}
		}
		path = path[:i]
		if p, ok := d.keys[path]; ok {
			return p
		}
	}
}

// Places returns where each value was written, by path; the caller must
// not change the map.
func (d *Decoder) Places() map[string]Pos { return d.values }

// KeyPlace returns where the key of the value at path was written (for a
// map entry, its key), else Place(path).
func (d *Decoder) KeyPlace(path string) Pos {
	if p, ok := d.keys[path]; ok {
		return p
	}
	return d.Place(path)
}

// remember records where the value at path (and its key, unless nil) is.
func (d *Decoder) remember(path string, key, val *yaml.Node) {
	if d.values == nil {
		d.values = make(map[string]Pos)
		d.keys = make(map[string]Pos)
	}
	if key != nil {
		d.keys[path] = At(key)
	}
	d.values[path] = At(Resolve(val))
}

// unreadable reports a value that cannot be decoded and marks its path.
func (d *Decoder) unreadable(n *yaml.Node, path, format string, args ...any) {
	d.MarkBad(path)
	d.Errorf(n, format, args...)
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	nodeType     = reflect.TypeFor[*yaml.Node]()
	fieldType    = reflect.TypeFor[Field]()
)

// value decodes n into v; opts are the field's tag options.
func (d *Decoder) value(n *yaml.Node, path string, v reflect.Value, opts []string) {
	n = Resolve(n)
	switch {
	case v.Type() == nodeType:
		v.Set(reflect.ValueOf(n))
	case v.Type() == durationType:
		if s, ok := d.scalar(n, path); ok {
			v.SetInt(int64(d.duration(n, path, s)))
		}
	case v.Kind() == reflect.Struct:
		d.mapping(n, path, v)
	case v.Kind() == reflect.Slice && v.Type().Elem() == durationType:
		d.durations(n, path, v)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		d.strings(n, path, v, slices.Contains(opts, "commas"))
	case v.Kind() == reflect.Map:
		d.stringMap(n, path, v)
	default:
		if s, ok := d.scalar(n, path); ok {
			d.setScalar(n, path, s, v)
		}
	}
}

// FieldKey returns the key a struct field is read from ("" for none: no
// yaml tag, or "-") and its tag options: `yaml:"brokers,commas"` is
// "brokers", [commas]. Decoder reads the option "commas"; a writer of
// the same declaration may give options of its own ("omitempty").
func FieldKey(f reflect.StructField) (key string, opts []string) {
	tag, ok := f.Tag.Lookup("yaml")
	if !ok || tag == "-" {
		return "", nil
	}
	parts := strings.Split(tag, ",")
	return parts[0], parts[1:]
}

// mapping decodes the mapping n into the struct v; keys not declared by
// v's fields are reported (yamlfile.Mapping, listing the known keys in
// the order of the fields), and so is a value that is
// not a mapping, whose path is then marked unreadable. Null is an empty
// mapping when NullIsEmpty is set.
func (d *Decoder) mapping(n *yaml.Node, path string, v reflect.Value) {
	if d.NullIsEmpty && IsNull(n) {
		return
	}
	t := v.Type()
	index := make(map[string]int, t.NumField())
	var known []string // in declaration order, as messages list them
	for i := range t.NumField() {
		if key, _ := FieldKey(t.Field(i)); key != "" {
			index[key] = i
			known = append(known, key)
		}
	}
	fs, ok := Mapping(n, path, known, d.Errorf)
	if !ok {
		d.MarkBad(path)
	}
	for _, f := range fs {
		full := Join(path, f.Key.Value)
		d.remember(full, f.Key, f.Value)
		i := index[f.Key.Value]
		if fv := v.Field(i); fv.Type() == fieldType {
			fv.Set(reflect.ValueOf(f))
		} else {
			_, opts := FieldKey(t.Field(i))
			d.value(f.Value, full, fv, opts)
		}
	}
}

// Join returns the dotted path of key inside path.
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// MapPath returns the path of a map's entry: path["key"].
func MapPath(path, key string) string { return path + "[" + strconv.Quote(key) + "]" }

// scalar returns a scalar's text ("" for null), or false after reporting
// a value that is no scalar, or whose text cannot be had.
func (d *Decoder) scalar(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.unreadable(n, path, "%s", WrongKind(path, "a single value", n))
		return "", false
	}
	if IsNull(n) {
		return "", true
	}
	if d.Text == nil {
		return n.Value, true
	}
	s, err := d.Text(n.Value)
	if err != nil {
		d.unreadable(n, path, "%s: %v", path, err)
		return "", false
	}
	return s, true
}

// setScalar sets v from the scalar text s at n.
func (d *Decoder) setScalar(n *yaml.Node, path, s string, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		switch strings.ToLower(s) {
		case "true", "yes", "on":
			v.SetBool(true)
		case "false", "no", "off", "":
		default:
			d.unreadable(n, path, "%s: %q is not true or false", path, s)
		}
	case reflect.Int:
		i, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
		if err != nil {
			d.unreadable(n, path, "%s: %q is not an integer", path, s)
			return
		}
		v.SetInt(int64(i))
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			d.unreadable(n, path, "%s: %q is not a number", path, s)
			return
		}
		v.SetFloat(f)
	default:
		panic(fmt.Sprintf("yamlfile: %s: cannot decode into %s", path, v.Type()))
	}
}

// duration parses a Go duration ("20ms", "1m30s").
func (d *Decoder) duration(n *yaml.Node, path, s string) time.Duration {
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		if _, numErr := strconv.ParseFloat(s, 64); numErr == nil && s != "0" {
			d.unreadable(n, path, "%s: %q has no unit (write e.g. %sms or %ss)", path, s, s, s)
		} else {
			d.unreadable(n, path, "%s: %q is not a duration (e.g. 20ms, 5s, 1m)", path, s)
		}
		return 0
	case v < 0:
		d.unreadable(n, path, "%s: %s is negative", path, s)
		return 0
	}
	return v
}

// strings decodes a list of strings into v, remembering where each
// element is by its index among those kept; with commas a single scalar
// is split on commas (after Text), so that a list can come from one
// variable. Empty elements are dropped.
func (d *Decoder) strings(n *yaml.Node, path string, v reflect.Value, commas bool) {
	var out []string
	switch {
	case n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			s, ok := d.scalar(Resolve(item), fmt.Sprintf("%s[%d]", path, i))
			d.remember(fmt.Sprintf("%s[%d]", path, len(out)), nil, item)
			if s = strings.TrimSpace(s); ok && s != "" {
				out = append(out, s)
			}
		}
	case n.Kind == yaml.ScalarNode && (commas || IsNull(n)):
		s, ok := d.scalar(n, path)
		if !ok {
			return
		}
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	default:
		d.unreadable(n, path, "%s", WrongKind(path, "a list", n))
		return
	}
	v.Set(reflect.ValueOf(out).Convert(v.Type()))
}

// durations decodes a list of durations into v; when one cannot be
// read, the list is marked unreadable too.
func (d *Decoder) durations(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.unreadable(n, path, "%s", WrongKind(path, "a list of durations such as [1s, 10s, 1m]", n))
		return
	}
	out := make([]time.Duration, 0, len(n.Content))
	for i, item := range n.Content {
		item = Resolve(item)
		p := fmt.Sprintf("%s[%d]", path, i)
		d.remember(p, nil, item)
		if s, ok := d.scalar(item, p); ok {
			out = append(out, d.duration(item, p, s))
		}
		if !d.Readable(p) {
			d.MarkBad(path) // the list as a whole is not checked then
		}
	}
	v.Set(reflect.ValueOf(out))
}

// stringMap decodes a mapping whose keys are data (map[string]string or
// map[string]int) into v, remembering each entry at MapPath.
func (d *Decoder) stringMap(n *yaml.Node, path string, v reflect.Value) {
	if IsNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.unreadable(n, path, "%s", WrongKind(path, "a mapping", n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	for _, f := range Keys(n, path, d.Errorf) {
		full := MapPath(path, f.Key.Value)
		s, ok := d.scalar(f.Value, full)
		if !ok {
			continue
		}
		d.remember(full, f.Key, f.Value)
		e := reflect.New(v.Type().Elem()).Elem()
		d.setScalar(f.Value, full, s, e)
		if d.Readable(full) {
			m.SetMapIndex(reflect.ValueOf(f.Key.Value), e)
		}
	}
	v.Set(m)
}

// String reads the scalar n (aliases followed) as text, as rule files
// and rule tests do: numbers and booleans as written, null refused. A
// value of another kind is reported through errorf ("what must be a
// string, not a list").
func String(n *yaml.Node, what string, errorf Errorf) (string, bool) {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		errorf(n, "%s", WrongKind(what, "a string", n))
		return "", false
	}
	return n.Value, true
}

// Int reads the scalar n (aliases followed) as an integer from lo to hi,
// written as one: a quoted number is a string. Mistakes are reported
// through errorf ("what must be an integer, not a string"; "what 99:
// want an integer from 1 to 8").
func Int(n *yaml.Node, what string, lo, hi int64, errorf Errorf) (int64, bool) {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		errorf(n, "%s", WrongKind(what, "an integer", n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < lo || v > hi {
		errorf(n, "%s %s: want an integer from %d to %d", what, n.Value, lo, hi)
		return 0, false
	}
	return v, true
}
