package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Admin chains. An admin's action on an identity (the bootstrap or rotation
// of an admin token; adding an agent or an approver, issuing an approver an
// enrollment invite, the enrollment of a passkey; disabling, enabling or
// revoking an agent, an approver or one of an approver's passkeys; linking
// a Slack user to an approver or unlinking it; the rotation of the
// transaction-token signing key) is an
// "admin" record in the chain of that identity, named by [AdminChainID]:
// "admin-agent-…", "admin-admin-…", "admin-txtoken-key-…" (a hash of the
// name or key ID) or "admin-approver-<approver id>" (the approver's
// passkeys and Slack links share their approver's chain). Every record of an admin chain is
// an "admin" record; after a target's revocation no record acts on that
// target again, and a target is added (an agent or approver) or enrolled (a
// passkey) at most once, before any other action on it ([RuleAdmin]).
// Admin chains have no outcome record: each
// record is final when written. At most [MaxChainLen] actions per identity.
const KindAdmin = "admin"

// RuleAdmin: an admin chain holds only admin records of its own identity,
// each action leads to its status, and nothing acts on a revoked target.
const RuleAdmin = "admin-chain"

// Admin target types.
const (
	TargetAgent    = "agent"
	TargetApprover = "approver"
	TargetPasskey  = "passkey"
	TargetAdmin    = "admin"
	// TargetTokenKey is a transaction-token signing key (package
	// txtoken); its ID is the key ID.
	TargetTokenKey = "txtoken-key"
	// TargetSlackUser is a Slack user's link to an approver (package
	// notify); its ID is the Slack user ID, its Approver the approver's.
	TargetSlackUser = "slack-user"
)

// Admin actions: disable, enable and revoke an agent, an approver or a
// passkey; create or rotate an admin token (admin init, the admin token
// file); make a transaction-token signing key current in place of another,
// which is retired (AdminKeyRotate, the target the new key); link a Slack
// user to an approver, so that the user may deny that approver's tasks in
// Slack, or unlink it (AdminSlackLink and AdminSlackUnlink, the only
// actions on a TargetSlackUser). AdminCreate adds an agent or an approver
// (an in-band approver is added by its agent's first enrollment),
// AdminInvite issues an approver an enrollment invite, and AdminEnroll is
// a passkey's enrollment, by its approver on the approver site
// ("approver:<id>") or by an agent in-band ("agent:<principal>"): each is
// recorded before it takes effect, so every passkey that can sign an
// approval, and every approver, has its record.
const (
	AdminCreate      = "create"
	AdminInvite      = "invite"
	AdminEnroll      = "enroll"
	AdminDisable     = "disable"
	AdminEnable      = "enable"
	AdminRevoke      = "revoke"
	AdminTokenCreate = "token-create"
	AdminTokenRotate = "token-rotate"
	AdminKeyRotate   = "key-rotate"
	AdminSlackLink   = "slack-link"
	AdminSlackUnlink = "slack-unlink"
)

// AdminTarget names what an admin acted on.
type AdminTarget struct {
	Type string `json:"type"`
	// ID is the agent's or admin's name, the approver's id, the
	// passkey's credential id (base64url), the signing key's id or the
	// Slack user's id.
	ID string `json:"id"`
	// Approver is a passkey's approver, or the approver a Slack user is
	// linked to or unlinked from.
	Approver string `json:"approver,omitempty"`
}

// AdminAction is the body of an "admin" record.
type AdminAction struct {
	Action string      `json:"action"`
	Target AdminTarget `json:"target"`
	// Status is the target's status after the action: active, disabled
	// or revoked; for a Slack user, linked or unlinked.
	Status string `json:"status"`
	// By is who acted: "admin:<name>" (the admin API), "cli:admin-init",
	// "server:admin-token-file", or for AdminEnroll (and the in-band
	// approver's AdminCreate) "approver:<id>" or "agent:<principal>".
	By string `json:"by"`
	// Token is the fingerprint (first 16 hex of its SHA-256) of an admin
	// token created; Replaced, of the token it replaced and revoked, or,
	// for AdminKeyRotate, the ID of the signing key it replaced and
	// retired, or, for AdminSlackLink, the ID of the approver the Slack
	// user was linked to before (whose chain has the AdminSlackUnlink).
	Token    string    `json:"token,omitempty"`
	Replaced string    `json:"replaced,omitempty"`
	At       time.Time `json:"at"`
}

// AdminChainID is the chain an action on t goes to.
func AdminChainID(t AdminTarget) string {
	switch t.Type {
	case TargetApprover:
		return "admin-approver-" + t.ID
	case TargetPasskey, TargetSlackUser:
		return "admin-approver-" + t.Approver
	}
	sum := sha256.Sum256([]byte(t.ID))
	return "admin-" + t.Type + "-" + hex.EncodeToString(sum[:16])
}

