package audit

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"
)

// Admin records go to their identity's chain over the real stream,
// idempotently per key, and an export of them verifies.
func TestRecordAdmin(t *testing.T) {
	l, keys := openLog(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	approver := "0123456789abcdef0123456789abcdef"
	acts := []struct {
		a   AdminAction
		key uint64
	}{
		{AdminAction{Action: AdminTokenCreate, Target: AdminTarget{Type: TargetAdmin, ID: "admin"}, Status: "active", By: "cli:admin-init", Token: "00112233aabbccdd", At: at}, 1},
		{AdminAction{Action: AdminDisable, Target: AdminTarget{Type: TargetAgent, ID: "Billing.Bot@x"}, Status: "disabled", By: "admin:admin", At: at}, 2},
		{AdminAction{Action: AdminEnable, Target: AdminTarget{Type: TargetAgent, ID: "Billing.Bot@x"}, Status: "active", By: "admin:admin", At: at}, 3},
		{AdminAction{Action: AdminRevoke, Target: AdminTarget{Type: TargetAgent, ID: "Billing.Bot@x"}, Status: "revoked", By: "admin:admin", At: at}, 4},
		{AdminAction{Action: AdminRevoke, Target: AdminTarget{Type: TargetPasskey, ID: "cred-AbC_1", Approver: approver}, Status: "revoked", By: "admin:admin", At: at}, 5},
		{AdminAction{Action: AdminDisable, Target: AdminTarget{Type: TargetApprover, ID: approver}, Status: "disabled", By: "admin:admin", At: at}, 6},
		{AdminAction{Action: AdminKeyRotate, Target: AdminTarget{Type: TargetTokenKey, ID: "ed25519-00112233445566778899aabbccddeeff"}, Status: "active", By: "admin:admin",
			Replaced: "ed25519-ffeeddccbbaa99887766554433221100", At: at}, 0},
	}
	for _, a := range acts {
		id, r, err := l.RecordAdmin(ctx, a.a, a.key)
		if err != nil {
			t.Fatalf("%+v: %v", a.a, err)
		}
		// Retried with the same key: the same record.
		id2, r2, err := l.RecordAdmin(ctx, a.a, a.key)
		if err != nil || id2 != id || r2 != r {
			t.Fatalf("retry: %s %+v %v; want %s %+v", id2, r2, err, id, r)
		}
		if a.a.Action == AdminRevoke {
			// A target is revoked once: whatever its record's revision
			// by the time a retry comes, the same record.
			if _, r3, err := l.RecordAdmin(ctx, a.a, a.key+100); err != nil || r3 != r {
				t.Fatalf("revoke again at another revision: %+v %v; want %+v", r3, err, r)
			}
		}
	}
	agentChain := AdminChainID(AdminTarget{Type: TargetAgent, ID: "Billing.Bot@x"})
	lines, err := l.Chain(ctx, agentChain)
	if err != nil || len(lines) != 3 {
		t.Fatalf("agent chain: %d lines, %v", len(lines), err)
	}
	if got := AdminChainID(AdminTarget{Type: TargetPasskey, ID: "x", Approver: approver}); got != "admin-approver-"+approver {
		t.Fatalf("passkey chain %q", got)
	}
	var export [][]byte
	if err := l.Export(ctx, time.Time{}, func(line []byte) error { export = append(export, bytes.Clone(line)); return nil }); err != nil {
		t.Fatal(err)
	}
	rep := Verify(export, keys.PublicKeys(), VerifyOptions{})
	if !rep.OK || len(rep.Tasks) != 4 {
		t.Fatalf("verify: %+v", rep)
	}
	for _, v := range rep.Tasks {
		if !v.Complete || v.Disposition != "admin" {
			t.Fatalf("verdict %+v", v)
		}
	}
	if _, _, err := l.RecordAdmin(ctx, AdminAction{Action: AdminRevoke, Target: AdminTarget{Type: "robot", ID: "x"}}, 1); err == nil {
		t.Fatal("unknown target type recorded")
	}
}

func TestAdminChainRules(t *testing.T) {
	keys := testKeys(t)
	target := AdminTarget{Type: TargetAgent, ID: "bot"}
	chain := AdminChainID(target)
	act := func(action, status string) AdminAction {
		return AdminAction{Action: action, Target: target, Status: status, By: "admin:admin", At: time.Now().UTC()}
	}
	for _, tc := range []struct {
		name string
		mut  func(c *memChain)
		rule string
	}{
		{"enable after revoke", func(c *memChain) {
			c.add("revoke-2", KindAdmin, act(AdminRevoke, "revoked"))
			c.add("enable-3", KindAdmin, act(AdminEnable, "active"))
		}, RuleAdmin},
		{"wrong status", func(c *memChain) { c.add("disable-2", KindAdmin, act(AdminDisable, "active")) }, RuleAdmin},
		{"another identity's action", func(c *memChain) {
			a := act(AdminDisable, "disabled")
			a.Target.ID = "other"
			c.add("disable-2", KindAdmin, a)
		}, RuleAdmin},
		{"task record in an admin chain", func(c *memChain) { c.add("claimed", KindClaimed, Policy{Allow: true}) }, RuleAdmin},
		{"create after another action", func(c *memChain) { c.add("create", KindAdmin, act(AdminCreate, "active")) }, RuleAdmin},
		{"invite of an agent", func(c *memChain) { c.add("invite-7", KindAdmin, act(AdminInvite, "active")) }, RuleAdmin},
		{"enroll of an agent", func(c *memChain) { c.add("enroll", KindAdmin, act(AdminEnroll, "active")) }, RuleAdmin},
		{"unknown field", func(c *memChain) {
			c.add("x-2", KindAdmin, map[string]any{"action": "disable", "target": target, "status": "disabled", "by": "x", "at": time.Now(), "extra": 1})
		}, RuleRecordBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &memChain{t: t, keys: keys, taskID: chain, at: time.Now().UTC()}
			c.add("disable-1", KindAdmin, act(AdminDisable, "disabled"))
			if v := verdict(t, keys, c); !v.OK || v.Status != "disabled" {
				t.Fatalf("honest prefix: %+v", v)
			}
			tc.mut(c)
			if v := verdict(t, keys, c); v.OK || !slices.Contains(v.Rules(), tc.rule) {
				t.Fatalf("%+v", v)
			}
		})
	}
}

