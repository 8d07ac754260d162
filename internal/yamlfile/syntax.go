package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// maxDepthError matches yaml.v3's message for nesting beyond its limit.
var maxDepthError = regexp.MustCompile(`exceeded max depth of (\d+)$`)

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
// first prefix that fails like the whole file (see locate for how it is
// found in bounded time): for a mis-indented key that is the key, for an
// unclosed '[' the bracket, for an undefined alias the '*'.
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
	if m := maxDepthError.FindStringSubmatch(text); m != nil {
		// yaml.v3's own limit, far beyond MaxDepth: the place is where
		// the parser stopped reading, a few bytes past the opening that
		// broke it.
		msg = fmt.Sprintf("YAML: nested more than %s levels deep, deeper than the limit of %d", m[1], MaxDepth)
		r := &byteReader{data: data}
		if failureOf(r) == text {
			line, col := position(data, max(r.off-1, 0))
			return &Error{Line: line, Column: col, Msg: msg}
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
	return failureOf(bytes.NewReader(data))
}

// failureOf is failure for the bytes r holds.
func failureOf(r io.Reader) string {
	dec := yaml.NewDecoder(r)
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

// locateFloor and locateBudget bound the search for the first prefix of
// a file that fails like the file: locateFloor bytes of parsing from the
// start of the file (all a small file needs), then locateBudget times
// the file's size from the line before the one yaml.v3 names.
const (
	locateFloor  = 16 << 10
	locateBudget = 4
)

// locate returns the byte offset of the start of the word where parsing
// stops with the error text want, and false when data does not fail so.
// It parses data at most about 30 times.
//
// The place is the end of the first prefix of data that fails like data
// (see syntaxError), found by trying line ends, then the bytes of the
// first line whose end fails the same way: from the start of the file,
// then from the line before the one yaml.v3 names, within locateFloor and
// locateBudget. Prefixes do not fail like data in order (one that ends
// inside a token fails otherwise), so that first prefix cannot be
// bisected; in a small file, or with the error near the start or near
// the line yaml.v3 names, the budget suffices.
//
// When it runs out, data is parsed once through a reader that hands the
// parser one byte at a time, so that it reads only as far as it needs: up
// to the token it fails at and its lookahead (the rest of a line, blanks,
// comments, the next token). Every prefix at least that long fails the
// same way, and the shortest failing prefix near where the parser
// stopped stands: the search steps back from there in doubling steps, at
// most maxGallop of them, then bisects the last step. (When the error is
// about something the end of the file left open, that is near the end,
// not where it opened.)
func locate(data []byte, want string) (int, bool) {
	if k, ok := firstFailing(data, want); ok {
		return wordAt(data, k), true
	}
	r := &byteReader{data: data}
	if failureOf(r) != want {
		return 0, false
	}
	return wordAt(data, shortestFailing(data, want, r.off)), true
}

// wordAt returns the offset of the start of the word holding the last
// byte of data[:k].
func wordAt(data []byte, k int) int {
	at := max(k-1, 0)
	return wordStart(data, lineStartOf(data, at), at)
}

// lineStartOf returns the offset of the start of the line holding
// data[at].
func lineStartOf(data []byte, at int) int {
	starts := lineStarts(data)
	line, _ := slices.BinarySearch(starts, at+1)
	return starts[line-1]
}

// maxGallop bounds the doubling steps of shortestFailing: 10, a window
// of 1 KiB before where the parser stopped reading.
const maxGallop = 10

// shortestFailing returns the length of the shortest prefix of data that
// fails with want, given that the parser fails so within data[:read]:
// every longer prefix fails the same way. (Of the shorter ones, those
// within the doubling steps do not; after maxGallop steps all failing so,
// the last stands.)
func shortestFailing(data []byte, want string, read int) int {
	// Invariants: data[:lo] does not fail with want, data[:hi] does (the
	// empty prefix parses).
	lo, hi := 0, read
	for step, n := 1, 0; hi-step > 0; step, n = step*2, n+1 {
		if n == maxGallop {
			return hi
		}
		if failure(data[:hi-step]) != want {
			lo = hi - step
			break
		}
		hi -= step
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if failure(data[:mid]) == want {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// firstFailing returns the length of the first prefix of data that fails
// with want, trying the ends of lines first and then the bytes of the
// first line whose end does, from the first line and then from the line
// before the one want names; false when locateBudget runs out.
func firstFailing(data []byte, want string) (int, bool) {
	starts := lineStarts(data)
	if k, ok := firstFailingFrom(data, want, starts, 0, locateFloor); ok {
		return k, true
	}
	if m := yamlLine.FindStringSubmatch(want); m != nil {
		line, _ := strconv.Atoi(m[1])
		if line > 2 && line <= len(starts) {
			return firstFailingFrom(data, want, starts, line-2, locateBudget*len(data))
		}
	}
	return 0, false
}

// firstFailingFrom is firstFailing from the line starts[from], parsing
// at most budget bytes.
func firstFailingFrom(data []byte, want string, starts []int, from, budget int) (int, bool) {
	for i := from; i < len(starts); i++ {
		start, end := starts[i], len(data)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		if budget -= end; budget < 0 {
			return 0, false
		}
		if failure(data[:end]) != want {
			continue
		}
		for k := start + 1; k < end; k++ {
			if budget -= k; budget < 0 {
				return 0, false
			}
			if failure(data[:k]) == want {
				return k, true
			}
		}
		return end, true
	}
	return 0, false
}

// byteReader reads data one byte at a time, counting what was read.
type byteReader struct {
	data []byte
	off  int
}

func (r *byteReader) Read(p []byte) (int, error) {
	if r.off == len(r.data) {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.data[r.off]
	r.off++
	return 1, nil
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
	line, _ = slices.BinarySearch(starts, off+1)
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
