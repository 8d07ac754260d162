package decode

import (
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// maxwellTsMsThreshold separates Maxwell's "ts" in seconds (DML) from
// milliseconds (DDL): 1e11 seconds is beyond the year 5000.
const maxwellTsMsThreshold = 100_000_000_000

// maxwell decodes a Maxwell message: one row per message.
//
// Types "insert", "update", "delete" and "bootstrap-insert" (a read) are
// row changes; the before image of an update is "data" overlaid with "old"
// (the previous values of the changed columns). "bootstrap-start" and
// "bootstrap-complete" are skipped as SkipBootstrap, "database-*",
// "table-*" and "view-*" as SkipDDL, "heartbeat" as SkipHeartbeat; any
// other type is a DecodeError naming the table: a row change the decoder
// cannot read must not pass unnoticed.
// Encrypted messages (encrypt=data or all) are errors: their rows cannot
// be read.
func (d *Decoder) maxwell(m msg, pos rules.Position, out *Decoded) error {
	const f = FormatMaxwell
	st := &out.st
	if ef := m.get(kEncrypted); ef != nil {
		return &DecodeError{Format: f, Offset: int(ef.off), Path: "encrypted", Reason: "message is encrypted (Maxwell encrypt option); rows cannot be read"}
	}
	typ, tf := m.str(kType)
	if tf == nil || tf.val.Kind != rules.KindString {
		return &DecodeError{Format: f, Offset: -1, Path: "type", Reason: "missing or non-string type"}
	}
	var op rules.Operation
	switch typ {
	case "insert":
		op = rules.Insert
	case "update":
		op = rules.Update
	case "delete":
		op = rules.Delete
	case "bootstrap-insert":
		op = rules.Read
	case "bootstrap-start", "bootstrap-complete":
		out.Skip = SkipBootstrap
		return nil
	case "heartbeat":
		out.Skip = SkipHeartbeat
		return nil
	default:
		if strings.HasPrefix(typ, "database-") || strings.HasPrefix(typ, "table-") || strings.HasPrefix(typ, "view-") {
			out.Skip = SkipDDL
			return nil
		}
		db, _ := m.str(kDatabase)
		table, _ := m.str(kTable)
		return d.unknownOp(f, tf, "type", typ, "insert, update, delete, bootstrap-*, database-*, table-*, view-*, heartbeat", pos.Topic, db, table)
	}

	data, ok := rowOf(m.get(kData))
	if !ok {
		return &DecodeError{Format: f, Offset: int(m.get(kData).off), Path: "data", Reason: "data is not an object"}
	}
	if !data.present() {
		return &DecodeError{Format: f, Offset: -1, Path: "data", Reason: typ + " without data"}
	}
	old, ok := rowOf(m.get(kOld))
	if !ok {
		return &DecodeError{Format: f, Offset: int(m.get(kOld).off), Path: "old", Reason: "old is not an object or null"}
	}

	db, _ := m.str(kDatabase)
	table, _ := m.str(kTable)
	db, table, missing := d.resolveTable(pos.Topic, db, table)
	if missing != "" {
		return d.missingTable(f, missing, missing, pos.Topic)
	}

	src := maxwellSource(m, pos)

	before, after := absent, data
	switch op {
	case rules.Update:
		before = st.overlay(data, old)
	case rules.Delete:
		before, after = data, absent
	}
	out.addEvent(op, db, table, before, after, src)
	return nil
}

// maxwellSource returns pos completed with what message m says of its
// source: ts (seconds, or milliseconds from maxwellTsMsThreshold on),
// position "file:pos", gtid and server_id.
func maxwellSource(m msg, pos rules.Position) rules.Position {
	src := pos
	if tsf := m.get(kTs); tsf != nil {
		if n, ok := parseInt64(tsf.val); ok {
			if n < maxwellTsMsThreshold {
				n *= 1000
			}
			src.TsMs = n
		}
	}
	if p, _ := m.str(kPosition); p != "" {
		if i := strings.LastIndexByte(p, ':'); i > 0 {
			if n, err := strconv.ParseInt(p[i+1:], 10, 64); err == nil {
				src.BinlogFile, src.BinlogPos = p[:i], n
			}
		}
	}
	if g, _ := m.str(kGTID); g != "" {
		src.GTID = g
	}
	if sf := m.get(kServerID); sf != nil {
		if id := parseServerID(sf.val); id != 0 {
			src.ServerID = id
		}
	}
	return src
}
