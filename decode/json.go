package decode

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/cachewarden/cachewarden/rules"
)

// maxDepth bounds the nesting of JSON objects and arrays in one message.
// Deeper input is rejected with a DecodeError instead of recursing further.
const maxDepth = 64

// maxPath is how many object keys an error path records.
const maxPath = 8

// scanner is a minimal JSON reader over one message. It validates what it
// reads (RFC 8259 syntax, no trailing garbage) and hands out substrings of
// s wherever no unescaping is needed, so reading a message allocates only
// for strings that contain escapes.
//
// Methods return false on the first error and record it; later calls keep
// the first error.
type scanner struct {
	s string
	// b holds the same bytes as s (the caller's message, read only during
	// Decode), or is nil; when present, strings are scanned eight bytes at
	// a time.
	b     []byte
	i     int
	depth int

	// The error path. Keys are recorded as offsets of their raw text so
	// that entering a member writes no pointers.
	path  [maxPath]pathSeg
	named [maxPath]string
	npath int

	failed  bool
	errOff  int
	errPath string
	errMsg  string

	// keyLo and keyHi delimit the raw text of the last key nextKey read.
	keyLo, keyHi int

	// buf is scratch space for unescaping strings.
	buf []byte
}

// pathSeg is one step of an error path: the key s[lo:hi] (raw text), an
// array element (elem >= 0), or the fixed name named[k] (lo < 0, elem < 0).
type pathSeg struct {
	lo, hi int32
	elem   int32
}

// release drops the message the scanner read (see Decoded.Release),
// keeping its unescaping buffer.
func (sc *scanner) release() {
	sc.reset("", nil)
	sc.buf = sc.buf[:0]
}

func (sc *scanner) reset(s string, b []byte) {
	if len(b) != len(s) {
		b = nil // not a copy of s: scan s bytewise
	}
	sc.s = s
	sc.b = b
	sc.i = 0
	sc.depth = 0
	sc.npath = 0
	if sc.failed {
		sc.failed = false
		sc.errOff = 0
		sc.errPath = ""
		sc.errMsg = ""
	}
}

// fail records an error at byte offset off and returns false.
func (sc *scanner) fail(off int, msg string) bool {
	if !sc.failed {
		sc.failed = true
		sc.errOff = off
		sc.errMsg = msg
		sc.errPath = sc.pathString()
	}
	return false
}

// failAt records an error at the current offset, describing what was
// found there.
func (sc *scanner) failAt(want string) bool {
	if sc.i >= len(sc.s) {
		return sc.fail(sc.i, "unexpected end of input, "+want)
	}
	return sc.fail(sc.i, "unexpected "+describeByte(sc.s[sc.i])+", "+want)
}

func describeByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "'" + string(rune(c)) + "'"
	}
	const hex = "0123456789abcdef"
	return "byte 0x" + string([]byte{hex[c>>4], hex[c&0xf]})
}

// pushKey enters the member whose raw key text is s[lo:hi].
func (sc *scanner) pushKey(lo, hi int) {
	if sc.npath < maxPath {
		sc.path[sc.npath] = pathSeg{lo: int32(lo), hi: int32(hi), elem: -1}
	}
	sc.npath++
}

// pushName enters a member given by name.
func (sc *scanner) pushName(name string) {
	if sc.npath < maxPath {
		sc.path[sc.npath] = pathSeg{lo: -1, elem: -1}
		sc.named[sc.npath] = name
	}
	sc.npath++
}

// pushElem enters array element n.
func (sc *scanner) pushElem(n int) {
	if sc.npath < maxPath {
		sc.path[sc.npath] = pathSeg{lo: -1, elem: int32(n)}
	}
	sc.npath++
}

func (sc *scanner) pop() { sc.npath-- }

// failedIn adds the member whose raw key text is s[lo:hi] to the path of
// the error just recorded, which was found in the member's value without
// the member being pushed (values push no path of their own), and
// returns false.
func (sc *scanner) failedIn(lo, hi int) bool {
	sc.pushKey(lo, hi)
	sc.errPath = sc.pathString()
	sc.pop()
	return false
}

