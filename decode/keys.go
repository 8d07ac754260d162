package decode

import "encoding/binary"

// The member names of a producer's messages come in the same order in
// every message of a table: Debezium writes before, after, source, op,
// ... and each table's columns in table order. keyCache remembers the
// sequences of names seen so far as a tree per kind of object, so that
// the next message's names are recognised by comparing their raw text
// `"name":` with that of the names that followed the previous name last
// time (the most recent first), a word or three at a time, instead of
// scanning each name as a string and looking it up.
//
// A name is only remembered when it has no escapes, is at most
// maxKeyName bytes long and its ':' follows the closing quote directly;
// a name that matches the remembered text is therefore valid JSON as it
// stands. Anything else is read the ordinary way (and the rest of that
// object too, when the tree cannot grow).

// Kinds of objects, each with its own tree (the roots of keyCache.nodes).
const (
	objTop     = iota // the top level of a message
	objPayload        // an envelope's payload
	objSource         // a Debezium source block
	objRow            // a row image
	nObjKinds
)

// maxKeyNodes bounds the names a keyCache remembers (about 200 bytes
// each with their text, so at most about 1 MB per Decoded). Names beyond
// it are read the ordinary way.
const maxKeyNodes = 4096

// maxKeyName bounds the length of the names a keyCache remembers: their
// text `"name":` is compared in up to three words.
const maxKeyName = 24 - len(`"":`)

// keyNode is one remembered member name, a child of the name that came
// before it in its object (or of its kind's root).
type keyNode struct {
	// w0 and m0 give the first up to 8 bytes of pat (masked), w1 its
	// last 8 bytes when it is longer than 8, w2 the 8 after the first
	// when it is longer than 16.
	w0, m0, w1, w2 uint64
	// v1 and m1 give the bytes 8 to 15 of pat (masked, zero when it is
	// not longer than 8).
	v1, m1 uint64
	// n is len(pat).
	n int
	// pat is `"name":` (owned, not the message's memory).
	pat string
	// name is the member name, pat[1:len(pat)-2].
	name string
	// child is the first of the names seen after this one, sib the next
	// name seen after this one's parent; -1 for none. parent is the name
	// before this one (or its kind's root).
	child, sib, parent int32
	// id is keyID(name) in top-level and payload objects, sourceKey(name)
	// in source blocks.
	id int8
	// keep tells, in rows, whether the column is kept (ColumnSet.Has).
	keep bool
	// dup tells that a name before this one in its object is the same:
	// the member is a duplicate, whose value replaces the earlier one's
	// (see decodeState.row).
	dup bool
}

// keyCache is the memory of member names of one decodeState.
type keyCache struct {
	nodes []keyNode
	// keep is the ColumnSet the rows' keep flags were computed with.
	keep *ColumnSet
}

// reset empties the cache when it is new or keep differs from the set
// its row flags were computed with.
func (kc *keyCache) reset(keep *ColumnSet) {
	if len(kc.nodes) != 0 && kc.keep == keep {
		return
	}
	kc.keep = keep
	kc.nodes = kc.nodes[:0]
	for range nObjKinds {
		kc.nodes = append(kc.nodes, keyNode{child: -1, sib: -1, parent: -1})
	}
}

// first returns the first child of node cur when its text `"name":` is
// at b[i:] and not longer than 16 bytes, else -1 (lookup then tries all
// children): the first child is usually the one wanted, and first is
// small enough to be inlined.
func (kc *keyCache) first(b []byte, cur int32, i int) int32 {
	if cur >= 0 && i+16 <= len(b) {
		if c := kc.nodes[cur].child; c >= 0 {
			nd := &kc.nodes[c]
			if (binary.LittleEndian.Uint64(b[i:i+8])^nd.w0)&nd.m0|(binary.LittleEndian.Uint64(b[i+8:i+16])^nd.v1)&nd.m1 == 0 && nd.n <= 16 {
				return c
			}
		}
	}
	return -1
}

