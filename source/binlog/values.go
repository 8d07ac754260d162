package binlog

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cachewarden/cachewarden/rules"
)

// column is what mapping a value of one column needs: its name and how the
// binary log encodes it.
type column struct {
	Name string
	// Type is the binlog type (mysql.MYSQL_TYPE_*), with ENUM and SET
	// resolved from the STRING type they are logged under; Meta is the
	// table map's metadata of the column (fractional digits, bit count).
	Type byte
	Meta uint16
	// Unsigned is true for an UNSIGNED integer column.
	Unsigned bool
	// Binary is true for bytes (BINARY, VARBINARY, BLOB): false for text.
	Binary bool
	// Nullable is true when the column allows NULL.
	Nullable bool
	// Members are the names of an ENUM's or SET's members, in order.
	Members []string
}

// toValue maps the value go-mysql decoded for column c (v, decoded with
// ParseTime off, TIMESTAMP strings in UTC, decimals as strings) to the
// rules.Value a Debezium MySQL connector's JSON with its default settings
// gives the decode package (doc.go lists the rules).
func toValue(c *column, v any) (rules.Value, error) {
	if v == nil {
		return rules.Value{}, nil
	}
	switch c.Type {
	case mysql.MYSQL_TYPE_TINY, mysql.MYSQL_TYPE_SHORT, mysql.MYSQL_TYPE_INT24,
		mysql.MYSQL_TYPE_LONG, mysql.MYSQL_TYPE_LONGLONG, mysql.MYSQL_TYPE_YEAR:
		return intToValue(c, v)
	case mysql.MYSQL_TYPE_NEWDECIMAL:
		s, ok := v.(string)
		if !ok {
			return rules.Value{}, fmt.Errorf("decimal decoded as %T, want a string", v)
		}
		return decimalValue(s)
	case mysql.MYSQL_TYPE_FLOAT, mysql.MYSQL_TYPE_DOUBLE:
		return floatToValue(v)
	case mysql.MYSQL_TYPE_BIT:
		return bitValue(c, v)
	case mysql.MYSQL_TYPE_ENUM:
		return enumValue(c, v)
	case mysql.MYSQL_TYPE_SET:
		return setValue(c, v)
	case mysql.MYSQL_TYPE_TIMESTAMP, mysql.MYSQL_TYPE_TIMESTAMP2,
		mysql.MYSQL_TYPE_DATETIME, mysql.MYSQL_TYPE_DATETIME2,
		mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_NEWDATE,
		mysql.MYSQL_TYPE_TIME, mysql.MYSQL_TYPE_TIME2:
		s, ok := v.(string)
		if !ok {
			return rules.Value{}, fmt.Errorf("temporal value decoded as %T, want a string", v)
		}
		return temporalValue(c, s)
	case mysql.MYSQL_TYPE_VARCHAR, mysql.MYSQL_TYPE_VAR_STRING, mysql.MYSQL_TYPE_STRING,
		mysql.MYSQL_TYPE_BLOB, mysql.MYSQL_TYPE_TINY_BLOB, mysql.MYSQL_TYPE_MEDIUM_BLOB,
		mysql.MYSQL_TYPE_LONG_BLOB:
		return bytesValue(c, v)
	case mysql.MYSQL_TYPE_JSON:
		return jsonValue(v)
	case mysql.MYSQL_TYPE_GEOMETRY:
		return geometryValue(v)
	}
	return rules.Value{}, fmt.Errorf("binlog column type %d is not supported", c.Type)
}

// intBits is the width of each integer type, to read a value logged
// without signedness (binlog_row_metadata below MINIMAL) as unsigned.
func intBits(t byte) uint {
	switch t {
	case mysql.MYSQL_TYPE_TINY:
		return 8
	case mysql.MYSQL_TYPE_SHORT:
		return 16
	case mysql.MYSQL_TYPE_INT24:
		return 24
	case mysql.MYSQL_TYPE_LONG:
		return 32
	}
	return 64
}