func (sc *scanner) pathString() string {
	n := min(sc.npath, maxPath)
	var b strings.Builder
	for k, seg := range sc.path[:n] {
		if seg.elem >= 0 {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(int(seg.elem)))
			b.WriteByte(']')
			continue
		}
		if k > 0 {
			b.WriteByte('.')
		}
		if seg.lo < 0 {
			b.WriteString(sc.named[k])
			continue
		}
		key := sc.s[seg.lo:seg.hi]
		if strings.IndexByte(key, '\\') >= 0 {
			// Show the key unescaped, as it would be named in a row.
			var tmp scanner
			tmp.reset(sc.s, nil)
			tmp.i = int(seg.lo) - 1
			if k, ok := tmp.str(); ok {
				key = k
			}
		}
		b.WriteString(key)
	}
	return b.String()
}

func (sc *scanner) skipWS() { sc.i = wsEnd(sc.s, sc.i) }

// peek returns the next non-space byte without consuming it, or 0 at the
// end of input.
func (sc *scanner) peek() byte {
	sc.skipWS()
	if sc.i < len(sc.s) {
		return sc.s[sc.i]
	}
	return 0
}

// enter checks the nesting bound before an object or array is read.
func (sc *scanner) enter() bool {
	sc.depth++
	if sc.depth > maxDepth {
		return sc.fail(sc.i, "nesting deeper than 64 levels")
	}
	return true
}

func (sc *scanner) leave() { sc.depth-- }

// beginObject consumes '{'.
func (sc *scanner) beginObject() bool {
	if sc.peek() != '{' {
		return sc.failAt("expected '{'")
	}
	if !sc.enter() {
		return false
	}
	sc.i++
	return true
}

// nextKey reads the next member name of an object and the ':' after it.
// It returns ok=false with sc.failed unset at the closing '}'. first
// tells whether no member has been read yet.
func (sc *scanner) nextKey(first bool) (key string, ok bool) {
	s := sc.s
	i := sc.i
	if i < len(s) && s[i] <= ' ' {
		i = wsEnd(s, i)
	}
	if i < len(s) && s[i] == '}' {
		sc.i = i + 1
		sc.leave()
		return "", false
	}
	if !first {
		if i >= len(s) || s[i] != ',' {
			sc.i = i
			sc.failAt("expected ',' or '}' after object member")
			return "", false
		}
		if i++; i < len(s) && s[i] <= ' ' {
			i = wsEnd(s, i)
		}
	}
	sc.i = i
	if i >= len(s) || s[i] != '"' {
		sc.failAt("expected member name")
		return "", false
	}
	sc.keyLo = i + 1
	if key, ok = sc.str(); !ok {
		return "", false
	}
	i = sc.i
	sc.keyHi = i - 1
	if i >= len(s) || s[i] != ':' {
		if i = wsEnd(s, i); i >= len(s) || s[i] != ':' {
			sc.i = i
			sc.failAt("expected ':' after member name")
			return "", false
		}
	}
	if i++; i < len(s) && s[i] <= ' ' {
		i = wsEnd(s, i)
	}
	sc.i = i
	return key, true
}

// openObject enters the object at sc.i. It returns the offset of its
// first member, or, with empty set, leaves an empty object (sc.i after
// it); ok is false on an error. The object loops of fields, source and
// row share it.
func (sc *scanner) openObject() (i int, empty, ok bool) {
	if !sc.beginObject() {
		return 0, false, false
	}
	s := sc.s
	i = wsEnd(s, sc.i)
	if i < len(s) && s[i] == '}' {
		sc.i = i + 1
		sc.leave()
		return i + 1, true, true
	}
	return i, false, true
}

