package pdp

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed policy/conformance/*.rego
var conformance embed.FS

// WriteConformancePolicy writes the conformance policy into dir (created if
// needed; existing files of the same names are replaced): the embedded
// default policy plus policy/conformance/*.rego, which allows the MCP
// conformance suite's fixture tools. Load it with Options.Dir = dir.
// `countersign dev --conformance` uses it; nothing else should.
func WriteConformancePolicy(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pdp: conformance policy: %w", err)
	}
	for _, src := range []struct {
		fsys embed.FS
		glob string
	}{{embedded, "policy/*.rego"}, {conformance, "policy/conformance/*.rego"}} {
		files, err := fs.Glob(src.fsys, src.glob)
		if err != nil {
			return fmt.Errorf("pdp: conformance policy: %w", err)
		}
		for _, f := range files {
			b, err := fs.ReadFile(src.fsys, f)
			if err != nil {
				return fmt.Errorf("pdp: conformance policy: %w", err)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
				return fmt.Errorf("pdp: conformance policy: %w", err)
			}
		}
	}
	return nil
}
