package cacheops

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Namespace versions. The daemon keeps one version per entity (such as
// "ns:user:12543") as ASCII decimal and increments it whenever the entity
// changes. An application embeds the current version in every key it
// builds for that entity, so one increment makes all of them unreachable
// at once; the old items simply age out.
//
// A missing version is created with NamespaceStart of the current time,
// the same value the daemon uses: a version recreated after an eviction is
// then larger than any earlier one, so keys built with an old version are
// not reused.

// namespaceAttempts bounds the get/add/get cycles of one Namespace call; a
// version that vanishes again right after a lost add means memcached is
// evicting it as fast as it is written.
const namespaceAttempts = 3

// Namespace returns the current version stored at key, creating it when it
// is missing. Concurrent callers racing on a missing key all return the
// same version: only one add wins and the others read the winner's value.
// Format the version into keys with strconv.FormatUint(v, 10). Safe for
// concurrent use; at most three round trips on a miss, one otherwise.
func (r *Reader) Namespace(key string) (uint64, error) {
	for range namespaceAttempts {
		it, err := r.mc.Get(key)
		if err == nil {
			return parseNamespaceVersion(key, it.Value)
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return 0, fmt.Errorf("cacheops: namespace %q: %w", key, err)
		}
		v, created, err := r.createNamespace(key)
		if err != nil {
			return 0, err
		}
		if created {
			return v, nil
		}
		// Lost the add to another reader or the daemon: read theirs.
	}
	return 0, fmt.Errorf("cacheops: namespace %q: version evicted %d times in a row", key, namespaceAttempts)
}

// Namespaces returns the current versions of several keys with one
// GetMulti round trip, creating the missing ones as Namespace does. The map
// has one entry per distinct key.
func (r *Reader) Namespaces(keys []string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(keys))
	items, err := r.mc.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("cacheops: namespaces %d keys: %w", len(keys), err)
	}
	for _, key := range keys {
		if _, done := out[key]; done {
			continue
		}
		if it, ok := items[key]; ok {
			v, err := parseNamespaceVersion(key, it.Value)
			if err != nil {
				return nil, err
			}
			out[key] = v
			continue
		}
		v, err := r.Namespace(key)
		if err != nil {
			return nil, err
		}
		out[key] = v
	}
	return out, nil
}

// createNamespace adds key with NamespaceStart of the current time.
// created is false when another client added it first.
func (r *Reader) createNamespace(key string) (version uint64, created bool, err error) {
	now := time.Now()
	version = NamespaceStart(now)
	err = r.mc.Add(&memcache.Item{
		Key:        key,
		Value:      strconv.AppendUint(nil, version, 10),
		Expiration: readExpiration(r.opts.NamespaceTTL, now),
	})
	switch {
	case err == nil:
		return version, true, nil
	case errors.Is(err, memcache.ErrNotStored):
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("cacheops: namespace %q: add: %w", key, err)
}

// parseNamespaceVersion reads an ASCII decimal version. memcached pads a
// number with trailing spaces when a decrement shortens it, so surrounding
// spaces are ignored.
func parseNamespaceVersion(key string, value []byte) (uint64, error) {
	v, err := strconv.ParseUint(strings.TrimSpace(string(value)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cacheops: namespace %q: value %q is not a version: %w", key, value, err)
	}
	return v, nil
}
