package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Namespace versions. The daemon keeps one version per entity (such as
// "shop:ns:user:12543") as ASCII decimal and increments it whenever the
// entity changes. An application embeds the current version in every key
// it builds for that entity, so one increment makes all of them
// unreachable at once; the old items simply age out.
//
// A missing version is created with itemformat.NamespaceStart of the current
// time, the value the daemon uses too: a version recreated after an
// eviction is then larger than any earlier one, so keys built with an old
// version are not reused.

// namespaceAttempts bounds the get/add/get cycles of one namespace read; a
// version that vanishes again right after a lost add means memcached is
// evicting it as fast as it is written.
const namespaceAttempts = 3

// Namespace returns the current version of the named bump rule's
// namespace for row, as the text to embed in the keys the application
// builds for the entity (such as "page:user:42:v" + version). A missing
// version is created; concurrent callers racing on a missing namespace all
// get the same version. One round trip when the version exists, at most
// three otherwise. ctx is checked before each round trip.
func (c *Client) Namespace(ctx context.Context, rule string, row Row) (string, error) {
	r, err := c.ruleOf(rule, rules.BumpRule)
	if err != nil {
		return "", err
	}
	return r.Namespace(ctx, row)
}

// Namespaces returns the versions of the named rule's namespaces for rows,
// in order, reading them all with one GetMulti (one round trip per server
// involved) and creating the missing ones as Namespace does.
func (c *Client) Namespaces(ctx context.Context, rule string, rows []Row) ([]string, error) {
	r, err := c.ruleOf(rule, rules.BumpRule)
	if err != nil {
		return nil, err
	}
	return r.Namespaces(ctx, rows)
}

// Namespace is Client.Namespace for this rule, which must be a bump rule.
func (r *Rule) Namespace(ctx context.Context, row Row) (string, error) {
	vs, err := r.Namespaces(ctx, []Row{row})
	if err != nil {
		return "", err
	}
	return vs[0], nil
}

// Namespaces is Client.Namespaces for this rule, which must be a bump
// rule.
//
// For a rule with copies (hot keys) each row's version is read from one
// of the copies, picked at random. For a rule with evidence the master
// item is read first: rows whose entity's bit is clear get the master
// version ("m" and its digits), the others their own namespace's version
// (one GetMulti for all of them).
func (r *Rule) Namespaces(ctx context.Context, rows []Row) ([]string, error) {
	if r.rule.Kind != rules.BumpRule {
		return nil, fmt.Errorf("%w: %q is a %s rule, not a bump rule", ErrUnknownRule, r.rule.Name, r.rule.Kind)
	}
	out := make([]string, len(rows))
	var master itemformat.Master
	if ev := r.rule.Evidence; ev != nil {
		var err error
		if master, err = r.c.master(ctx, ev, r.rule.TTL); err != nil {
			return nil, err
		}
	}
	var keys []string
	var at []int
	for i, row := range rows {
		raw, err := r.rendered(row)
		if err != nil {
			return nil, err
		}
		if ev := r.rule.Evidence; ev != nil {
			id, _ := rules.ValueOf(row[ev.Column]) // rendered: valid and not NULL
			if !master.Has(rules.EvidenceBit(id.Text, ev.Bits)) {
				out[i] = master.Token()
				continue
			}
		}
		keys = append(keys, r.readKey(raw))
		at = append(at, i)
	}
	if len(keys) == 0 {
		return out, nil
	}
	versions, err := r.c.versions(ctx, keys, r.rule.TTL)
	if err != nil {
		return nil, err
	}
	for j, k := range keys {
		out[at[j]] = strconv.FormatUint(versions[k], 10)
	}
	return out, nil
}

// readKey returns the key a reader reads the namespace rendered as raw
// at: the key, or for a rule with copies one of the copies at random.
func (r *Rule) readKey(raw []byte) string {
	if r.rule.Copies > 0 {
		return rules.CopyKey(raw, rand.IntN(r.rule.Copies))
	}
	return rules.FinishKey(raw)
}

// CopyKeys returns the keys of the copies of the namespace of a rule with
// copies for row; nil for other rules.
func (r *Rule) CopyKeys(row Row) ([]string, error) {
	raw, err := r.rendered(row)
	if err != nil || r.rule.Copies == 0 {
		return nil, err
	}
	keys := make([]string, r.rule.Copies)
	for i := range keys {
		keys[i] = rules.CopyKey(raw, i)
	}
	return keys, nil
}

// master returns the master item of ev, creating it when missing (and
// replacing one that is not a master item of ev.Bits bits) at
// NamespaceStart of the current time with every bit clear.
func (c *Client) master(ctx context.Context, ev *rules.Evidence, ttl time.Duration) (itemformat.Master, error) {
	if m, ok := c.hold.get(ev.MasterKey); ok {
		return m.(itemformat.Master), nil
	}
	for range namespaceAttempts {
		if err := checkContext(ctx, "master "+strconv.Quote(ev.MasterKey)); err != nil {
			return itemformat.Master{}, err
		}
		it, err := c.mc.Get(ev.MasterKey)
		if err == nil {
			m, derr := itemformat.DecodeMaster(it.Value, ev.Bits)
			if derr == nil {
				c.hold.put(ev.MasterKey, m)
				return m, nil
			}
			c.log.Warn("replacing an unreadable master namespace", "key", ev.MasterKey, "err", derr)
		} else if !errors.Is(err, memcache.ErrCacheMiss) {
			return itemformat.Master{}, fmt.Errorf("client: master %q: %w", ev.MasterKey, err)
		}
		// A new master version: nothing is cached under it yet, whatever
		// the bits of the old one were.
		now := time.Now()
		m := itemformat.NewMaster(itemformat.NamespaceStart(now), ev.Bits)
		item := &memcache.Item{Key: ev.MasterKey, Value: m.Encode(), Expiration: readExpiration(ttl, now)}
		if it != nil {
			item.Flags, item.CasID = it.Flags, it.CasID
			err = c.mc.CompareAndSwap(item)
		} else {
			err = c.mc.Add(item)
		}
		switch {
		case err == nil:
			c.hold.put(ev.MasterKey, m)
			return m, nil
		case !errors.Is(err, memcache.ErrNotStored) && !errors.Is(err, memcache.ErrCASConflict) && !errors.Is(err, memcache.ErrCacheMiss):
			return itemformat.Master{}, fmt.Errorf("client: master %q: %w", ev.MasterKey, err)
		}
		// Another client wrote it first: read theirs.
	}
	return itemformat.Master{}, fmt.Errorf("client: master %q: changed or evicted %d times in a row", ev.MasterKey, namespaceAttempts)
}

// versions returns the versions stored at keys (one GetMulti), creating
// the missing ones with lifetime ttl.
func (c *Client) versions(ctx context.Context, keys []string, ttl time.Duration) (map[string]uint64, error) {
	out := make(map[string]uint64, len(keys))
	var fetch []string
	for _, key := range keys {
		if v, ok := c.hold.get(key); ok {
			out[key] = v.(uint64)
		} else {
			fetch = append(fetch, key)
		}
	}
	if len(fetch) == 0 {
		return out, nil
	}
	if err := checkContext(ctx, "namespaces"); err != nil {
		return nil, err
	}
	items, err := c.mc.GetMulti(fetch)
	if err != nil {
		return nil, fmt.Errorf("client: namespaces %q: %w", fetch, err)
	}
	for _, key := range fetch {
		if _, done := out[key]; done {
			continue
		}
		if it, ok := items[key]; ok {
			v, err := parseVersion(key, it.Value)
			if err != nil {
				return nil, err
			}
			out[key] = v
			c.hold.put(key, v)
			continue
		}
		v, err := c.version(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		out[key] = v
		c.hold.put(key, v)
	}
	return out, nil
}

// version returns the version at key, creating it when missing.
func (c *Client) version(ctx context.Context, key string, ttl time.Duration) (uint64, error) {
	for attempt := range namespaceAttempts {
		if attempt > 0 {
			if err := checkContext(ctx, "namespace "+strconv.Quote(key)); err != nil {
				return 0, err
			}
			it, err := c.mc.Get(key)
			if err == nil {
				return parseVersion(key, it.Value)
			}
			if !errors.Is(err, memcache.ErrCacheMiss) {
				return 0, fmt.Errorf("client: namespace %q: %w", key, err)
			}
		}
		v, created, err := c.createVersion(key, ttl)
		if err != nil || created {
			return v, err
		}
		// Lost the add to another reader or the daemon: read theirs.
	}
	return 0, fmt.Errorf("client: namespace %q: version evicted %d times in a row", key, namespaceAttempts)
}

// createVersion adds key with NamespaceStart of the current time. created
// is false when another client added it first.
func (c *Client) createVersion(key string, ttl time.Duration) (version uint64, created bool, err error) {
	now := time.Now()
	version = itemformat.NamespaceStart(now)
	err = c.mc.Add(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, version, 10), Expiration: readExpiration(ttl, now)})
	switch {
	case err == nil:
		return version, true, nil
	case errors.Is(err, memcache.ErrNotStored):
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("client: namespace %q: add: %w", key, err)
}

// parseVersion reads a namespace version (itemformat.ParseVersion), or
// says why key's value is not one.
func parseVersion(key string, value []byte) (uint64, error) {
	v, ok := itemformat.ParseVersion(value)
	if !ok {
		return 0, fmt.Errorf("client: namespace %q: value %q is not a version (docs/formats.md, \"Namespace versions\")", key, value)
	}
	return v, nil
}