// byteAt returns s[i], or 0 past the end of s.
func byteAt(s string, i int) byte {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// memberEnd reads what follows an object member's value at i. At ','
// it returns the offset after it (and any space) with more set; at '}'
// it leaves the object (sc.i after it); at anything else it records the
// error. The object loops of fields, source and row share it, after
// taking a ',' followed by the next member inline.
func (sc *scanner) memberEnd(i int) (next int, more bool) {
	s := sc.s
	if i < len(s) && s[i] <= ' ' {
		i = wsEnd(s, i)
	}
	if i < len(s) {
		if s[i] == ',' {
			if i++; i < len(s) && s[i] <= ' ' {
				i = wsEnd(s, i)
			}
			return i, true
		}
		if s[i] == '}' {
			sc.i = i + 1
			sc.leave()
			return i + 1, false
		}
	}
	sc.i = i
	sc.failAt("expected ',' or '}' after object member")
	return i, false
}

// nextElem prepares the next element of an array whose '[' was consumed.
// It returns false with sc.failed unset at the closing ']'.
func (sc *scanner) nextElem(first bool) bool {
	c := sc.peek()
	if c == ']' {
		sc.i++
		sc.leave()
		return false
	}
	if !first {
		if c != ',' {
			return sc.failAt("expected ',' or ']' after array element")
		}
		sc.i++
		sc.skipWS()
	}
	return true
}

// strPlain marks bytes that may appear unescaped in a JSON string.
var strPlain = func() (t [256]bool) {
	for i := 0x20; i < 256; i++ {
		t[i] = true
	}
	t['"'] = false
	t['\\'] = false
	return t
}()

// str reads a JSON string at sc.i (which must be '"') and returns its
// value: a substring of the message when it has no escapes.
func (sc *scanner) str() (string, bool) {
	s := sc.s
	start := sc.i + 1
	var j int
	if b := sc.b; start+8 <= len(b) {
		// Most keys and values are short: try the first word here.
		w := binary.LittleEndian.Uint64(b[start:])
		if m := specialBytes(w); m != 0 {
			j = start + bits.TrailingZeros64(m)>>3
			if s[j] == '"' {
				sc.i = j + 1
				return s[start:j], true
			}
			return sc.strSlow(start, j)
		}
		j = sc.plainEnd(start + 8)
	} else {
		j = sc.plainEnd(start)
	}
	if j < len(s) && s[j] == '"' {
		sc.i = j + 1
		return s[start:j], true
	}
	return sc.strSlow(start, j)
}

// specialBytes flags, with the high bit of each byte, the bytes of w that
// end the plain part of a JSON string: '"', '\\' and control characters.
// Only the lowest flagged byte is exact (borrows can flag bytes above a
// special one), which is the one wanted.
//
// Per byte, x^0x02 is below 0x21 exactly when x is a control character
// or '"' (the xor swaps '"' and ' ' and keeps the bytes below 0x20 among
// themselves), which the high bit of (x^0x02)-0x21 shows given no borrow
// from below; likewise (x^'\\')-0x01 for x == '\\'. Bytes >= 0x80 are
// masked out by &^ w, as the xors keep w's high bits.
func specialBytes(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	m := ((w ^ (ones * 0x02)) - ones*0x21) | ((w ^ (ones * '\\')) - ones)
	return m &^ w & highs
}

// plainEnd returns the offset of the first byte at or after j that is
// '"', '\\' or a control character (len(s) if none).
func (sc *scanner) plainEnd(j int) int {
	if b := sc.b; j <= len(b) {
		// Two words per round: long values (URLs, text) are common.
		for ; j+16 <= len(b); j += 16 {
			m0 := specialBytes(binary.LittleEndian.Uint64(b[j : j+8]))
			m1 := specialBytes(binary.LittleEndian.Uint64(b[j+8 : j+16]))
			if m0|m1 != 0 {
				if m0 != 0 {
					return j + bits.TrailingZeros64(m0)>>3
				}
				return j + 8 + bits.TrailingZeros64(m1)>>3
			}
		}
		if j+8 <= len(b) {
			if m := specialBytes(binary.LittleEndian.Uint64(b[j : j+8])); m != 0 {
				return j + bits.TrailingZeros64(m)>>3
			}
			j += 8
		}
	}
	s := sc.s
	for j < len(s) && strPlain[s[j]] {
		j++
	}
	return j
}

// strSlow continues str from the first escape or invalid byte at j.
func (sc *scanner) strSlow(start, j int) (string, bool) {
	s := sc.s
	b := append(sc.buf[:0], s[start:j]...)
	for {
		k := sc.plainEnd(j)
		b = append(b, s[j:k]...)
		j = k
		if j >= len(s) {
			sc.buf = b
			return "", sc.fail(start-1, "unterminated string")
		}
		c := s[j]
		if c == '"' {
			sc.i = j + 1
			sc.buf = b
			return string(b), true
		}
		if c != '\\' {
			sc.buf = b
			return "", sc.fail(j, "control character "+describeByte(c)+" in string")
		}
		if j+1 >= len(s) {
			sc.buf = b
			return "", sc.fail(start-1, "unterminated string")
		}
		e := s[j+1]
		j += 2
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := hex4(s, j)
			if !ok {
				sc.buf = b
				return "", sc.fail(j-2, `invalid \u escape`)
			}
			j += 4
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if j+6 <= len(s) && s[j] == '\\' && s[j+1] == 'u' {
					if v, ok := hex4(s, j+2); ok {
						r2 = v
					}
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r = dec
					j += 6
				} else {
					r = utf8.RuneError
				}
			}
			b = utf8.AppendRune(b, r)
		default:
			sc.buf = b
			return "", sc.fail(j-2, "invalid escape "+describeByte(e)+" in string")
		}
	}
}

