package pdp_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/countersign/countersign/pdp"
)

func TestConformancePolicy(t *testing.T) {
	dir := t.TempDir()
	if err := pdp.WriteConformancePolicy(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "conformance.rego")); err != nil {
		t.Fatal(err)
	}
	e, err := pdp.New(context.Background(), pdp.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	def, err := pdp.New(context.Background(), pdp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if e.Version() == def.Version() {
		t.Error("the conformance policy must not have the default policy's version")
	}
	for _, tool := range []string{"greet", "slow_compute", "failing_job", "protocol_error_job", "test_tool_with_task", "confirm_delete", "multi_input"} {
		d, err := e.Evaluate(context.Background(), call(tool, `{}`))
		if err != nil || d.Effect != pdp.EffectAllow {
			t.Errorf("%s: %+v %v", tool, d, err)
		}
		// The default policy knows nothing of the fixtures.
		if d, _ := def.Evaluate(context.Background(), call(tool, `{}`)); d.Effect != pdp.EffectDeny {
			t.Errorf("default policy on %s: %+v", tool, d)
		}
	}
	// The demo tools keep the default policy's decisions.
	if d, _ := e.Evaluate(context.Background(), call("transfer_funds", `{"amount":5000}`)); d.Effect != pdp.EffectRequestable || d.Quorum != 1 {
		t.Errorf("transfer_funds under the conformance policy: %+v", d)
	}
	if d, _ := e.Evaluate(context.Background(), call("unknown_tool", `{}`)); d.Effect != pdp.EffectDeny {
		t.Errorf("unknown tool under the conformance policy: %+v", d)
	}
}
