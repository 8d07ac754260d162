package decode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxLineBytes bounds a line of LineReader, its "\n" or "\r\n" not
// counted: 16 MiB, far beyond a Kafka message's default limit (1 MiB),
// so that an input without newlines (/dev/zero) is refused once that
// much is read.
const MaxLineBytes = 16 << 20

// ErrLineTooLong is matched (errors.Is) by LineReader's error for a line
// of more than MaxLineBytes.
var ErrLineTooLong = errors.New("line too long")

// LineReader splits a stream into lines of up to MaxLineBytes without the
// trailing "\n" or "\r\n". Its results are valid until the next call.
// It is not safe for concurrent use.
type LineReader struct {
	r    *bufio.Reader
	long []byte
	done bool
	err  error
}

// NewLineReader returns a LineReader over r, read through a 64 KiB buffer.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next line; ok is false at the end of the input. A last
// line without a newline is returned; an empty input has no lines. A line
// of more than MaxLineBytes is an error wrapping ErrLineTooLong, returned
// once at most MaxLineBytes+2 bytes of it were read, and by every later
// call.
func (lr *LineReader) Next() (line []byte, ok bool, err error) {
	if lr.err != nil {
		return nil, false, lr.err
	}
	if lr.done {
		return nil, false, nil
	}
	line, err = lr.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		lr.long = append(lr.long[:0], line...)
		for err == bufio.ErrBufferFull && len(lr.long) <= MaxLineBytes+2 {
			line, err = lr.r.ReadSlice('\n')
			lr.long = append(lr.long, line...)
		}
		line = lr.long
	}
	if n := len(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})); n > MaxLineBytes {
		lr.err = fmt.Errorf("%w: more than %d bytes, the limit", ErrLineTooLong, MaxLineBytes)
		return nil, false, lr.err
	}
	switch {
	case err == io.EOF:
		lr.done = true
		if len(line) == 0 {
			return nil, false, nil
		}
	case err != nil:
		return nil, false, err
	}
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	return line, true, nil
}
