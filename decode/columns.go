package decode

// ColumnSet is a set of column names that a Decoder keeps in the rows it
// builds (Decoder.Keep). Looking a name up costs a comparison with the
// members of the same length, usually none or one. A ColumnSet is
// read-only once made, and safe for concurrent use.
type ColumnSet struct {
	byLen [columnSetShort][]string
	long  map[string]bool
}

// columnSetShort bounds the names kept by length; longer ones are in a
// map.
const columnSetShort = 64

// NewColumnSet returns the set of names.
func NewColumnSet(names []string) *ColumnSet {
	s := &ColumnSet{}
	for _, n := range names {
		if s.Has(n) {
			continue
		}
		if len(n) < columnSetShort {
			s.byLen[len(n)] = append(s.byLen[len(n)], n)
			continue
		}
		if s.long == nil {
			s.long = make(map[string]bool)
		}
		s.long[n] = true
	}
	return s
}

// Has reports whether name is in the set.
func (s *ColumnSet) Has(name string) bool {
	if len(name) < columnSetShort {
		for _, n := range s.byLen[len(name)] {
			if n == name {
				return true
			}
		}
		return false
	}
	return s.long[name]
}
