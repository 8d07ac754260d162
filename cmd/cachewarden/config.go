package main

import (
	"context"
	"fmt"
	"io"
)

// configHelp is the description `cachewarden config -h` prints.
const configHelp = `print: writes the configuration ` + "`run`" + ` would use: every setting after ${NAME}
expansion, with the defaults filled in, as YAML that ` + "`run -c`" + ` loads again
into the same configuration (rule paths absolute, "${" written "$${").
Secrets (the MySQL DSN's password, the SASL and schema registry passwords)
are replaced by "xxxxx". The rule files are loaded and checked too.`

// configCmd implements `config print`: the effective configuration.
func (a *app) configCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("config", "config print -c FILE", configHelp, stderr)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) == 0 {
			fs.Usage()
			return usageErrorf("config: give a subcommand: print")
		}
		return flagError(fs.Parse(args))
	}
	if args[0] != "print" {
		fs.Usage()
		return usageErrorf("config: unknown subcommand %q (want print)", args[0])
	}
	cfg, err := parseConfigOnly(fs, "config print", args[1:], stderr)
	if err != nil {
		return err
	}
	out, err := cfg.EffectiveYAML()
	if err != nil {
		return err
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("config print: %w", err)
	}
	return nil
}
