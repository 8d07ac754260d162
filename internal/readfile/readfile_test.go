package readfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, size int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Repeat("x", size)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const limit = 100
	for _, tc := range []struct {
		name string
		path string
		size int    // of the contents read, when no error
		want string // the error, "" for none
		// reason is Reason of the error: the error without the path.
		reason string
	}{
		{name: "empty", path: file("empty", 0)},
		{name: "under the limit", path: file("small", 99), size: 99},
		{name: "at the limit", path: file("limit", limit), size: limit},
		{name: "over the limit", path: file("large", limit+1), want: dir + "/large: 101 bytes, more than the limit of 100", reason: "101 bytes, more than the limit of 100"},
		{name: "a device without end", path: "/dev/zero", want: "/dev/zero: more than 100 bytes, the limit (read up to it and stopped)", reason: "more than 100 bytes, the limit (read up to it and stopped)"},
		{name: "missing", path: filepath.Join(dir, "none"), want: "open " + dir + "/none: no such file or directory", reason: "no such file or directory"},
		{name: "a directory", path: dir, want: "read " + dir + ": is a directory", reason: "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Read(tc.path, limit)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("error %q, want %q", got, tc.want)
			}
			if err != nil && Reason(err) != tc.reason {
				t.Errorf("Reason %q, want %q", Reason(err), tc.reason)
			}
			if err == nil && len(data) != tc.size {
				t.Errorf("read %d bytes, want %d", len(data), tc.size)
			}
			if tl := (*TooLargeError)(nil); errors.As(err, &tl) != errors.Is(err, ErrTooLarge) {
				t.Errorf("errors.Is(ErrTooLarge) disagrees with errors.As for %v", err)
			}
			if tc.name == "missing" && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("error %v is not fs.ErrNotExist", err)
			}
		})
	}
}
