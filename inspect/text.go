package inspect

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteText writes the report for a terminal: per pool, per item its
// role, key, server, raw value and meaning, then what MySQL says.
func (r *Report) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	var entity []string
	for _, c := range r.Entity {
		entity = append(entity, c.Name+"="+c.Value.Text)
	}
	fmt.Fprintf(bw, "rule %s (%s) %s\n", r.Rule, r.Kind, strings.Join(entity, " "))
	for _, p := range r.Pools {
		fmt.Fprintf(bw, "\npool %s\n", p.Pool)
		for _, it := range p.Items {
			fmt.Fprintf(bw, "  %s %s\n", it.Role, it.Key)
			fmt.Fprintf(bw, "    server   %s\n", it.Server)
			if it.Present {
				fmt.Fprintf(bw, "    raw      %s (flags %d)\n", it.Raw, it.Flags)
			}
			fmt.Fprintf(bw, "    meaning  %s\n", it.Meaning)
			if len(it.Members) > 0 {
				fmt.Fprintf(bw, "    members  %s\n", strings.Join(it.Members, " "))
			}
		}
		if t := p.MySQL; t != nil {
			fmt.Fprintf(bw, "  mysql %s  args [%s]\n", t.Query, strings.Join(t.Args, ", "))
			if t.Result != "" {
				fmt.Fprintf(bw, "    result   %s\n", t.Result)
			}
			fmt.Fprintf(bw, "    verdict  %s\n", t.Note)
		}
		if p.Error != "" {
			fmt.Fprintf(bw, "  error: %s\n", p.Error)
		}
	}
	return bw.Flush()
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteActions writes one line per action: pool, server, op, key and
// result (with its error).
func WriteActions(w io.Writer, acts []Action) error {
	bw := bufio.NewWriter(w)
	for _, a := range acts {
		fmt.Fprintf(bw, "%s  %s  %s %s  rule %s: %s", a.Pool, a.Server, a.Op, a.Key, a.Rule, a.Result)
		if a.Error != "" {
			fmt.Fprintf(bw, ": %s", a.Error)
		}
		fmt.Fprintln(bw)
	}
	return bw.Flush()
}

// FailedServers returns the servers (pool and address) of the actions
// that failed, each once, in order.
func FailedServers(acts []Action) []string {
	var out []string
	seen := make(map[string]bool)
	for _, a := range acts {
		s := a.Pool + " " + a.Server
		if a.Error != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
