package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/internal/yamlfile/yamlfiletest"
)

// TestEffectiveYAML prints configs and parses the output again: the
// result must equal the original Config (defaults filled, environment
// expanded) except for the secrets, replaced by Redacted, and the rule
// paths, made absolute; no secret may appear in the output.
func TestEffectiveYAML(t *testing.T) {
	vars := env(map[string]string{
		"CW_BROKERS":           "k1:9092, k2:9092",
		"CW_MYSQL_PASSWORD":    "s3cret-mysql",
		"CW_REGISTRY_PASSWORD": "s3cret-registry",
		"CW_GROUP":             "g-${literal}",
	})
	secrets := []string{"s3cret-mysql", "s3cret-registry", "pa${not-a-var}ss"}
	for _, name := range []string{"good.yaml", "minimal.yaml", "print.yaml"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := Parse(path, data, vars)
			if err != nil {
				t.Fatal(err)
			}
			out, err := cfg.EffectiveYAML()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range secrets {
				if strings.Contains(string(out), s) {
					t.Errorf("the output holds the secret %q:\n%s", s, out)
				}
			}
			// Read back elsewhere, with no variable set: nothing is left
			// to expand.
			again, err := Parse(filepath.Join(t.TempDir(), "printed.yaml"), out, nil)
			if err != nil {
				t.Fatalf("the output does not parse: %v\n%s", err, out)
			}
			want := *cfg
			want.File = again.File
			want.Rules = nil
			for _, p := range cfg.Rules {
				abs, _ := filepath.Abs(p)
				want.Rules = append(want.Rules, abs)
			}
			want.MySQL.DSN = RedactDSN(cfg.MySQL.DSN)
			want.Kafka.SASL.Password = redactPassword(cfg.Kafka.SASL.Password)
			want.Kafka.SchemaRegistry.Password = redactPassword(cfg.Kafka.SchemaRegistry.Password)
			if !reflect.DeepEqual(again, &want) {
				t.Errorf("read back:\n%#v\nwant\n%#v\noutput:\n%s", *again, want, out)
			}
		})
	}
}

// TestEffectiveYAMLText compares what EffectiveYAML writes for
// testdata/print.yaml (key order, what is left out, quoting) with
// testdata/print.out, the working directory written as "CWD" (go test
// -update rewrites it).
func TestEffectiveYAMLText(t *testing.T) {
	vars := env(map[string]string{"CW_MYSQL_PASSWORD": "s3cret-mysql", "CW_REGISTRY_PASSWORD": "s3cret-registry", "CW_GROUP": "g-${literal}"})
	data, err := os.ReadFile("testdata/print.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse("testdata/print.yaml", data, vars)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cfg.EffectiveYAML()
	if err != nil {
		t.Fatal(err)
	}
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	yamlfiletest.Golden(t, "testdata/print.out", strings.ReplaceAll(string(out), cwd, "CWD"), *update)
}
