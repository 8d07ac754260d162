package counters

import (
	"strconv"
	"strings"
)

// gtidSet is a set of global transaction IDs as a server reports it:
//
//   - MariaDB: a GTID position "domain-server-seq[,domain-server-seq...]",
//     the last transaction logged per replication domain (what
//     BINLOG_GTID_POS and @@gtid_binlog_pos return). Within a domain,
//     sequence numbers grow in binary log order, so the set holds every
//     transaction of the domain up to that sequence number.
//   - MySQL: a GTID set "uuid:1-5:7[,uuid:...]" (gtid_executed).
//
// The zero value is the empty set of neither kind.
type gtidSet struct {
	maria map[uint32]uint64
	mysql map[string][][2]uint64
}

// parseGTIDSet parses s (whitespace, which MySQL puts after commas, is
// ignored). ok is false when s is empty or malformed.
func parseGTIDSet(s string) (set gtidSet, ok bool) {
	s = strings.Join(strings.Fields(s), "")
	if s == "" {
		return gtidSet{}, false
	}
	for _, part := range strings.Split(s, ",") {
		if d, _, seq, ok := parseMariaGTID(part); ok {
			if set.mysql != nil {
				return gtidSet{}, false
			}
			if set.maria == nil {
				set.maria = make(map[uint32]uint64)
			}
			set.maria[d] = max(set.maria[d], seq)
			continue
		}
		uuid, rest, found := strings.Cut(part, ":")
		if !found || set.maria != nil || !isUUID(uuid) {
			return gtidSet{}, false
		}
		if set.mysql == nil {
			set.mysql = make(map[string][][2]uint64)
		}
		uuid = strings.ToLower(uuid)
		for _, iv := range strings.Split(rest, ":") {
			lo, hi, isRange := strings.Cut(iv, "-")
			a, err1 := strconv.ParseUint(lo, 10, 64)
			b, err2 := a, error(nil)
			if isRange {
				b, err2 = strconv.ParseUint(hi, 10, 64)
			}
			if err1 != nil || err2 != nil || a == 0 || b < a {
				return gtidSet{}, false
			}
			set.mysql[uuid] = append(set.mysql[uuid], [2]uint64{a, b})
		}
	}
	return set, true
}

// parseMariaGTID parses one MariaDB GTID "domain-server-seq".
func parseMariaGTID(s string) (domain, server uint32, seq uint64, ok bool) {
	parts := strings.Split(s, "-")
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	d, err1 := strconv.ParseUint(parts[0], 10, 32)
	sv, err2 := strconv.ParseUint(parts[1], 10, 32)
	n, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, false
	}
	return uint32(d), uint32(sv), n, true
}

// isUUID reports whether s looks like a server UUID (32 hex digits with
// or without the four dashes).
func isUUID(s string) bool {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
			n++
		case c == '-':
		default:
			return false
		}
	}
	return n == 32
}

// contains reports whether the transaction gtid (one GTID, as a change
// event carries it) is in the set. ok is false when gtid is malformed or
// of the other kind than the set (a MariaDB GTID against a MySQL set).
// A MariaDB domain the set does not name holds no transaction yet.
func (g gtidSet) contains(gtid string) (in, ok bool) {
	if d, _, seq, ok := parseMariaGTID(gtid); ok {
		if g.maria == nil {
			return false, false
		}
		last, named := g.maria[d]
		return named && seq <= last, true
	}
	uuid, n, found := strings.Cut(gtid, ":")
	if !found || g.mysql == nil || !isUUID(uuid) {
		return false, false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		return false, false
	}
	for _, iv := range g.mysql[strings.ToLower(uuid)] {
		if seq >= iv[0] && seq <= iv[1] {
			return true, true
		}
	}
	return false, true
}
