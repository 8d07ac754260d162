package itemformat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

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
	if !hasKeySeparator(key) {
		return nil
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; isSetTokenSeparator(c) {
			return fmt.Errorf("%w: byte 0x%02x at offset %d", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// hasKeySeparator reports whether s holds a byte <= 0x20 or 0x7f,
// eight bytes at a time: every op's key is checked on its way out.
//
// Per byte, x-0x21 borrows into the high bit when x < 0x21 and x^0x7f-1
// when x == 0x7f; masking with ^x leaves bytes >= 0x80 out. A borrow from
// a lower byte can flag a higher one, but only below a byte that is
// flagged itself, so the word is flagged exactly when one of its bytes is.
func hasKeySeparator(s string) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	b := unsafe.Slice(unsafe.StringData(s), len(s)) // read only
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		if ((w-ones*0x21)|((w^(ones*0x7f))-ones))&^w&highs != 0 {
			return true
		}
	}
	for ; i < len(s); i++ {
		if isSetTokenSeparator(s[i]) {
			return true
		}
	}
	return false
}
