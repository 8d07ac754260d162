package yamlfile

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// maxLocate bounds the size of a file whose syntax error is located
// exactly: locating parses prefixes of the file, about as many times as
// the file has lines. A larger file gets the line of yaml.v3's message.
const maxLocate = 256 << 10

// yamlLine matches the position in yaml.v3's messages: "yaml: line N: msg".
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns yaml.v3's error into an *Error at the place where the
// parser stopped.
//
// yaml.v3 says only "line N", and that is the line where the enclosing
// collection starts (counted from 0 for the parser's problems, from 1 for
// the scanner's), never a column. The parser reads the file from the
// start and fails at the first token it cannot take, so parsing a prefix
// of the file that ends just after that token fails with the same
// message, and a shorter prefix does not (it either parses, or fails on
// its own end in another way). The place reported is the start of the
// word (the run of non-blank characters) holding the last byte of the
// shortest prefix that fails like the whole file: for a mis-indented key
// that is the key, for an unclosed '[' the bracket, for an undefined
// alias the '*'.
func syntaxError(data []byte, err error) *Error {
	text := err.Error()
	msg := "YAML: " + yamlLine.ReplaceAllString(text, "")
	msg = strings.Replace(msg, "YAML: yaml: ", "YAML: ", 1)
	if strings.HasSuffix(text, "found unexpected end of stream") {
		// A quoted scalar or flow collection left open: the parser stops
		// at the end of the file; the place to fix is where it opened,
		// which is the line yaml.v3 names.
		if m := yamlLine.FindStringSubmatch(text); m != nil {
			line, _ := strconv.Atoi(m[1])
			line = min(max(line, 1), len(lineStarts(data)))
			return &Error{Line: line, Column: openingColumn(data, line), Msg: msg}
		}
	}
	if off, ok := locate(data, text); ok {
		line, col := position(data, off)
		return &Error{Line: line, Column: col, Msg: msg}
	}
	line := 1
	if m := yamlLine.FindStringSubmatch(text); m != nil {
		line, _ = strconv.Atoi(m[1])
		line = min(max(line, 1), len(lineStarts(data)))
	}
	return &Error{Line: line, Column: 1, Msg: msg}
}

// failure returns the text of the error that parsing data (every
// document) fails with, or "" when it parses.
func failure(data []byte) string {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return err.Error()
		}
	}
}

// locate returns the byte offset of the start of the word where parsing
// stops with the error text want, searching line prefixes first and then
// the prefixes within the first line that fails that way.
func locate(data []byte, want string) (int, bool) {
	if len(data) > maxLocate {
		return 0, false
	}
	starts := lineStarts(data)
	for i, start := range starts {
		end := len(data)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		if failure(data[:end]) != want {
			continue
		}
		for k := start + 1; k < end; k++ {
			if failure(data[:k]) == want {
				return wordStart(data, start, k-1), true
			}
		}
		return wordStart(data, start, max(end-1, start)), true
	}
	return 0, false
}

// lineStarts returns the offset where each line of data starts. Lines
// end as yaml.v3 counts them: at "\r\n", "\r", "\n", and U+0085, U+2028
// and U+2029.
func lineStarts(data []byte) []int {
	starts := []int{0}
	for i := 0; i < len(data); i++ {
		switch {
		case data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n':
			i++
			starts = append(starts, i+1)
		case data[i] == '\r' || data[i] == '\n':
			starts = append(starts, i+1)
		case data[i] == 0xc2 && i+1 < len(data) && data[i+1] == 0x85:
			i++
			starts = append(starts, i+1)
		case data[i] == 0xe2 && i+2 < len(data) && data[i+1] == 0x80 && (data[i+2] == 0xa8 || data[i+2] == 0xa9):
			i += 2
			starts = append(starts, i+1)
		}
	}
	return starts
}

// wordStart returns the offset of the first byte of the run of non-blank
// bytes holding data[at], not before lineStart; at a blank it steps back
// to the last non-blank byte of the line first. A closing bracket or a
// colon is a place of its own.
func wordStart(data []byte, lineStart, at int) int {
	for at > lineStart && isBlank(data[at]) {
		at--
	}
	if data[at] == ']' || data[at] == '}' || data[at] == ':' {
		return at // a closing bracket with nothing open, a colon out of place
	}
	for at > lineStart && !isBlank(data[at-1]) {
		at--
	}
	return at
}

func isBlank(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// position turns a byte offset into a 1-based line and column (in
// characters).
func position(data []byte, off int) (line, col int) {
	starts := lineStarts(data)
	line = 1
	for line < len(starts) && starts[line] <= off {
		line++
	}
	return line, utf8.RuneCount(data[starts[line-1]:off]) + 1
}

// openingColumn returns the column of the first quote or opening bracket
// on line (1-based) of data, or 1.
func openingColumn(data []byte, line int) int {
	starts := lineStarts(data)
	if line < 1 || line > len(starts) {
		return 1
	}
	end := len(data)
	if line < len(starts) {
		end = starts[line]
	}
	l := data[starts[line-1]:end]
	if i := bytes.IndexAny(l, "'\"[{"); i >= 0 {
		return utf8.RuneCount(l[:i]) + 1
	}
	return 1
}
