package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// MaxKeyLen is memcached's key length limit in bytes.
const MaxKeyLen = 250

// hashedKeyHead is how many bytes of a long key are kept before "#" and
// the hash.
const hashedKeyHead = 200

const upperHex = "0123456789ABCDEF"

// needsEscape reports whether b must be written as %XX in a key or member.
func needsEscape(b byte) bool { return b <= 0x20 || b == 0x7f || b == '%' }

// AppendEscaped appends s to dst with every byte <= 0x20, 0x7f or '%'
// written as '%' and two upper-case hex digits; other bytes are kept.
func AppendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xf])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// largeValue is the length beyond which the renderers of keys and members
// make room for a value at once before escaping it into their buffer:
// growing by append, a quarter at a time, through a large value allocates
// about five times its size. (Doing so in AppendEscaped would keep it
// from being inlined.)
const largeValue = 256

// Escape returns s escaped as AppendEscaped does.
func Escape(s string) string {
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			return string(AppendEscaped(make([]byte, 0, len(s)+8), s))
		}
	}
	return s
}

// FinishKey turns a complete key (prefix + rendered template) into the
// memcached key: unchanged up to MaxKeyLen bytes, else its first 200 bytes,
// '#', and the first 32 lower-case hex digits of the SHA-256 of the whole
// key.
func FinishKey(key []byte) string {
	if len(key) <= MaxKeyLen {
		return string(key)
	}
	sum := sha256.Sum256(key)
	out := make([]byte, 0, hashedKeyHead+1+32)
	out = append(out, key[:hashedKeyHead]...)
	out = append(out, '#')
	out = hex.AppendEncode(out, sum[:16])
	return string(out)
}

// Template is a parsed key or member template such as "ns:user:{id}".
// It is immutable and safe for concurrent use.
type Template struct {
	src   string
	parts []templatePart
}

type templatePart struct {
	literal string // used when column == ""
	column  string
}

// ParseTemplate parses a template: literal bytes with {column} placeholders.
// Literal text must be legal in a memcached key (no byte <= 0x20 or 0x7f);
// braces are reserved for placeholders; column names are non-empty.
func ParseTemplate(s string) (*Template, error) {
	if s == "" {
		return nil, fmt.Errorf("empty template")
	}
	t := &Template{src: s}
	lit := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("template %q: unclosed '{' at byte %d", s, i)
			}
			name := s[i+1 : i+1+end]
			if name == "" {
				return nil, fmt.Errorf("template %q: empty placeholder at byte %d", s, i)
			}
			if strings.ContainsAny(name, "{ \t") {
				return nil, fmt.Errorf("template %q: bad placeholder name %q", s, name)
			}
			if lit < i {
				t.parts = append(t.parts, templatePart{literal: s[lit:i]})
			}
			t.parts = append(t.parts, templatePart{column: name})
			i += end + 1
			lit = i + 1
		case c == '}':
			return nil, fmt.Errorf("template %q: '}' without '{' at byte %d", s, i)
		case c <= 0x20 || c == 0x7f:
			return nil, fmt.Errorf("template %q: byte 0x%02x at %d is not allowed in a memcached key", s, c, i)
		}
	}
	if lit < len(s) {
		t.parts = append(t.parts, templatePart{literal: s[lit:]})
	}
	return t, nil
}

// String returns the template's source text.
func (t *Template) String() string { return t.src }

// Columns returns the placeholder column names in order of appearance,
// repeats included.
func (t *Template) Columns() []string {
	var cols []string
	for _, p := range t.parts {
		if p.column != "" {
			cols = append(cols, p.column)
		}
	}
	return cols
}

// HasPlaceholders reports whether the template has any {column}.
func (t *Template) HasPlaceholders() bool {
	for _, p := range t.parts {
		if p.column != "" {
			return true
		}
	}
	return false
}

// AppendRendered appends the template rendered with values supplied by
// lookup to dst, escaping every substituted value. lookup returns the text
// of a column's value and whether the column exists; ok is false (and dst
// is returned as given) for the first column lookup does not know.
func (t *Template) AppendRendered(dst []byte, lookup func(column string) (string, bool)) (out []byte, missing string, ok bool) {
	start := len(dst)
	for _, p := range t.parts {
		if p.column == "" {
			dst = append(dst, p.literal...)
			continue
		}
		v, found := lookup(p.column)
		if !found {
			return dst[:start], p.column, false
		}
		if len(v) > largeValue {
			dst = slices.Grow(dst, len(v))
		}
		dst = AppendEscaped(dst, v)
	}
	return dst, "", true
}

// Key builds the memcached key that cachewarden writes for prefix and a
// template, given the row's values as text (integers as decimal digits,
// strings as their bytes, booleans as "1"/"0"). Applications use it to
// build byte-identical keys. It returns an error when the template is bad
// or names a column absent from values.
func Key(prefix, template string, values map[string]string) (string, error) {
	t, err := ParseTemplate(template)
	if err != nil {
		return "", err
	}
	buf := append(make([]byte, 0, len(prefix)+len(template)+16), prefix...)
	buf, missing, ok := t.AppendRendered(buf, func(c string) (string, bool) {
		v, ok := values[c]
		return v, ok
	})
	if !ok {
		return "", fmt.Errorf("key template %q: no value for column %q", template, missing)
	}
	return FinishKey(buf), nil
}