func hex4(s string, j int) (rune, bool) {
	if j+4 > len(s) {
		return 0, false
	}
	var r rune
	for k := j; k < j+4; k++ {
		c := s[k]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// skipAt validates the value at i without keeping it: a string, or any
// other value. It returns where the value ends.
func (sc *scanner) skipAt(i int) (end int, ok bool) {
	sc.i = i
	if i < len(sc.s) && sc.s[i] == '"' {
		ok = sc.skipStr()
	} else {
		ok = sc.skip()
	}
	return sc.i, ok
}

// skipStr validates and skips a JSON string at sc.i without unescaping.
func (sc *scanner) skipStr() bool {
	s := sc.s
	start := sc.i
	j := start + 1
	if b := sc.b; j+8 <= len(b) {
		// Most strings are short: try the first word here, as str does.
		if m := specialBytes(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			if j += bits.TrailingZeros64(m) >> 3; s[j] == '"' {
				sc.i = j + 1
				return true
			}
		} else {
			j += 8
		}
	}
	for {
		j = sc.plainEnd(j)
		if j >= len(s) {
			return sc.fail(start, "unterminated string")
		}
		switch c := s[j]; c {
		case '"':
			sc.i = j + 1
			return true
		case '\\':
			if j+1 >= len(s) {
				return sc.fail(start, "unterminated string")
			}
			switch s[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if _, ok := hex4(s, j+2); !ok {
					return sc.fail(j, `invalid \u escape`)
				}
				j += 6
			default:
				return sc.fail(j, "invalid escape "+describeByte(s[j+1])+" in string")
			}
		default:
			return sc.fail(j, "control character "+describeByte(c)+" in string")
		}
	}
}

// number reads a JSON number literal, returning it as KindInt when it has
// no fraction or exponent and as KindFloat otherwise. The text is kept
// exactly as written.
func (sc *scanner) number() (rules.Value, bool) {
	start := sc.i
	end, kind, problem := numberEnd(sc.s, start)
	if problem != "" {
		return rules.Value{}, sc.fail(start, problem)
	}
	sc.i = end
	return rules.Value{Kind: kind, Text: sc.s[start:end]}, true
}

// numberEnd scans the number literal starting at s[i] and returns where it
// ends and its kind, or what is wrong with it.
func numberEnd(s string, i int) (end int, kind rules.Kind, problem string) {
	j := i
	if j < len(s) && s[j] == '-' {
		j++
	}
	switch {
	case j < len(s) && s[j]-'1' <= 8:
		j = digitsEnd(s, j+1)
	case j < len(s) && s[j] == '0':
		j++
	default:
		return 0, 0, "invalid number: no digits"
	}
	if j >= len(s) || (s[j] != '.' && s[j]|0x20 != 'e') {
		return j, rules.KindInt, "" // most numbers are integers
	}
	return numberTail(s, j)
}

// numberTail scans the fraction and exponent of a number from s[j].
func numberTail(s string, j int) (end int, kind rules.Kind, problem string) {
	kind = rules.KindInt
	if j < len(s) && s[j] == '.' {
		j++
		d := j
		j = digitsEnd(s, j)
		if j == d {
			return 0, 0, "invalid number: no digits after '.'"
		}
		kind = rules.KindFloat
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		j++
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		d := j
		for j < len(s) && s[j]-'0' <= 9 {
			j++
		}
		if j == d {
			return 0, 0, "invalid number: no digits in exponent"
		}
		kind = rules.KindFloat
	}
	return j, kind, ""
}

// digitsEnd returns the offset of the first byte at or after j that is
// not an ASCII digit (len(s) if none), eight bytes at a time: timestamps
// of 13 to 19 digits are common.
//
// Per byte, the high bit of x-0x30 is set when x < '0' and that of
// x+0x46 when x > '9', given no borrow or carry from the byte below,
// which holds below the first non-digit: so the lowest flagged byte is
// exact, as in specialBytes.
//
// The words are read through a byte view of s (never written): the
// compiler makes one load of binary.LittleEndian.Uint64 on a slice, but
// eight of the same expression on a string.
func digitsEnd(s string, j int) int {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for ; j+8 <= len(b); j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		const highs = 0x8080808080808080
		if m := ((w - 0x3030303030303030) | (w + 0x4646464646464646)) & highs; m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
	}
	for j < len(s) && s[j]-'0' <= 9 {
		j++
	}
	return j
}

// wsEnd returns the offset of the first non-space byte at or after i.
func wsEnd(s string, i int) int {
	for i < len(s) && s[i] <= ' ' && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t') {
		i++
	}
	return i
}