// intToValue renders an integer as its exact digits. A negative value of
// an UNSIGNED column (go-mysql reads integers as signed when the log does
// not say their signedness) is read back as the unsigned number of the
// column's width.
func intToValue(c *column, v any) (rules.Value, error) {
	var n int64
	switch x := v.(type) {
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	case uint8, uint16, uint32, uint64:
		return rules.ValueOf(x)
	default:
		return rules.Value{}, fmt.Errorf("integer decoded as %T", v)
	}
	if n < 0 && c.Unsigned {
		u := uint64(n)
		if w := intBits(c.Type); w < 64 {
			u &= 1<<w - 1
		}
		return rules.Value{Kind: rules.KindInt, Text: strconv.FormatUint(u, 10)}, nil
	}
	return rules.Value{Kind: rules.KindInt, Text: strconv.FormatInt(n, 10)}, nil
}

// decimalValue checks go-mysql's decimal text ("-12.50") and returns it
// as Debezium's precise decimal gives it: KindInt without a fraction,
// else KindFloat with all the scale's digits; never a negative zero.
func decimalValue(s string) (rules.Value, error) {
	body := strings.TrimPrefix(s, "-")
	intPart, frac, hasPoint := strings.Cut(body, ".")
	if intPart == "" || !allDigits(intPart) || !allDigits(frac) || (hasPoint && frac == "") {
		return rules.Value{}, fmt.Errorf("decimal %q is not digits with an optional fraction", s)
	}
	if strings.Trim(intPart+frac, "0") == "" {
		s = body // -0.00 is 0.00
	}
	if hasPoint {
		return rules.Value{Kind: rules.KindFloat, Text: s}, nil
	}
	return rules.Value{Kind: rules.KindInt, Text: s}, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// floatToValue renders FLOAT and DOUBLE as rules.ValueOf does: the
// shortest decimal that reads back as the same float32 or float64.
func floatToValue(v any) (rules.Value, error) {
	switch v.(type) {
	case float32, float64:
		return rules.ValueOf(v)
	}
	return rules.Value{}, fmt.Errorf("float decoded as %T", v)
}

// bitValue renders BIT(1) as a boolean and BIT(n>1) as Debezium's Bits:
// base64 of the value's (n+7)/8 bytes in little-endian order.
func bitValue(c *column, v any) (rules.Value, error) {
	n, ok := v.(int64)
	if !ok {
		return rules.Value{}, fmt.Errorf("bit value decoded as %T", v)
	}
	nbits := int(c.Meta>>8)*8 + int(c.Meta&0xff)
	if nbits <= 1 {
		return rules.ValueOf(n != 0)
	}
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], uint64(n))
	size := min((nbits+7)/8, 8)
	return rules.Value{Kind: rules.KindString, Text: base64.StdEncoding.EncodeToString(le[:size])}, nil
}

// enumValue renders an ENUM by its member's name; index 0 (the value
// MySQL stores for an invalid member) is the empty string.
func enumValue(c *column, v any) (rules.Value, error) {
	n, ok := v.(int64)
	if !ok {
		return rules.Value{}, fmt.Errorf("enum value decoded as %T", v)
	}
	switch {
	case n == 0:
		return rules.Value{Kind: rules.KindString}, nil
	case n < 0 || n > int64(len(c.Members)):
		return rules.Value{}, fmt.Errorf("enum index %d outside the column's %d members", n, len(c.Members))
	}
	return rules.Value{Kind: rules.KindString, Text: c.Members[n-1]}, nil
}

// setValue renders a SET as its members' names joined by ',' in the
// column's order, as MySQL and Debezium write it.
func setValue(c *column, v any) (rules.Value, error) {
	n, ok := v.(int64)
	if !ok {
		return rules.Value{}, fmt.Errorf("set value decoded as %T", v)
	}
	bits := uint64(n)
	if len(c.Members) < 64 && bits>>uint(len(c.Members)) != 0 {
		return rules.Value{}, fmt.Errorf("set value %#x names members beyond the column's %d", bits, len(c.Members))
	}
	var b strings.Builder
	for i, name := range c.Members {
		if i < 64 && bits&(1<<uint(i)) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(name)
		}
	}
	return rules.Value{Kind: rules.KindString, Text: b.String()}, nil
}

