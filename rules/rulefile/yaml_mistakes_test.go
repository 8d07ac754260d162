package rulefile

import (
	"flag"
	"testing"

	"github.com/cachewarden/cachewarden/internal/yamlfile/yamlfiletest"
)

var update = flag.Bool("update", false, "rewrite testdata/yaml-mistakes/*.errors")

// TestYAMLMistakes reads testdata/yaml-mistakes/NAME.yaml, each a rule file
// with one YAML mistake, and compares the problems with NAME.errors.
func TestYAMLMistakes(t *testing.T) {
	yamlfiletest.Mistakes(t, *update, func(path string, data []byte) error {
		_, err := Parse(path, data)
		return err
	})
}
