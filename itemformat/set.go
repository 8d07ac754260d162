package itemformat

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// DefaultCompactRatio is the share of a set's tokens that are garbage
// (removed members, superseded tokens, foreign tokens) above which the
// daemon and the read side compact the set (memcached.compact_ratio).
const DefaultCompactRatio = 0.5

// Set item encoding (docs/formats.md, sets): a sequence of tokens, each an op byte
// ('+' add, '-' remove), the escaped member, and one space:
//
//	"+m1 +m2 -m1 "
//
// Members are escaped with rules.AppendEscaped, so a token never contains
// whitespace and a reader can split on whitespace and look at the first
// byte. A later token for a member supersedes earlier ones.

// AppendToken appends one set token for member (raw, unescaped) to dst.
func AppendToken(dst []byte, add bool, member string) []byte {
	if add {
		dst = append(dst, '+')
	} else {
		dst = append(dst, '-')
	}
	dst = rules.AppendEscaped(dst, member)
	return append(dst, ' ')
}

// AppendEscapedToken appends a token whose member is already escaped (as
// in rules.Op.Member) to dst.
func AppendEscapedToken(dst []byte, add bool, escapedMember string) []byte {
	if add {
		dst = append(dst, '+')
	} else {
		dst = append(dst, '-')
	}
	dst = append(dst, escapedMember...)
	return append(dst, ' ')
}

// SetState is a decoded set item.
type SetState struct {
	// Members are the escaped members present, in order of their first
	// surviving add.
	Members []string
	// Tokens is the number of tokens in the item, the generation token
	// not included; Removals how many of them are '-' tokens. Tokens
	// beyond len(Members) are garbage that compaction removes.
	Tokens   int
	Removals int
	// Gen is the generation the set was loaded under, from its first
	// token ("g" and the generation in decimal); HasGen is false when
	// the first token is not one. A set is valid only when HasGen and
	// Gen equals its table's current generation (docs/formats.md,
	// "Generations").
	Gen    uint64
	HasGen bool
}

// ValidAt reports whether the set is valid under generation gen: it
// carries that very generation.
func (s SetState) ValidAt(gen uint64) bool { return s.HasGen && s.Gen == gen }

// Dirty reports whether the share of tokens that compaction would drop is
// at least ratio (0 < ratio <= 1).
func (s SetState) Dirty(ratio float64) bool {
	if s.Tokens == 0 {
		return false
	}
	return float64(s.Tokens-len(s.Members)) >= ratio*float64(s.Tokens)
}

// DecodeSet parses a set item. Tokens are separated by ASCII whitespace
// and control bytes (any byte <= 0x20 or 0x7f; escaped members never hold
// one), never by other Unicode spaces, which may occur inside a member.
// Unknown op bytes and empty tokens are ignored, so a reader never fails on
// a partly foreign item.
func DecodeSet(value []byte) SetState {
	var st SetState
	present := make(map[string]int) // escaped member -> index in order, -1 when removed
	var order []string
	for rest, first := value, true; ; first = false {
		var tok []byte
		tok, rest = nextSetToken(rest)
		if tok == nil {
			break
		}
		if first {
			if g, ok := parseGenerationToken(tok); ok {
				// The generation stamp: not a token of the set.
				st.Gen, st.HasGen = g, true
				continue
			}
		}
		st.Tokens++
		op, member := tok[0], string(tok[1:])
		switch op {
		case '+':
			if i, ok := present[member]; !ok || i < 0 {
				present[member] = len(order)
				order = append(order, member)
			}
		case '-':
			st.Removals++
			if _, ok := present[member]; ok {
				present[member] = -1
			}
		}
	}
	for i, m := range order {
		if present[m] == i {
			st.Members = append(st.Members, m)
		}
	}
	return st
}

// Compact returns the compact form of the set s was decoded from: its
// generation token when it has one (docs/formats.md, "Generations"),
// then a "+m " token per member present, in order.
func (s SetState) Compact() []byte {
	if !s.HasGen {
		return EncodeSet(s.Members)
	}
	return EncodeSetAt(s.Gen, s.Members)
}

