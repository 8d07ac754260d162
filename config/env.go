package config

import (
	"fmt"
	"strings"
)

// LookupFunc returns the value of an environment variable and whether it is
// set; os.LookupEnv is one.
type LookupFunc func(name string) (string, bool)

// expandEnv replaces ${NAME} and ${NAME:-default} in one scalar value:
//
//   - ${NAME} is NAME's value; an unset NAME is an error (an empty but set
//     NAME is the empty string), because a silently empty broker list or
//     DSN is worse than a refusal to start;
//   - ${NAME:-default} is NAME's value, or default when NAME is unset or
//     empty; default is taken literally up to the closing brace;
//   - $${ is a literal "${"; any other '$' stays as it is, so passwords
//     and the like rarely need escaping.
//
// Expansion works on decoded scalar values, never on the raw file, so a
// value never changes the YAML structure and positions stay exact.
func expandEnv(s string, lookup LookupFunc) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' {
			// "$${": a literal "${".
			b.WriteString(s[:i-1])
			b.WriteString("${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		rest := s[i+2:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return "", fmt.Errorf("unterminated ${ in %q", s[i:])
		}
		expr := rest[:end]
		s = rest[end+1:]
		name, def, hasDefault := strings.Cut(expr, ":-")
		if !validEnvName(name) {
			return "", fmt.Errorf("bad environment variable reference ${%s}: a name is letters, digits and '_', not starting with a digit", expr)
		}
		val, ok := lookup(name)
		switch {
		case hasDefault && val == "":
			val = def
		case !ok:
			return "", fmt.Errorf("environment variable %s is not set (write ${%s:-} to allow it to be empty)", name, name)
		}
		b.WriteString(val)
	}
}

func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
