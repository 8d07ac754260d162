package binlog

import (
	"fmt"
	"time"
)

// parseDatetime reads go-mysql's text of a DATETIME, TIMESTAMP or DATE
// ("2024-05-01 10:00:00", with up to six fractional digits) as a UTC
// time. zero is true for a zero date or a date with a zero month or day,
// which MySQL allows and time.Time cannot hold.
func parseDatetime(s string) (t time.Time, zero bool, err error) {
	bad := func(why string) (time.Time, bool, error) {
		return time.Time{}, false, fmt.Errorf("date and time %q: %s", s, why)
	}
	if len(s) < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return bad("want YYYY-MM-DD HH:MM:SS")
	}
	var f [6]int
	for i, at := range [6][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		n, ok := atoi(s[at[0]:at[1]])
		if !ok {
			return bad("a field is not digits")
		}
		f[i] = n
	}
	nanos, ok := fraction(s[19:])
	if !ok {
		return bad("the fraction is not '.' and 1 to 6 digits")
	}
	if f[1] == 0 || f[2] == 0 {
		return time.Time{}, true, nil
	}
	if f[1] > 12 || f[2] > 31 || f[3] > 23 || f[4] > 59 || f[5] > 59 {
		return bad("a field is out of range")
	}
	return time.Date(f[0], time.Month(f[1]), f[2], f[3], f[4], f[5], nanos, time.UTC), false, nil
}

// parseTime reads go-mysql's text of a TIME ("-838:59:59.000000") as
// microseconds.
func parseTime(s string) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("time %q: %s", s, why)
	}
	body, neg := s, false
	if len(body) > 0 && body[0] == '-' {
		body, neg = body[1:], true
	}
	colon := -1
	for i := 0; i < len(body); i++ {
		if body[i] == ':' {
			colon = i
			break
		}
	}
	if colon < 2 || colon > 4 || len(body) < colon+6 || body[colon+3] != ':' {
		return bad("want [-]HH:MM:SS")
	}
	h, ok1 := atoi(body[:colon])
	m, ok2 := atoi(body[colon+1 : colon+3])
	sec, ok3 := atoi(body[colon+4 : colon+6])
	nanos, ok4 := fraction(body[colon+6:])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return bad("a field is not digits")
	}
	if m > 59 || sec > 59 {
		return bad("minutes or seconds out of range")
	}
	us := (int64(h)*3600+int64(m)*60+int64(sec))*1e6 + int64(nanos/1000)
	if neg {
		us = -us
	}
	return us, nil
}

// atoi reads 1 to 9 decimal digits.
func atoi(s string) (int, bool) {
	if s == "" || len(s) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

// fraction reads "" or '.' and 1 to 6 digits as nanoseconds.
func fraction(s string) (int, bool) {
	if s == "" {
		return 0, true
	}
	if s[0] != '.' || len(s) < 2 || len(s) > 7 {
		return 0, false
	}
	n, ok := atoi(s[1:])
	if !ok {
		return 0, false
	}
	for i := len(s) - 1; i < 9; i++ {
		n *= 10
	}
	return n, true
}

// parseMembers reads the member names of information_schema's
// COLUMN_TYPE of an ENUM or SET: enum('a','b”c') gives a and b'c. Quotes
// are doubled or backslash-escaped, as MySQL writes them.
func parseMembers(columnType string) ([]string, error) {
	bad := func(why string) ([]string, error) {
		return nil, fmt.Errorf("column type %q: %s", columnType, why)
	}
	open := -1
	for i := 0; i < len(columnType); i++ {
		if columnType[i] == '(' {
			open = i
			break
		}
	}
	if open < 0 || columnType[len(columnType)-1] != ')' {
		return bad("want enum('...') or set('...')")
	}
	s := columnType[open+1 : len(columnType)-1]
	var members []string
	for i := 0; ; {
		if i >= len(s) || s[i] != '\'' {
			return bad("a member is not quoted")
		}
		name, next, ok := quoted(s, i+1)
		if !ok {
			return bad("a quote is not closed")
		}
		members = append(members, name)
		if next == len(s) {
			return members, nil
		}
		if s[next] != ',' {
			return bad("members are not separated by ','")
		}
		i = next + 1
	}
}

// quoted reads a single-quoted SQL string whose opening quote is before
// s[i]: its value and the offset after the closing quote.
func quoted(s string, i int) (string, int, bool) {
	var b []byte
	for i < len(s) {
		c := s[i]
		switch {
		case c == '\'' && i+1 < len(s) && s[i+1] == '\'':
			b = append(b, '\'')
			i += 2
		case c == '\'':
			return string(b), i + 1, true
		case c == '\\' && i+1 < len(s):
			b = append(b, unescape(s[i+1]))
			i += 2
		default:
			b = append(b, c)
			i++
		}
	}
	return "", 0, false
}

// unescape is the byte a backslash escape stands for in a MySQL string.
func unescape(c byte) byte {
	switch c {
	case '0':
		return 0
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case 'b':
		return '\b'
	case 'Z':
		return 0x1a
	}
	return c
}
