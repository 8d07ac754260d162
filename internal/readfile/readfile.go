// Package readfile reads whole files up to a size limit: the operator's
// files (config, rule files, rule tests, certificates, tokens), so that a
// huge file, a device such as /dev/zero or a pipe that never ends is
// refused with an error naming the file, its size and the limit, after
// reading at most the limit. Its functions are safe for concurrent use.
package readfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// TooLargeError is a file longer than the limit its reader sets.
type TooLargeError struct {
	Path string
	// Size is the file's size in bytes; -1 when the file is no regular
	// file (a pipe, a device) and only more than Limit bytes were read.
	Size  int64
	Limit int64
}

func (e *TooLargeError) Error() string { return e.Path + ": " + e.Detail() }

// Detail is the error without the path, for messages that name the file
// already.
func (e *TooLargeError) Detail() string {
	if e.Size < 0 {
		return fmt.Sprintf("more than %d bytes, the limit (read up to it and stopped)", e.Limit)
	}
	return fmt.Sprintf("%d bytes, more than the limit of %d", e.Size, e.Limit)
}

// ErrTooLarge is matched by every *TooLargeError (errors.Is).
var ErrTooLarge = errors.New("file too large")

// Is reports whether target is ErrTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// Reason is err, an error of Read, without the path, for messages that
// name the file already: TooLargeError.Detail, or the error of the file
// system behind an *fs.PathError (os.PathError), or else err's message.
func Reason(err error) string {
	var tl *TooLargeError
	if errors.As(err, &tl) {
		return tl.Detail()
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// Read returns the contents of the file at path, or a *TooLargeError
// when it holds more than limit bytes: a regular file by its size before
// anything is read, any other file (a pipe, a device) once limit+1 bytes
// were read. Errors of the file system are *os.PathError, as
// os.ReadFile's.
func Read(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := int64(-1)
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		size = st.Size()
		if size > limit {
			return nil, &TooLargeError{Path: path, Size: size, Limit: limit}
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err // an *os.PathError
	}
	if int64(len(data)) > limit {
		if size <= limit {
			size = -1 // it grew while read, or has no size
		}
		return nil, &TooLargeError{Path: path, Size: size, Limit: limit}
	}
	return data, nil
}