func isSetTokenSeparator(b byte) bool { return b <= ' ' || b == 0x7f }

// SetTokens returns the tokens of a set's value, or of tokens to append,
// split as DecodeSet splits them: on bytes up to space and DEL only, so
// that other Unicode spaces stay inside a member.
func SetTokens(b []byte) [][]byte {
	var toks [][]byte
	for tok, rest := nextSetToken(b); tok != nil; tok, rest = nextSetToken(rest) {
		toks = append(toks, tok)
	}
	return toks
}

// nextSetToken returns the first token of b and what follows it; tok is nil
// when b holds no more tokens.
func nextSetToken(b []byte) (tok, rest []byte) {
	start := 0
	for start < len(b) && isSetTokenSeparator(b[start]) {
		start++
	}
	if start == len(b) {
		return nil, nil
	}
	end := start + 1
	for end < len(b) && !isSetTokenSeparator(b[end]) {
		end++
	}
	return b[start:end], b[end:]
}

// EncodeSet returns the compact item holding exactly the given escaped
// members.
func EncodeSet(escapedMembers []string) []byte {
	n := 0
	for _, m := range escapedMembers {
		n += len(m) + 2
	}
	out := make([]byte, 0, n)
	for _, m := range escapedMembers {
		out = AppendEscapedToken(out, true, m)
	}
	return out
}

// Unescape reverses rules.Escape: "%XX" sequences become the byte they
// name; anything else is kept.
func Unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if hi, ok := unhex(s[i+1]); ok {
				if lo, ok := unhex(s[i+2]); ok {
					out = append(out, hi<<4|lo)
					i += 2
					continue
				}
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// ErrInvalidTokens means a string of set tokens, or the escaped member
// of one, does not have the set format: it is never appended.
var ErrInvalidTokens = errors.New("malformed set tokens")

// CheckEscapedMember rejects an escaped member that would not form one
// token. The error wraps ErrInvalidTokens.
func CheckEscapedMember(member string) error {
	for i := 0; i < len(member); i++ {
		if c := member[i]; isSetTokenSeparator(c) {
			return fmt.Errorf("%w: member has byte 0x%02x at offset %d (not escaped)", ErrInvalidTokens, c, i)
		}
	}
	return nil
}

// CheckSetTokens checks a joined token string: one or more tokens, each
// '+' or '-', an escaped member, and one space. The error wraps
// ErrInvalidTokens.
func CheckSetTokens(tokens string) error {
	if tokens == "" {
		return fmt.Errorf("%w: no set tokens", ErrInvalidTokens)
	}
	if tokens[len(tokens)-1] != ' ' {
		return fmt.Errorf("%w: set tokens do not end with a space", ErrInvalidTokens)
	}
	start := 0
	for i := 0; i < len(tokens); i++ {
		c := tokens[i]
		switch {
		case i == start:
			if c != '+' && c != '-' {
				return fmt.Errorf("%w: set token at offset %d starts with %q, not '+' or '-'", ErrInvalidTokens, i, c)
			}
		case c == ' ':
			start = i + 1
		case isSetTokenSeparator(c):
			return fmt.Errorf("%w: set tokens have byte 0x%02x at offset %d", ErrInvalidTokens, c, i)
		}
	}
	return nil
}

// EncodeLoadedSet encodes raw members (as a set's load query returns
// them) as a compact set, escaping them and dropping duplicates.
func EncodeLoadedSet(members []string) []byte {
	return EncodeSet(loadedEscaped(members))
}

// loadedEscaped escapes raw members, dropping duplicates.
func loadedEscaped(members []string) []string {
	seen := make(map[string]struct{}, len(members))
	escaped := make([]string, 0, len(members))
	for _, m := range members {
		e := rules.Escape(m)
		if _, dup := seen[e]; dup {
			continue
		}
		seen[e] = struct{}{}
		escaped = append(escaped, e)
	}
	return escaped
}
