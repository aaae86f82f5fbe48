package pdp_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/pdp"
)

// readmeUpstreamRule is the README's worked upstream_call, verbatim (its
// comment lines aside), which replaces the default policy's in a copy of
// pdp/policy/default.rego.
const readmeUpstreamRule = `upstream_call := allow(sprintf("the %s upstream's calls need no approval (configured)", [input.resource.upstream])) if {
	input.resource.approval == "never"
} else := requestable("Writing files needs two approvers", 2) if {
	input.resource.upstream == "fs"
	input.resource.tool in {"move_file", "write_file", "edit_file"}
} else := requestable(sprintf("Calls to %s need approval (configured)", [input.resource.upstream]), 1) if {
	input.resource.approval == "always"
} else := allow("reading files is allowed") if {
	input.resource.upstream == "fs"
	input.resource.tool in {"read_text_file", "list_directory"}
} else := deny("this upstream tool is not allowed")
`

// defaultUpstreamRule matches the default policy's upstream_call, from its
// first line to the end of its last else.
var defaultUpstreamRule = regexp.MustCompile(`(?s)\nupstream_call := .*?\n\n`)

// TestReadmeUpstreamPolicy: the README's upstream rule, put into a copy of
// the default policy as the README says (with approvals.rego beside it),
// compiles and decides as its text says, the configured approval
// overrides included; annotations no longer count.
func TestReadmeUpstreamPolicy(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), readmeUpstreamRule) {
		t.Fatal("the README's worked upstream rule differs from this test's")
	}
	def, err := os.ReadFile("policy/default.rego")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(defaultUpstreamRule.FindAllIndex(def, -1)); n != 1 {
		t.Fatalf("found upstream_call %d times in default.rego, want once", n)
	}
	copied := defaultUpstreamRule.ReplaceAllLiteralString(string(def), "\n"+readmeUpstreamRule+"\n")
	helper, err := os.ReadFile("policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, writePolicy(t, map[string]string{"default.rego": copied, "approvals.rego": string(helper)}))
	fs := func(tool, approval, annotations string) pdp.Input {
		in := call("fs__"+tool, `{}`)
		in.Resource.Upstream, in.Resource.Tool, in.Resource.Approval = "fs", tool, approval
		if annotations != "" {
			in.Resource.Annotations = []byte(annotations)
		}
		return in
	}
	runCases(t, e, []evalCase{
		{"write: two approvers", fs("write_file", "", ""), requestable("Writing files needs two approvers", 2)},
		{"write annotated read-only: still two", fs("write_file", "", `{"readOnlyHint":true}`), requestable("Writing files needs two approvers", 2)},
		{"write, approval always: still two", fs("write_file", "always", ""), requestable("Writing files needs two approvers", 2)},
		{"write, approval never: runs", fs("write_file", "never", ""), allow("the fs upstream's calls need no approval (configured)")},
		{"read: allowed", fs("read_text_file", "", ""), allow("reading files is allowed")},
		{"read, approval always: one approver", fs("read_text_file", "always", ""), requestable("Calls to fs need approval (configured)", 1)},
		{"other tool: denied", fs("search_files", "", `{"readOnlyHint":true}`), deny("this upstream tool is not allowed")},
		{"other tool, approval always", fs("search_files", "always", ""), requestable("Calls to fs need approval (configured)", 1)},
		{"Countersign's own tool: the default", call("transfer_funds", `{"to":"a","amount":5}`), allow("Transfers up to 1,000 are allowed")},
	})
}
