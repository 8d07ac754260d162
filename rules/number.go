package rules

// decimal is an exact view of a decimal number literal such as "-12.50",
// "9223372036854775808" or "1.5E+3". It points into the literal's text and
// never goes through float64, so integers of any size and decimal fractions
// compare exactly.
//
// A non-zero number is ±0.d1d2d3…×10^exp where digits holds d1d2d3… as it
// appears in the literal: from the first to the last significant digit,
// possibly with the literal's '.' in between.
type decimal struct {
	neg    bool
	zero   bool
	exp    int
	digits string
}

// maxDecimalExp bounds exponents so that absurd literals cannot overflow
// int arithmetic; numbers beyond it compare as if at the bound.
const maxDecimalExp = 1 << 20

// parseDecimal parses an optionally signed decimal number with an optional
// fraction and exponent. It accepts no spaces, hex, "NaN" or "Inf".
func parseDecimal(s string) (decimal, bool) {
	var d decimal
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		d.neg = s[i] == '-'
		i++
	}
	m, dot, i := scanMantissa(s, i)
	if m == "" {
		return decimal{}, false
	}
	exp, i, ok := scanExponent(s, i)
	if !ok || i != len(s) {
		return decimal{}, false
	}
	first, last := significantDigits(m)
	if first < 0 {
		return decimal{zero: true}, true
	}
	var point int
	if first < dot {
		point = dot - first
	} else {
		point = -(first - dot - 1)
	}
	d.exp = point + exp
	d.digits = m[first : last+1]
	return d, true
}

// scanMantissa reads the digits and at most one '.' of s from i. m is
// the mantissa's text ("" when it has no digit), dot the index of its '.'
// in m (len(m) when none), next the index after it.
func scanMantissa(s string, i int) (m string, dot, next int) {
	start := i
	dot = -1
	nd := 0
	for ; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' {
			nd++
			continue
		}
		if c == '.' && dot < 0 {
			dot = i - start
			continue
		}
		break
	}
	if nd == 0 {
		return "", 0, i
	}
	m = s[start:i]
	if dot < 0 {
		dot = len(m)
	}
	return m, dot, i
}

// scanExponent reads an exponent (e or E, a sign, digits) of s from i
// when there is one, capped at ±maxDecimalExp; next is the index after
// it. ok is false when the exponent has no digits or ends in something
// else.
func scanExponent(s string, i int) (exp, next int, ok bool) {
	if i >= len(s) || (s[i] != 'e' && s[i] != 'E') {
		return 0, i, true
	}
	i++
	eneg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		eneg = s[i] == '-'
		i++
	}
	if i == len(s) {
		return 0, i, false
	}
	for ; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, i, false
		}
		if exp < maxDecimalExp {
			exp = exp*10 + int(c-'0')
		}
	}
	exp = min(exp, maxDecimalExp)
	if eneg {
		exp = -exp
	}
	return exp, i, true
}

// significantDigits returns the indexes in m of its first and last digit
// other than 0; -1, -1 when m is zero.
func significantDigits(m string) (first, last int) {
	first, last = -1, -1
	for k := 0; k < len(m); k++ {
		if m[k] >= '1' && m[k] <= '9' {
			if first < 0 {
				first = k
			}
			last = k
		}
	}
	return first, last
}

// compareDecimal returns -1, 0 or +1 as a is less than, equal to or
// greater than b.
func compareDecimal(a, b decimal) int {
	if a.zero || b.zero {
		switch {
		case a.zero && b.zero:
			return 0
		case a.zero:
			if b.neg {
				return 1
			}
			return -1
		default:
			if a.neg {
				return -1
			}
			return 1
		}
	}
	if a.neg != b.neg {
		if a.neg {
			return -1
		}
		return 1
	}
	c := compareMagnitude(a, b)
	if a.neg {
		return -c
	}
	return c
}

func compareMagnitude(a, b decimal) int {
	if a.exp != b.exp {
		if a.exp < b.exp {
			return -1
		}
		return 1
	}
	i, j := 0, 0
	for {
		if i < len(a.digits) && a.digits[i] == '.' {
			i++
		}
		if j < len(b.digits) && b.digits[j] == '.' {
			j++
		}
		switch {
		case i == len(a.digits) && j == len(b.digits):
			return 0
		case i == len(a.digits):
			return -1 // b has more significant digits, the last non-zero
		case j == len(b.digits):
			return 1
		}
		if a.digits[i] != b.digits[j] {
			if a.digits[i] < b.digits[j] {
				return -1
			}
			return 1
		}
		i++
		j++
	}
}

// numeric returns v's exact numeric view: integers, floats and booleans
// always have one (unless the float is NaN or infinite); strings have one
// when their whole text is a decimal number.
func numeric(v Value) (decimal, bool) {
	switch v.Kind {
	case KindInt, KindFloat, KindBool, KindString:
		return parseDecimal(v.Text)
	}
	return decimal{}, false
}

// isText reports whether v compares as text when the other side is text
// too.
func isText(v Value) bool { return v.Kind == KindString || v.Kind == KindJSON }

// compareValues orders two non-null values: as text when both are text,
// else numerically when both have a numeric view. ok is false when they
// are not comparable (a non-numeric string against a number).
func compareValues(a, b Value) (c int, ok bool) {
	if isText(a) && isText(b) {
		switch {
		case a.Text < b.Text:
			return -1, true
		case a.Text > b.Text:
			return 1, true
		}
		return 0, true
	}
	da, ok := numeric(a)
	if !ok {
		return 0, false
	}
	db, ok := numeric(b)
	if !ok {
		return 0, false
	}
	return compareDecimal(da, db), true
}

// equalValues is the predicate language's ==: null equals only null;
// otherwise the values must be comparable and compare equal.
func equalValues(a, b Value) bool {
	if a.IsNull() || b.IsNull() {
		return a.IsNull() && b.IsNull()
	}
	c, ok := compareValues(a, b)
	return ok && c == 0
}

// sameValue reports whether a column kept its value between two images of
// a row: same kind and text, or numbers (not strings) that are equal.
func sameValue(a, b Value) bool {
	if a.Kind == b.Kind && a.Text == b.Text {
		return true
	}
	if a.IsNull() || b.IsNull() || isText(a) || isText(b) {
		return false
	}
	c, ok := compareValues(a, b)
	return ok && c == 0
}

// truthy is a value's truth in a boolean context, as in MySQL: a non-zero
// number is true; null, zero and text that is not a number are false.
func truthy(v Value) bool {
	d, ok := numeric(v)
	return ok && !d.zero
}
