package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxKeyLen is memcached's key length limit in bytes.
const MaxKeyLen = 250

// hashedKeyHead is how many bytes of a long key are kept before the hash
// mark and the hash.
const hashedKeyHead = 200

// A rendered key (prefix, literal template text and escaped values) holds
// '%' only at the start of an escape: '%' and two upper-case hex digits.
// Escaping writes values so, and ParseTemplate and CheckLiteral hold
// literal text and prefixes to it. So a '%' followed by anything else
// marks text the daemon adds to a rendered key, and no row value can spell
// such a mark: these keys are unforgeable. Each mark is declared once,
// here or where its keys are made (counters.FenceKeySuffix, the rebump
// journal's "%rebump:").
const (
	// hashMark separates a long key's first 200 bytes from its hash.
	hashMark = "%#"
	// copyMark separates a namespace's rendered key from a copy's number.
	copyMark = "%copy"
)

// Marks of the items that carry a table's generation (docs/formats.md,
// "Generations"), exported for package itemformat, which builds the
// counters' keys.
const (
	// GenerationMark follows the prefix in a generation item's key.
	GenerationMark = "%gen:"
	// CounterGenerationMark separates a counter's rendered key from the
	// generation it counts under.
	CounterGenerationMark = "%@"
)

// legacyMark is what releases before the marks put where hashMark and
// copyMark now stand; see Op.Legacy.
const legacyMark = '#'

// HashedKeyLen is the length in bytes of the key FinishKey makes of a key
// longer than MaxKeyLen: 200 bytes, "%#" and 32 hex digits.
const HashedKeyLen = hashedKeyHead + len(hashMark) + 32

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

// FinishKey turns a complete key (prefix + rendered template, or a key
// derived from one) into the memcached key: unchanged up to MaxKeyLen
// bytes, else its first 200 bytes, the mark "%#", and the first 32
// lower-case hex digits of the SHA-256 of the whole key (HashedKeyLen,
// 234 bytes). No rendered key holds "%#", so no row value can spell the
// shortened form of another key.
func FinishKey(key []byte) string {
	if len(key) <= MaxKeyLen {
		return string(key)
	}
	return string(appendHashed(make([]byte, 0, HashedKeyLen), key))
}

// appendHashed appends the shortened form of the long key to dst. key may
// share dst's array only starting at len(dst) (the planner shortens a key
// in place at the end of its buffer).
func appendHashed(dst, key []byte) []byte {
	sum := sha256.Sum256(key)
	dst = append(dst, key[:hashedKeyHead]...)
	dst = append(dst, hashMark...)
	return hex.AppendEncode(dst, sum[:16])
}

// appendLegacyKey appends to dst the key releases before the hash and
// copy marks gave the rendered key (copy < 0) or its copy number copy: the
// copy suffix was '#' and the number, and a long key's hash mark '#'.
func appendLegacyKey(dst, rendered []byte, copy int) []byte {
	start := len(dst)
	dst = append(dst, rendered...)
	if copy >= 0 {
		dst = strconv.AppendInt(append(dst, legacyMark), int64(copy), 10)
	}
	if len(dst)-start <= MaxKeyLen {
		return dst
	}
	sum := sha256.Sum256(dst[start:])
	dst = append(dst[:start+hashedKeyHead], legacyMark)
	return hex.AppendEncode(dst, sum[:16])
}

// isHashed reports whether key is a hashed long key (FinishKey's form).
func isHashed(key []byte) bool {
	return len(key) == HashedKeyLen && string(key[hashedKeyHead:hashedKeyHead+len(hashMark)]) == hashMark
}

// CopyKey returns the key of copy i of the namespace whose rendered key
// (prefix included, before the 250-byte rule) is rendered: rendered,
// "%copy" and i in decimal, through FinishKey. No rendered key holds
// "%copy", so no row value can spell a copy's key.
func CopyKey(rendered []byte, i int) string {
	buf := make([]byte, 0, len(rendered)+len(copyMark)+2)
	return FinishKey(appendCopySuffix(append(buf, rendered...), i))
}

