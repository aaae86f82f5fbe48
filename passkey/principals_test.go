package passkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/passkey"
)

func TestApproverActsAs(t *testing.T) {
	tests := []struct {
		name      string
		a         passkey.Approver
		principal string
		want      bool
	}{
		{"id", passkey.Approver{ID: "0a1b2c", Name: "alice"}, "0a1b2c", true},
		{"no principals: the name", passkey.Approver{Name: "alice"}, "alice", true},
		{"no principals: the name in another case, as before principals", passkey.Approver{Name: "alice"}, "Alice", true},
		{"no principals: a look-alike is another name", passkey.Approver{Name: "alice"}, "\u0430lice", false},
		{"linked principal", passkey.Approver{Name: "Alice Smith", Principals: []string{"agent-7", "alice"}}, "alice", true},
		{"linked principal, exact: no case folding", passkey.Approver{Name: "Alice Smith", Principals: []string{"agent-7"}}, "Agent-7", false},
		{"linked: the display name is not an identity", passkey.Approver{Name: "alice", Principals: []string{"agent-7"}}, "alice", false},
		{"linked: a look-alike display name does not matter", passkey.Approver{Name: "\u0430lice", Principals: []string{"alice"}}, "alice", true},
		{"NFC: decomposed matches composed", passkey.Approver{Name: "x", Principals: []string{"jos\u00e9"}}, "jose\u0301", true},
		{"empty requester", passkey.Approver{Name: "alice"}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.ActsAs(tt.principal); got != tt.want {
				t.Errorf("ActsAs(%q) = %v, want %v", tt.principal, got, tt.want)
			}
		})
	}
}

// The issue's attack: an approver whose name is a look-alike of the agent's
// ("аlice", with a Cyrillic "а") approved that agent's call. Linked to the
// agent's identity, the approver is refused whatever the name says.
func TestSelfApprovalComparesIdentities(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	m := w.enroll(t, "mallory", []string{"finance"}, "hybrid", "internal")
	// AddApprover now refuses such a name; write it the way an older
	// record holds it.
	kv, err := w.js.KeyValue(ctx, passkey.BucketApprovers)
	if err != nil {
		t.Fatal(err)
	}
	a := m.A
	a.Name, a.Principals = "\u0430lice", []string{"alice"}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, a.ID, b); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, requester, want string
	}{
		{"the linked agent", "alice", passkey.ReasonSelfApproval},
		{"the approver's id", a.ID, passkey.ReasonSelfApproval},
		{"the look-alike name is no identity", "\u0430lice", ""},
		{"another agent", "bob", ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := w.issue(t, fmt.Sprintf("task-self-%d", i), "finance", passkey.ClassCrossPlatform)
			r := c.verifyReq(m.sign(t, w.rp, c.Ch))
			r.Requester = tt.requester
			v, err := w.svc.Verify(ctx, r)
			if tt.want != "" {
				wantReason(t, err, tt.want)
				return
			}
			if err != nil || v.ApproverID != a.ID {
				t.Fatalf("Verify = %+v, %v; want mallory's approval", v, err)
			}
		})
	}
}

func TestAddApproverPrincipals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, _, err := e.svc.AddApprover(ctx, "Alice Smith", []string{"finance"},
		passkey.WithPrincipals("agent-7", "alice"), passkey.WithPrincipals("agent-7", "jose\u0301"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Approver(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"agent-7", "alice", "jos\u00e9"}, got.Principals); diff != "" {
		t.Errorf("stored principals (-want +got), sorted, unique, NFC:\n%s", diff)
	}
	// Without principals the approver acts as their name.
	b, _, err := e.svc.AddApprover(ctx, "bob", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Principals) != 0 || !b.ActsAs("bob") {
		t.Errorf("default: principals %q, acts as bob: %v", b.Principals, b.ActsAs("bob"))
	}
	for _, name := range []string{"Alice Müller", "Иван Петров", "Γιώργος", "田中 Taro", "O'Brien-Smith"} {
		if _, _, err := e.svc.AddApprover(ctx, name, []string{"finance"}); err != nil {
			t.Errorf("AddApprover(%q) = %v", name, err)
		}
	}
}

// A name or principal that mixes scripts the way a look-alike does is
// refused when the approver is added.
func TestAddApproverRefusesLookAlikes(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name, who string
		opts      []passkey.ApproverOption
		msg       string
	}{
		{"Cyrillic a in a Latin name", "\u0430lice", nil, "Cyrillic and Latin"},
		{"Greek omicron in a Latin name", "b\u03bfb", nil, "Greek and Latin"},
		{"look-alike principal", "Alice", []passkey.ApproverOption{passkey.WithPrincipals("\u0430lice")}, "Cyrillic and Latin"},
		{"principal with a space", "Alice", []passkey.ApproverOption{passkey.WithPrincipals("al ice")}, "principal"},
		{"principal with an invisible character", "Alice", []passkey.ApproverOption{passkey.WithPrincipals("al\u200bice")}, "principal"},
		{"empty principal", "Alice", []passkey.ApproverOption{passkey.WithPrincipals("")}, "principal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := e.svc.AddApprover(context.Background(), tt.who, []string{"finance"}, tt.opts...)
			if !errors.Is(err, passkey.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("AddApprover(%q) = %v, want ErrInvalidArgument naming %q", tt.who, err, tt.msg)
			}
		})
	}
}
