package itemformat

import (
	"errors"
	"fmt"

	"github.com/cachewarden/cachewarden/rules"
)

// ErrInvalidKey means a key is empty, longer than 250 bytes
// (rules.MaxKeyLen) or holds a byte memcached does not allow in a key
// (<= 0x20 or 0x7f). Such a key is never sent.
var ErrInvalidKey = errors.New("invalid memcached key")

// CheckKey rejects a key memcached cannot take as one token of a
// command: empty, longer than rules.MaxKeyLen (250) bytes, or holding a
// byte <= 0x20 or 0x7f. A key it accepts cannot alter the request it is
// sent in. The error wraps ErrInvalidKey.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > rules.MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), rules.MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; isSetTokenSeparator(c) {
			return fmt.Errorf("%w: byte 0x%02x at offset %d", ErrInvalidKey, c, i)
		}
	}
	return nil
}
