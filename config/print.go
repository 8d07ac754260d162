package config

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
)

// Redacted is what EffectiveYAML writes in place of a secret: the MySQL
// DSN's password, the SASL password and the schema registry's password.
const Redacted = redacted

// EffectiveYAML returns c as a config file that Parse reads back into the
// same Config: every setting with its value after ${NAME} expansion and
// with the defaults Parse filled in, in the file's key order, secrets
// replaced by Redacted. A "${" in a value is written "$${" so that it is
// not expanded again; rule paths are absolute, so the file loads from
// anywhere. Settings whose default is decided where they are used, not
// by Parse (the Kafka group timers, kafka.handoff_timeout and
// stall_timeout, the observer's tunables), are written only when the
// file set them. The TLS sections name their key files by path: the keys
// themselves are never in the config.
func (c *Config) EffectiveYAML() ([]byte, error) {
	out := *c
	out.Rules = nil
	for _, p := range c.Rules {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("config: rules: %w", err)
		}
		out.Rules = append(out.Rules, abs)
	}
	out.MySQL.DSN = RedactDSN(c.MySQL.DSN)
	out.Kafka.SASL.Password = redactPassword(c.Kafka.SASL.Password)
	out.Binlog.DSN = RedactDSN(c.Binlog.DSN)
	out.Kafka.SchemaRegistry.Password = redactPassword(c.Kafka.SchemaRegistry.Password)
	if len(c.Kafka.SchemaRegistry.URLs) == 0 {
		out.Kafka.SchemaRegistry = SchemaRegistry{} // its timeout is filled in, but refused without URLs
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(encode(reflect.ValueOf(out))); err != nil {
		return nil, fmt.Errorf("config: write YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: write YAML: %w", err)
	}
	return buf.Bytes(), nil
}

var durationType = reflect.TypeFor[time.Duration]()

// encode writes v as Parse reads it, from the same declaration: a struct
// is a mapping of its tagged fields in their order, a field tagged
// omitempty left out when it is zero or empty; strings are quoted (see
// str), maps written in key order, durations as Go durations, a list of
// durations on one line.
func encode(v reflect.Value) *yaml.Node {
	switch {
	case v.Type() == durationType:
		return scalar("!!str", time.Duration(v.Int()).String())
	case v.Kind() == reflect.Struct:
		n := &yaml.Node{Kind: yaml.MappingNode}
		for i := range v.NumField() {
			key, opts := yamlfile.FieldKey(v.Type().Field(i))
			f := v.Field(i)
			if key == "" || slices.Contains(opts, "omitempty") && (f.IsZero() || (f.Kind() == reflect.Map || f.Kind() == reflect.Slice) && f.Len() == 0) {
				continue
			}
			n.Content = append(n.Content, scalar("", key), encode(f))
		}
		return n
	case v.Kind() == reflect.Slice:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		if v.Type().Elem() == durationType {
			n.Style = yaml.FlowStyle
		}
		for i := range v.Len() {
			n.Content = append(n.Content, encode(v.Index(i)))
		}
		return n
	case v.Kind() == reflect.Map:
		n := &yaml.Node{Kind: yaml.MappingNode}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			n.Content = append(n.Content, str(k.String()), encode(v.MapIndex(k)))
		}
		return n
	case v.Kind() == reflect.String:
		return str(v.String())
	case v.Kind() == reflect.Bool:
		return scalar("!!bool", strconv.FormatBool(v.Bool()))
	case v.Kind() == reflect.Int:
		return scalar("!!int", strconv.FormatInt(v.Int(), 10))
	case v.Kind() == reflect.Float64:
		return scalar("!!float", strconv.FormatFloat(v.Float(), 'g', -1, 64))
	}
	panic(fmt.Sprintf("config: cannot write a %s", v.Type()))
}

func scalar(tag, v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v}
}

// str writes a string as a quoted scalar, with "${" escaped as "$${" so
// that Parse does not expand it again.
func str(s string) *yaml.Node {
	n := scalar("!!str", strings.ReplaceAll(s, "${", "$${"))
	n.Style = yaml.DoubleQuotedStyle
	return n
}
