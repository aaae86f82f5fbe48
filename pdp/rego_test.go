package pdp_test

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/tester"
)

// TestRegoUnitTests runs the policy's *_test.rego files, loading the package
// directory the way `opa test pdp/` does, so `go test` fails when they fail.
func TestRegoUnitTests(t *testing.T) {
	results, err := tester.Run(context.Background(), ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(results) == 0 {
		t.Fatal("no Rego tests found")
	}
	t.Logf("%d Rego tests", len(results))
	for _, r := range results {
		switch {
		case r.Error != nil:
			t.Errorf("%v: %s.%s: error: %v", r.Location, r.Package, r.Name, r.Error)
		case r.Fail:
			t.Errorf("%v: %s.%s: FAIL", r.Location, r.Package, r.Name)
		case r.Skip:
			t.Logf("%v: %s.%s: SKIPPED", r.Location, r.Package, r.Name)
		}
	}
}