// lookup returns the child of node cur whose text `"name":` is at b[i:],
// or -1 (also when cur is -1).
func (kc *keyCache) lookup(b []byte, cur int32, i int) int32 {
	if cur < 0 || i+8 > len(b) {
		return -1
	}
	w := binary.LittleEndian.Uint64(b[i : i+8])
	nodes := kc.nodes
	c := nodes[cur].child
	for c >= 0 {
		nd := &nodes[c]
		if (w^nd.w0)&nd.m0 == 0 {
			n := nd.n
			if n <= 8 {
				return c
			}
			if j := i + n; j <= len(b) && binary.LittleEndian.Uint64(b[j-8:j]) == nd.w1 &&
				(n <= 16 || binary.LittleEndian.Uint64(b[i+8:i+16]) == nd.w2) {
				return c
			}
		}
		c = nd.sib
	}
	return -1
}

// learn returns the child of cur named key, adding it when there is none
// and raw says the name was read from `"key":` as it stands; -1 when cur
// is -1 or the name cannot be added.
func (kc *keyCache) learn(cur int32, key string, raw bool, kind int) int32 {
	if cur < 0 {
		return -1
	}
	for c := kc.nodes[cur].child; c >= 0; c = kc.nodes[c].sib {
		if kc.nodes[c].name == key {
			return c
		}
	}
	if !raw || len(key) > maxKeyName || len(kc.nodes) >= maxKeyNodes {
		return -1
	}
	pat := `"` + key + `":`
	nd := keyNode{pat: pat, n: len(pat), name: pat[1 : len(pat)-2], child: -1, sib: kc.nodes[cur].child, parent: cur}
	for p := cur; p >= nObjKinds; p = kc.nodes[p].parent {
		if kc.nodes[p].name == key {
			nd.dup = true
			break
		}
	}
	var w [8]byte
	copy(w[:], pat)
	nd.w0 = binary.LittleEndian.Uint64(w[:])
	nd.m0 = ^uint64(0)
	if len(pat) < 8 {
		nd.m0 = 1<<(8*len(pat)) - 1
	} else {
		nd.w1 = binary.LittleEndian.Uint64([]byte(pat[len(pat)-8:]))
	}
	if len(pat) > 8 {
		w = [8]byte{}
		copy(w[:], pat[8:min(16, len(pat))])
		nd.v1 = binary.LittleEndian.Uint64(w[:])
		nd.m1 = ^uint64(0)
		if len(pat) < 16 {
			nd.m1 = 1<<(8*(len(pat)-8)) - 1
		}
	}
	if len(pat) > 16 {
		nd.w2 = binary.LittleEndian.Uint64([]byte(pat[8:16]))
	}
	switch kind {
	case objTop, objPayload:
		nd.id = int8(keyID(key))
	case objSource:
		nd.id = int8(sourceKey(key))
	case objRow:
		nd.keep = kc.keep == nil || kc.keep.Has(key)
	}
	kc.nodes = append(kc.nodes, nd)
	c := int32(len(kc.nodes) - 1)
	kc.nodes[cur].child = c
	return c
}

// memberName reads the member name at s[i] and the ':' after it the
// ordinary way, for an object of the given kind whose previous name is
// node cur. It returns the name, its node (or -1), the offsets of its raw
// text and the offset after the ':'.
func (st *decodeState) memberName(i int, cur int32, kind int) (key string, node int32, klo, khi, end int, ok bool) {
	sc := &st.sc
	s := sc.s
	if i >= len(s) || s[i] != '"' {
		sc.i = i
		return "", -1, 0, 0, i, sc.failAt("expected member name")
	}
	sc.i = i
	if key, ok = sc.str(); !ok {
		return "", -1, 0, 0, i, false
	}
	klo, khi = i+1, sc.i-1
	i = sc.i
	raw := i < len(s) && s[i] == ':' && khi-klo == len(key)
	if !raw {
		if i = wsEnd(s, i); i >= len(s) || s[i] != ':' {
			sc.i = i
			return "", -1, 0, 0, i, sc.failAt("expected ':' after member name")
		}
	}
	return key, st.keys.learn(cur, key, raw, kind), klo, khi, i + 1, true
}
