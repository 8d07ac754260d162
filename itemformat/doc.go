// Package itemformat holds the formats of the items cachewarden keeps in
// memcached (docs/formats.md), each rule in one place: which keys
// memcached takes (CheckKey: at most 250 bytes, no control byte, space or
// DEL), set tokens and when a set is worth compacting (AppendToken,
// DecodeSet, SetState.Dirty, EncodeSet), the version a new namespace
// starts at (NamespaceStart), master items and their evidence bits
// (Master, MarkEvidence), expiry times (Expiration), and which server
// holds a key (Selector, the distributions of the client libraries).
//
// The daemon's appliers (cacheops, counters), the read side (client) and
// the checker (verify) all import it, so a reader and a writer can never
// disagree on a format. It is pure: it sends nothing to memcached, runs
// no query and keeps no state, and everything in it is safe for
// concurrent use. It is not a client: package client reads items,
// cacheops and counters write them.
package itemformat
