package client

import (
	"errors"
	"io"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"
)

// redialingClient retries reads that fail on a pooled connection the
// server has closed. A restarted memcached leaves every idle connection of
// the pool dead; gomemcache returns the error of the first read on each
// and discards that connection, so without this an application's reads
// fail once per idle connection after every restart. Each retry takes
// another pooled connection or dials a new one, so at most one more than
// the pool holds are needed. Only reads are retried: a write that failed
// may have been executed.
type redialingClient struct {
	*memcache.Client
	attempts int
}

func (c *redialingClient) Get(key string) (it *memcache.Item, err error) {
	for range c.attempts {
		if it, err = c.Client.Get(key); !deadConnection(err) {
			break
		}
	}
	return it, err
}

func (c *redialingClient) GetMulti(keys []string) (items map[string]*memcache.Item, err error) {
	for range c.attempts {
		if items, err = c.Client.GetMulti(keys); !deadConnection(err) {
			break
		}
	}
	return items, err
}

// deadConnection reports whether err is what a read on a connection the
// server closed returns.
func deadConnection(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}