// appendCopySuffix appends the suffix of copy i, "%copy" and i in
// decimal, to a rendered key.
func appendCopySuffix(dst []byte, i int) []byte {
	return strconv.AppendInt(append(dst, copyMark...), int64(i), 10)
}

// CopySuffixLen is the length in bytes of the suffix of copy i.
func CopySuffixLen(i int) int { return len(appendCopySuffix(nil, i)) }

// CheckLiteral checks s, a key prefix or other literal key text, as
// ParseTemplate checks a template's literal text: no byte <= 0x20 or 0x7f
// (memcached keys cannot hold them), and every '%' followed by two
// upper-case hex digits, as escaping writes it. A '%' followed by anything
// else is the start of one of the daemon's marks ("%#" of hashed keys,
// "%copy" of hot-key copies, "%gen:" and "%@" of generations, "%fence" of
// counter fences, "%rebump:" of the rebump journal); write "%25" for a
// '%' itself. The error names the byte
// and its offset.
func CheckLiteral(s string) error {
	for i := 0; i < len(s); i++ {
		if err := checkLiteralByte(s, i); err != nil {
			return err
		}
	}
	return nil
}

// checkLiteralByte checks the byte at i of literal key text s.
func checkLiteralByte(s string, i int) error {
	switch c := s[i]; {
	case c <= 0x20 || c == 0x7f:
		return fmt.Errorf("byte 0x%02x at %d is not allowed in a memcached key", c, i)
	case c == '%' && (i+2 >= len(s) || !isUpperHex(s[i+1]) || !isUpperHex(s[i+2])):
		return fmt.Errorf("'%%' at %d must start %%XX with two upper-case hex digits: a '%%' followed by anything else is reserved for the daemon's key marks (write %%25 for a '%%')", i)
	}
	return nil
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

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
// Literal text must pass CheckLiteral (legal in a memcached key, '%' only
// as %XX); braces are reserved for placeholders; column names are
// non-empty.
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
		default:
			if err := checkLiteralByte(s, i); err != nil {
				return nil, fmt.Errorf("template %q: %w", s, err)
			}
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

// DistinctColumns returns the placeholder column names, each once, in
// order of first appearance: the columns a rule's keys query returns, in
// that order.
func (t *Template) DistinctColumns() []string {
	var out []string
	for _, c := range t.Columns() {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// Bare returns the column of a template that is one placeholder and
// nothing else ("{id}"), whose rendering is that column's value alone;
// ok is false for any other template.
func (t *Template) Bare() (column string, ok bool) {
	if len(t.parts) != 1 || t.parts[0].column == "" {
		return "", false
	}
	return t.parts[0].column, true
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

// CanRender reports whether prefix + t renders key (before the 250-byte
// rule) for some row: literal text must match, and each placeholder
// stands for the escaped text of a value, the same text wherever its
// column repeats. accept, when not nil, is asked whether a column's value
// can have the given escaped text; without it any escaped text can be.
// It tells whether a row can land on a key the rule does not mean, such
// as an evidence master's. It tries every split of key, so its cost grows
// with len(key) to the power of the number of distinct columns: it is for
// checking rules, not for planning.
func (t *Template) CanRender(prefix, key string, accept func(column, escaped string) bool) bool {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return false
	}
	return t.renders(t.parts, rest, map[string]string{}, accept)
}

func (t *Template) renders(parts []templatePart, s string, bound map[string]string, accept func(column, escaped string) bool) bool {
	if len(parts) == 0 {
		return s == ""
	}
	p := parts[0]
	if p.column == "" {
		rest, ok := strings.CutPrefix(s, p.literal)
		return ok && t.renders(parts[1:], rest, bound, accept)
	}
	if v, ok := bound[p.column]; ok {
		rest, ok := strings.CutPrefix(s, v)
		return ok && t.renders(parts[1:], rest, bound, accept)
	}
	for n := 0; n <= len(s); n++ {
		v := s[:n]
		if CheckLiteral(v) != nil || accept != nil && !accept(p.column, v) {
			continue
		}
		bound[p.column] = v
		if t.renders(parts[1:], s[n:], bound, accept) {
			return true
		}
		delete(bound, p.column)
	}
	return false
}