// An approver's life in its chain: added, invited, each passkey enrolled,
// then disabled and revoked. Adding and enrolling are recorded once per
// target (a retry at another key returns the first record), and only as
// the first action on it; invite acts on an approver, enroll on a passkey.
func TestAdminChainAdditions(t *testing.T) {
	l, keys := openLog(t)
	ctx := context.Background()
	const approver = "0123456789abcdef0123456789abcdef"
	at := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	ap := AdminTarget{Type: TargetApprover, ID: approver}
	pk := func(id string) AdminTarget { return AdminTarget{Type: TargetPasskey, ID: id, Approver: approver} }
	act := func(action string, target AdminTarget, status, by string) AdminAction {
		return AdminAction{Action: action, Target: target, Status: status, By: by, At: at}
	}
	for _, a := range []struct {
		a   AdminAction
		key uint64
	}{
		{act(AdminCreate, ap, "active", "admin:ops"), 0},
		{act(AdminInvite, ap, "active", "admin:ops"), 11},
		{act(AdminEnroll, pk("cred-A"), "active", "approver:"+approver), 0},
		{act(AdminInvite, ap, "active", "admin:ops"), 12},
		{act(AdminEnroll, pk("cred-B"), "active", "approver:"+approver), 0},
		{act(AdminDisable, pk("cred-A"), "disabled", "admin:ops"), 5},
		{act(AdminRevoke, ap, "revoked", "admin:ops"), 6},
	} {
		_, r, err := l.RecordAdmin(ctx, a.a, a.key)
		if err != nil {
			t.Fatalf("%+v: %v", a.a, err)
		}
		if once(a.a.Action) {
			if _, r2, err := l.RecordAdmin(ctx, a.a, a.key+100); err != nil || r2 != r {
				t.Fatalf("%s again at another key: %+v %v; want %+v", a.a.Action, r2, err, r)
			}
		}
	}
	agent := AdminTarget{Type: TargetAgent, ID: "billing-bot"}
	if _, _, err := l.RecordAdmin(ctx, act(AdminCreate, agent, "active", "admin:ops"), 0); err != nil {
		t.Fatal(err)
	}
	var export [][]byte
	if err := l.Export(ctx, time.Time{}, func(line []byte) error { export = append(export, bytes.Clone(line)); return nil }); err != nil {
		t.Fatal(err)
	}
	rep := Verify(export, keys.PublicKeys(), VerifyOptions{})
	if !rep.OK || len(rep.Tasks) != 2 {
		t.Fatalf("verify: %+v", rep)
	}
	for _, v := range rep.Tasks {
		want := map[string]string{AdminChainID(ap): "revoked", AdminChainID(agent): "active"}[v.TaskID]
		if v.Status != want {
			t.Errorf("%s: status %q, want %q", v.TaskID, v.Status, want)
		}
	}

	chain := AdminChainID(ap)
	for _, tc := range []struct {
		name string
		a    AdminAction
	}{
		{"a passkey enrolled twice", act(AdminEnroll, pk("cred-A"), "active", "approver:"+approver)},
		{"an approver added after an invite", act(AdminCreate, ap, "active", "admin:ops")},
		{"an invite of a passkey", act(AdminInvite, pk("cred-C"), "active", "admin:ops")},
		{"a passkey created", act(AdminCreate, pk("cred-C"), "active", "admin:ops")},
		{"an approver enrolled", act(AdminEnroll, ap, "active", "admin:ops")},
		{"an enrollment that leaves it disabled", act(AdminEnroll, pk("cred-C"), "disabled", "admin:ops")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &memChain{t: t, keys: keys, taskID: chain, at: at}
			c.add("create", KindAdmin, act(AdminCreate, ap, "active", "admin:ops"))
			c.add("invite-1", KindAdmin, act(AdminInvite, ap, "active", "admin:ops"))
			c.add("passkey-a-enroll", KindAdmin, act(AdminEnroll, pk("cred-A"), "active", "approver:"+approver))
			if v := verdict(t, keys, c); !v.OK || v.Status != "active" {
				t.Fatalf("honest prefix: %+v", v)
			}
			c.add("x-9", KindAdmin, tc.a)
			if v := verdict(t, keys, c); v.OK || !slices.Contains(v.Rules(), RuleAdmin) {
				t.Fatalf("%+v", v)
			}
		})
	}
}