// literal consumes word (true, false or null) at sc.i.
func (sc *scanner) literal(word string) bool {
	if strings.HasPrefix(sc.s[sc.i:], word) {
		sc.i += len(word)
		return true
	}
	return sc.failAt("expected a JSON value")
}

// value reads any JSON value at sc.i (spaces already skipped). Objects and
// arrays are validated and returned as KindJSON with their raw text.
func (sc *scanner) value() (rules.Value, bool) {
	if sc.i >= len(sc.s) {
		return rules.Value{}, sc.failAt("expected a JSON value")
	}
	switch c := sc.s[sc.i]; c {
	case '"':
		t, ok := sc.str()
		return rules.Value{Kind: rules.KindString, Text: t}, ok
	case '{', '[':
		start := sc.i
		if !sc.skip() {
			return rules.Value{}, false
		}
		return rules.Value{Kind: rules.KindJSON, Text: sc.s[start:sc.i]}, true
	case 't':
		return rules.Value{Kind: rules.KindBool, Text: "1"}, sc.literal("true")
	case 'f':
		return rules.Value{Kind: rules.KindBool, Text: "0"}, sc.literal("false")
	case 'n':
		return rules.Value{}, sc.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return sc.number()
		}
		return rules.Value{}, sc.failAt("expected a JSON value")
	}
}

// skip validates and skips any JSON value at sc.i (spaces already
// skipped).
func (sc *scanner) skip() bool {
	if sc.i >= len(sc.s) {
		return sc.failAt("expected a JSON value")
	}
	switch sc.s[sc.i] {
	case '"':
		return sc.skipStr()
	case '{':
		if !sc.enter() {
			return false
		}
		sc.i++
		for first := true; ; first = false {
			c := sc.peek()
			if c == '}' {
				sc.i++
				sc.leave()
				return true
			}
			if !first {
				if c != ',' {
					return sc.failAt("expected ',' or '}' after object member")
				}
				sc.i++
				c = sc.peek()
			}
			if c != '"' {
				return sc.failAt("expected member name")
			}
			if !sc.skipStr() {
				return false
			}
			if sc.peek() != ':' {
				return sc.failAt("expected ':' after member name")
			}
			sc.i++
			// Strings, the most common members, without a call.
			if c = sc.peek(); c == '"' {
				if !sc.skipStr() {
					return false
				}
			} else if !sc.skip() {
				return false
			}
		}
	case '[':
		if !sc.enter() {
			return false
		}
		sc.i++
		for first := true; sc.nextElem(first); first = false {
			if !sc.skip() {
				return false
			}
		}
		return !sc.failed
	case 'n':
		return sc.literal("null")
	case 't':
		return sc.literal("true")
	case 'f':
		return sc.literal("false")
	default:
		if c := sc.s[sc.i]; c != '-' && c-'0' > 9 {
			return sc.failAt("expected a JSON value")
		}
		end, _, problem := numberEnd(sc.s, sc.i)
		if problem != "" {
			return sc.fail(sc.i, problem)
		}
		sc.i = end
		return true
	}
}
