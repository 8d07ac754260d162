package itemformat

import (
	"encoding/hex"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Master namespaces with evidence (docs/formats.md). A bump rule with
// evidence keeps, beside each entity's own namespace, one master item:
//
//	<version> <bitmap>
//
// the master version in ASCII decimal, one space, and the bitmap of
// rules.Evidence.Bits bits as lower-case hex, most significant bit of
// the first byte first: bit b is bit 7-b%8 of byte b/8. An entity whose
// bit is clear reads the master version; one whose bit is set reads its
// own namespace. The daemon sets an entity's bit (after bumping the
// entity's namespace) with a compare-and-swap on the master, and rolls the
// master (version+1, every bit clear) rather than set more than MaxSet
// bits. Version and bitmap are one item, so no reader ever combines a
// master version with the evidence of another.

// Master is a decoded master item.
type Master struct {
	Version uint64
	// Evidence is the bitmap, Bits/8 bytes.
	Evidence []byte
}

// NewMaster returns a master at version with every one of bits bits
// clear.
func NewMaster(version uint64, bits int) Master {
	return Master{Version: version, Evidence: make([]byte, bits/8)}
}

// DecodeMaster parses a master item whose bitmap has bits bits.
func DecodeMaster(value []byte, bits int) (Master, error) {
	version, bitmap, ok := strings.Cut(strings.TrimRight(string(value), " "), " ")
	if !ok {
		return Master{}, fmt.Errorf("master item %q: want \"<version> <bitmap>\"", value)
	}
	v, err := strconv.ParseUint(version, 10, 64)
	if err != nil {
		return Master{}, fmt.Errorf("master item %q: version: %w", value, err)
	}
	if len(bitmap) != bits/4 || strings.ToLower(bitmap) != bitmap {
		return Master{}, fmt.Errorf("master item %q: want a bitmap of %d lower-case hex digits", value, bits/4)
	}
	ev, err := hex.DecodeString(bitmap)
	if err != nil {
		return Master{}, fmt.Errorf("master item %q: bitmap: %w", value, err)
	}
	return Master{Version: v, Evidence: ev}, nil
}

// Encode returns the item of m.
func (m Master) Encode() []byte {
	out := strconv.AppendUint(make([]byte, 0, 21+2*len(m.Evidence)), m.Version, 10)
	out = append(out, ' ')
	return hex.AppendEncode(out, m.Evidence)
}

// Has reports whether bit b is set.
func (m Master) Has(b int) bool { return m.Evidence[b/8]&(0x80>>(b%8)) != 0 }

// Count returns the number of bits set.
func (m Master) Count() int {
	n := 0
	for _, x := range m.Evidence {
		n += bits.OnesCount8(x)
	}
	return n
}

// Token returns the text a reader of an entity whose bit is clear embeds
// in its keys: "m" and the master version, so that it never equals an
// entity namespace's version.
func (m Master) Token() string { return "m" + strconv.FormatUint(m.Version, 10) }

// MarkEvidence returns the master item that value becomes once the bits
// of the entities the daemon bumped are set: value with those bits set;
// or, when that would set more than maxSet bits, the next version with
// every bit clear (a roll); or, when value is not a master item of
// evidenceBits bits, a new master at NamespaceStart(now) with every bit
// clear. changed is false when every bit was set already.
func MarkEvidence(value []byte, set []int, evidenceBits, maxSet int, now time.Time) (next []byte, changed bool) {
	m, err := DecodeMaster(value, evidenceBits)
	if err != nil {
		return NewMaster(NamespaceStart(now), evidenceBits).Encode(), true
	}
	ev := append([]byte(nil), m.Evidence...)
	for _, b := range set {
		ev[b/8] |= 0x80 >> (b % 8)
	}
	n := Master{Version: m.Version, Evidence: ev}
	switch count := n.Count(); {
	case count == m.Count():
		return value, false
	case count > maxSet:
		return NewMaster(m.Version+1, evidenceBits).Encode(), true
	}
	return n.Encode(), true
}