// A Slack user's link to an approver, and its unlinking, are admin records
// in the approver's chain: they verify, leave the approver's status as it
// is, and are the only actions on a Slack user.
func TestAdminChainSlackLinks(t *testing.T) {
	keys := testKeys(t)
	const approver = "0123456789abcdef0123456789abcdef"
	chain := AdminChainID(AdminTarget{Type: TargetApprover, ID: approver})
	slack := AdminTarget{Type: TargetSlackUser, ID: "U012AB3CD", Approver: approver}
	if got := AdminChainID(slack); got != chain {
		t.Fatalf("slack link chain %q, want the approver's %q", got, chain)
	}
	act := func(action string, target AdminTarget, status string) AdminAction {
		return AdminAction{Action: action, Target: target, Status: status, By: "admin:ops", At: time.Now().UTC()}
	}
	honest := func(c *memChain) {
		c.add("disable-1", KindAdmin, act(AdminDisable, AdminTarget{Type: TargetApprover, ID: approver}, "disabled"))
		c.add("slack-a-slack-link-2", KindAdmin, act(AdminSlackLink, slack, "linked"))
		c.add("slack-a-slack-unlink-3", KindAdmin, act(AdminSlackUnlink, slack, "unlinked"))
		c.add("slack-a-slack-link-4", KindAdmin, act(AdminSlackLink, slack, "linked"))
	}
	c := &memChain{t: t, keys: keys, taskID: chain, at: time.Now().UTC()}
	honest(c)
	if v := verdict(t, keys, c); !v.OK || v.Status != "disabled" {
		t.Fatalf("honest chain: %+v; want it to verify, the approver disabled", v)
	}

	other := slack
	other.Approver = "fedcba9876543210fedcba9876543210"
	for _, tc := range []struct {
		name string
		a    AdminAction
	}{
		{"link of an approver", act(AdminSlackLink, AdminTarget{Type: TargetApprover, ID: approver}, "linked")},
		{"disable of a slack user", act(AdminDisable, slack, "disabled")},
		{"revoke of a slack user", act(AdminRevoke, slack, "revoked")},
		{"wrong status", act(AdminSlackUnlink, slack, "linked")},
		{"another approver's link", act(AdminSlackLink, other, "linked")},
		{"slack user without an approver", act(AdminSlackLink, AdminTarget{Type: TargetSlackUser, ID: "U012AB3CD"}, "linked")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &memChain{t: t, keys: keys, taskID: chain, at: time.Now().UTC()}
			honest(c)
			c.add("x-5", KindAdmin, tc.a)
			if v := verdict(t, keys, c); v.OK || !slices.Contains(v.Rules(), RuleAdmin) {
				t.Fatalf("%+v", v)
			}
		})
	}
}

// RecordAdmin keys a Slack link's record by the link's revision, apart
// from the approver's own actions and from another Slack user's.
func TestRecordAdminSlackLink(t *testing.T) {
	l, keys := openLog(t)
	ctx := context.Background()
	const approver = "0123456789abcdef0123456789abcdef"
	at := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	link := func(user string) AdminAction {
		return AdminAction{Action: AdminSlackLink, Target: AdminTarget{Type: TargetSlackUser, ID: user, Approver: approver}, Status: "linked", By: "admin:ops", At: at}
	}
	var refs []string
	for _, a := range []struct {
		a   AdminAction
		key uint64
	}{
		{AdminAction{Action: AdminDisable, Target: AdminTarget{Type: TargetApprover, ID: approver}, Status: "disabled", By: "admin:ops", At: at}, 1},
		{link("U0ALICE"), 1},
		{link("U0BOB"), 1},
		{link("U0ALICE"), 1}, // a retry: the same record
	} {
		id, r, err := l.RecordAdmin(ctx, a.a, a.key)
		if err != nil || id != "admin-approver-"+approver {
			t.Fatalf("%+v: %s %v", a.a, id, err)
		}
		refs = append(refs, r.RecordRef)
	}
	if want := []string{refs[0], refs[1], refs[2], refs[1]}; !slices.Equal(refs, want) || refs[0] == refs[1] || refs[1] == refs[2] {
		t.Fatalf("records %q; want three, the retry the first link's", refs)
	}
	var export [][]byte
	if err := l.Export(ctx, time.Time{}, func(line []byte) error { export = append(export, bytes.Clone(line)); return nil }); err != nil {
		t.Fatal(err)
	}
	if rep := Verify(export, keys.PublicKeys(), VerifyOptions{}); !rep.OK || len(rep.Tasks) != 1 || rep.Tasks[0].Status != "disabled" {
		t.Fatalf("verify: %+v", rep)
	}
}
