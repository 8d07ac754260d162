package rules

import (
	"fmt"
	"math"
	"strconv"
)

// ValueOf converts a Go value to the Value a change event carries for it,
// so that keys rendered from application values equal the daemon's:
//
//	nil                      NULL
//	Value                    itself
//	string, []byte           KindString, the bytes
//	bool                     KindBool, "1" or "0"
//	int, int8 … int64,
//	uint, uint8 … uint64     KindInt, decimal digits
//	float32, float64         KindFloat, the shortest decimal that reads
//	                         back as the same float (NaN and ±Inf are
//	                         errors)
//
// Other types are an error naming the type.
func ValueOf(v any) (Value, error) {
	switch v := v.(type) {
	case nil:
		return Value{}, nil
	case Value:
		return v, nil
	case string:
		return Value{Kind: KindString, Text: v}, nil
	case []byte:
		return Value{Kind: KindString, Text: string(v)}, nil
	case bool:
		if v {
			return Value{Kind: KindBool, Text: "1"}, nil
		}
		return Value{Kind: KindBool, Text: "0"}, nil
	case int:
		return intValue(int64(v)), nil
	case int8:
		return intValue(int64(v)), nil
	case int16:
		return intValue(int64(v)), nil
	case int32:
		return intValue(int64(v)), nil
	case int64:
		return intValue(v), nil
	case uint:
		return uintValue(uint64(v)), nil
	case uint8:
		return uintValue(uint64(v)), nil
	case uint16:
		return uintValue(uint64(v)), nil
	case uint32:
		return uintValue(uint64(v)), nil
	case uint64:
		return uintValue(v), nil
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return Value{}, fmt.Errorf("%v is not a SQL number", v)
		}
		return Value{Kind: KindFloat, Text: strconv.FormatFloat(float64(v), 'g', -1, 32)}, nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return Value{}, fmt.Errorf("%v is not a SQL number", v)
		}
		return Value{Kind: KindFloat, Text: strconv.FormatFloat(v, 'g', -1, 64)}, nil
	}
	return Value{}, fmt.Errorf("unsupported type %T", v)
}

func intValue(n int64) Value { return Value{Kind: KindInt, Text: strconv.FormatInt(n, 10)} }

func uintValue(n uint64) Value { return Value{Kind: KindInt, Text: strconv.FormatUint(n, 10)} }

// SQLArg returns the database/sql argument bound to a '?' placeholder for
// v, the same for the daemon's queries and the applications':
//
//	KindInt    int64 when it fits, else uint64 when it fits, else the digit
//	           string (MySQL compares it numerically with a numeric column)
//	KindFloat  the literal as a string, so no digit is lost through float64
//	KindString string
//	KindBool   int64 1 or 0
//	KindNull   nil
//	KindJSON   the raw JSON as a string
func (v Value) SQLArg() (any, error) {
	switch v.Kind {
	case KindInt:
		if n, err := strconv.ParseInt(v.Text, 10, 64); err == nil {
			return n, nil
		}
		if u, err := strconv.ParseUint(v.Text, 10, 64); err == nil {
			return u, nil
		}
		return v.Text, nil
	case KindFloat, KindString, KindJSON:
		return v.Text, nil
	case KindBool:
		switch v.Text {
		case "1":
			return int64(1), nil
		case "0":
			return int64(0), nil
		}
		return nil, fmt.Errorf("bool value %q is not 1 or 0", v.Text)
	case KindNull:
		return nil, nil
	}
	return nil, fmt.Errorf("unknown value kind %d", v.Kind)
}

// SQLArgs converts values with SQLArg; an error names the argument's
// 1-based position.
func SQLArgs(values []Value) ([]any, error) {
	if len(values) == 0 {
		return nil, nil
	}
	out := make([]any, len(values))
	for i, v := range values {
		a, err := v.SQLArg()
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		out[i] = a
	}
	return out, nil
}