// bytesValue renders text as its bytes and binary strings as base64
// (Debezium's default binary.handling.mode=bytes, written as base64 by
// the JSON converter).
func bytesValue(c *column, v any) (rules.Value, error) {
	var b []byte
	switch x := v.(type) {
	case string:
		if !c.Binary {
			return rules.Value{Kind: rules.KindString, Text: x}, nil
		}
		b = []byte(x)
	case []byte:
		if !c.Binary {
			return rules.Value{Kind: rules.KindString, Text: string(x)}, nil
		}
		b = x
	default:
		return rules.Value{}, fmt.Errorf("string value decoded as %T", v)
	}
	return rules.Value{Kind: rules.KindString, Text: base64.StdEncoding.EncodeToString(b)}, nil
}

// jsonValue renders a MySQL JSON column as its JSON text (Debezium's
// io.debezium.data.Json is a string); an empty document is JSON null.
func jsonValue(v any) (rules.Value, error) {
	switch x := v.(type) {
	case string:
		return rules.Value{Kind: rules.KindString, Text: x}, nil
	case []byte:
		if len(x) == 0 {
			return rules.Value{Kind: rules.KindString, Text: "null"}, nil
		}
		return rules.Value{Kind: rules.KindString, Text: string(x)}, nil
	}
	return rules.Value{}, fmt.Errorf("JSON value decoded as %T (a partial JSON update: set binlog_row_value_options to empty)", v)
}

// geometryValue renders a spatial value as Debezium's Geometry struct in
// compact JSON: {"wkb":"<base64 of the WKB>","srid":N}. The binary log
// holds the SRID (4 bytes, little-endian) followed by the WKB.
func geometryValue(v any) (rules.Value, error) {
	b, ok := v.([]byte)
	if !ok {
		return rules.Value{}, fmt.Errorf("geometry value decoded as %T", v)
	}
	if len(b) < 4 {
		return rules.Value{}, fmt.Errorf("geometry value of %d bytes is shorter than its 4-byte SRID", len(b))
	}
	srid := binary.LittleEndian.Uint32(b)
	text := `{"wkb":"` + base64.StdEncoding.EncodeToString(b[4:]) + `","srid":` + strconv.FormatUint(uint64(srid), 10) + `}`
	return rules.Value{Kind: rules.KindJSON, Text: text}, nil
}

// temporalValue renders dates and times as Debezium does with
// time.precision.mode=adaptive_time_microseconds: DATE as days since the
// epoch, DATETIME as milliseconds (precision 0-3) or microseconds (4-6)
// since the epoch read as UTC, TIME as microseconds (negative allowed),
// TIMESTAMP as an ISO-8601 UTC string with the column's fractional digits
// ("2024-05-01T10:00:00.120Z"). A zero date is NULL when the column
// allows NULL, else the epoch.
func temporalValue(c *column, s string) (rules.Value, error) {
	switch c.Type {
	case mysql.MYSQL_TYPE_TIME, mysql.MYSQL_TYPE_TIME2:
		us, err := parseTime(s)
		if err != nil {
			return rules.Value{}, err
		}
		return rules.Value{Kind: rules.KindInt, Text: strconv.FormatInt(us, 10)}, nil
	case mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_NEWDATE:
		s += " 00:00:00"
	}
	t, zero, err := parseDatetime(s)
	if err != nil {
		return rules.Value{}, err
	}
	if zero {
		if c.Nullable {
			return rules.Value{}, nil
		}
		t = time.Unix(0, 0).UTC()
	}
	switch c.Type {
	case mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_NEWDATE:
		return rules.ValueOf(t.Unix() / 86400)
	case mysql.MYSQL_TYPE_TIMESTAMP, mysql.MYSQL_TYPE_TIMESTAMP2:
		layout := "2006-01-02T15:04:05"
		if fsp := fractionDigits(c); fsp > 0 {
			layout += "." + strings.Repeat("0", fsp)
		}
		return rules.Value{Kind: rules.KindString, Text: t.Format(layout) + "Z"}, nil
	}
	if fractionDigits(c) <= 3 {
		return rules.ValueOf(t.UnixMilli())
	}
	return rules.ValueOf(t.UnixMicro())
}

// fractionDigits is the fractional-second precision of a temporal column.
func fractionDigits(c *column) int {
	switch c.Type {
	case mysql.MYSQL_TYPE_DATETIME2, mysql.MYSQL_TYPE_TIMESTAMP2, mysql.MYSQL_TYPE_TIME2:
		return min(int(c.Meta), 6)
	}
	return 0
}