// RecordAdmin appends a to its target's admin chain. key makes it
// idempotent: the revision of the stored status the action wrote, so a
// retry after a lost answer writes nothing new. A target is revoked once,
// so a revoke's step ignores key: recording it again, whatever the
// record's revision by then, returns the first record. For a Slack link
// key is the revision of the link. It returns the chain ID and the
// receipt.
func (l *Log) RecordAdmin(ctx context.Context, a AdminAction, key uint64) (string, Receipt, error) {
	if err := checkAdminTarget(a.Target); err != nil {
		return "", Receipt{}, err
	}
	id := AdminChainID(a.Target)
	step := a.Action + "-" + strconv.FormatUint(key, 10)
	if once(a.Action) {
		step = a.Action
	}
	switch a.Target.Type {
	case TargetPasskey:
		sum := sha256.Sum256([]byte(a.Target.ID))
		step = "passkey-" + hex.EncodeToString(sum[:8]) + "-" + step
	case TargetSlackUser:
		sum := sha256.Sum256([]byte(a.Target.ID))
		step = "slack-" + hex.EncodeToString(sum[:8]) + "-" + step
	}
	r, err := l.Append(ctx, id, Step{ID: step, Kind: KindAdmin, At: a.At, Body: a})
	return id, r, err
}

func checkAdminTarget(t AdminTarget) error {
	switch {
	case t.ID == "":
		return fmt.Errorf("audit: admin target %q without an id", t.Type)
	case t.Type == TargetApprover && !ValidTaskID("a"+t.ID):
		return fmt.Errorf("audit: approver id %q", t.ID)
	case t.Type == TargetPasskey && (t.Approver == "" || !ValidTaskID("a"+t.Approver)):
		return fmt.Errorf("audit: passkey %q without a valid approver", t.ID)
	case t.Type == TargetSlackUser && (t.Approver == "" || !ValidTaskID("a"+t.Approver)):
		return fmt.Errorf("audit: slack user %q without a valid approver", t.ID)
	case t.Type != TargetAgent && t.Type != TargetApprover && t.Type != TargetPasskey && t.Type != TargetAdmin && t.Type != TargetTokenKey && t.Type != TargetSlackUser:
		return fmt.Errorf("audit: unknown admin target type %q", t.Type)
	}
	return nil
}

// once reports whether action happens at most once to a target, so that
// its record's step ignores the key: recording it again returns the first
// record.
func once(action string) bool {
	return action == AdminRevoke || action == AdminCreate || action == AdminEnroll
}

// adminStatus is the status each action leads to.
var adminStatus = map[string]string{
	AdminCreate:      "active",
	AdminInvite:      "active",
	AdminEnroll:      "active",
	AdminDisable:     "disabled",
	AdminEnable:      "active",
	AdminRevoke:      "revoked",
	AdminTokenCreate: "active",
	AdminTokenRotate: "active",
	AdminKeyRotate:   "active",
	AdminSlackLink:   "linked",
	AdminSlackUnlink: "unlinked",
}

// slackAction reports whether action is one of a Slack link's: only they
// act on a TargetSlackUser, and only on it.
func slackAction(action string) bool {
	return action == AdminSlackLink || action == AdminSlackUnlink
}

// actionTargets are the target types of the actions that apply to some
// only; every other action but a Slack link's applies to any target but a
// Slack user.
var actionTargets = map[string][]string{
	AdminCreate: {TargetAgent, TargetApprover},
	AdminInvite: {TargetApprover},
	AdminEnroll: {TargetPasskey},
}

// verifyAdminChain checks an admin chain by RuleAdmin. Links and step
// uniqueness are checked by the caller.
func verifyAdminChain(chainID string, recs []Record, fail func(rule string, at int, format string, args ...any), v *TaskVerdict) {
	v.Complete = true
	revoked := map[AdminTarget]int{}
	seen := map[AdminTarget]int{} // the first record acting on each target
	for i, r := range recs {
		if r.Kind != KindAdmin {
			fail(RuleAdmin, i, "kind %q in an admin chain", r.Kind)
			continue
		}
		var a AdminAction
		if err := strictUnmarshal(r.Body, &a); err != nil {
			fail(RuleRecordBody, i, "admin body: %v", err)
			continue
		}
		if err := checkAdminTarget(a.Target); err != nil {
			fail(RuleAdmin, i, "%v", err)
			continue
		}
		if got := AdminChainID(a.Target); got != chainID {
			fail(RuleAdmin, i, "an action on %s %q belongs to chain %s", a.Target.Type, a.Target.ID, got)
		}
		want, ok := adminStatus[a.Action]
		switch {
		case !ok:
			fail(RuleAdmin, i, "unknown admin action %q", a.Action)
		case slackAction(a.Action) != (a.Target.Type == TargetSlackUser):
			fail(RuleAdmin, i, "%s of %s %q: not an action on it", a.Action, a.Target.Type, a.Target.ID)
		case actionTargets[a.Action] != nil && !slices.Contains(actionTargets[a.Action], a.Target.Type):
			fail(RuleAdmin, i, "%s of %s %q: not an action on it", a.Action, a.Target.Type, a.Target.ID)
		case a.Status != want:
			fail(RuleAdmin, i, "%s leaves the status %q, not %q", a.Action, want, a.Status)
		}
		if first, ok := seen[a.Target]; !ok {
			seen[a.Target] = i
		} else if a.Action == AdminCreate || a.Action == AdminEnroll {
			fail(RuleAdmin, i, "%s of %s %q after another action on it (record %d)", a.Action, a.Target.Type, a.Target.ID, first)
		}
		if at, ok := revoked[a.Target]; ok {
			fail(RuleAdmin, i, "%s of %s %q after its revocation (record %d)", a.Action, a.Target.Type, a.Target.ID, at)
		}
		if a.Action == AdminRevoke {
			revoked[a.Target] = i
		}
		if a.Target.Type != TargetPasskey && a.Target.Type != TargetSlackUser {
			v.Status = a.Status
		}
	}
	v.Disposition = "admin"
}
