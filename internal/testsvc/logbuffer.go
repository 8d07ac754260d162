package testsvc

import (
	"strings"
	"sync"
)

// LogBuffer collects what a logger or a child process writes, for a test
// to read while writes go on. It is safe for concurrent use; the zero
// value is empty and ready.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
