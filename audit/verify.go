package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol/webauthncose"
	"github.com/gowebpki/jcs"

	"github.com/countersign/countersign/internal/canon"
)

// Rules the verifier checks. Every problem it reports names one, so an
// auditor (and `countersign audit verify`) can tell which promise a chain
// broke.
const (
	// RuleRecordIntegrity: each line is a canonical record with the known
	// fields only, of the chain's task, signed by one of the given keys
	// (without keys, [CheckOptions.SkipSignatures]: carrying a key ID and a
	// signature).
	RuleRecordIntegrity = "record-integrity"
	// RuleChainLinks: seqs 0, 1, 2, …; prev is the hash of the previous
	// record; no step is recorded twice.
	RuleChainLinks = "chain-links"
	// RuleRequested: the chain starts with a well-formed "requested" record
	// whose arguments match its action hash and whose quorum is at least 1
	// (quorum 0 only without a group: an unattended task).
	RuleRequested = "requested"
	// RuleRecordBody: a record's body has its kind's shape.
	RuleRecordBody = "record-body"
	// RuleUnknownKind: every record is of a known kind.
	RuleUnknownKind = "unknown-kind"
	// RuleAfterEnd: nothing but the outcome follows the terminal record.
	RuleAfterEnd = "after-end"
	// RuleApprovalEvidence: an accepted decision carries a WebAuthn
	// assertion over this task's call that verifies offline; a rejected
	// one carries none; a decision without a passkey can only deny.
	RuleApprovalEvidence = "approval-evidence"
	// RuleApproverIdentity: an accepted decision names its approver (and,
	// with a passkey, its credential).
	RuleApproverIdentity = "approver-identity"
	// RuleApproverCountedTwice: an approver counts once toward the quorum;
	// a credential or a public key belongs to one approver.
	RuleApproverCountedTwice = "approver-counted-twice"
	// RuleDecisionAfterDeny: no decision is accepted once the task is
	// denied (rejected ones may still be recorded).
	RuleDecisionAfterDeny = "decision-after-deny"
	// RuleApprovalBeyondQuorum: no approval is accepted once the quorum is
	// met; the workflow stops taking decisions there, so an approval past
	// the quorum is one it never counted.
	RuleApprovalBeyondQuorum = "approval-beyond-quorum"
	// RuleDecisionAfterClaim: no decision is accepted once the call is
	// claimed (rejected ones may still be recorded).
	RuleDecisionAfterClaim = "decision-after-claim"
	// RuleClaim: one claim, after a re-evaluation that allowed the call,
	// under a policy that allowed it; no re-evaluation after it.
	RuleClaim = "claim"
	// RuleClaimAfterDeny: no claim after an accepted deny.
	RuleClaimAfterDeny = "claim-after-deny"
	// RuleQuorumBeforeClaim: the distinct approvers of the approvals
	// accepted before the claim meet the requested quorum.
	RuleQuorumBeforeClaim = "quorum-before-claim"
	// RuleExecutionWithoutClaim: an end saying the tool ran
	// (approved-executed, execution-error, outcome-unknown) follows a claim.
	RuleExecutionWithoutClaim = "execution-without-claim"
	// RuleEndDisposition: the terminal record's status and disposition are
	// those of its kind; an executed end carries the result's digest and an
	// end where the tool did not run carries none.
	RuleEndDisposition = "end-disposition"
	// RuleStoppedAfterClaim: after the claim, no end says the call was
	// stopped (cancelled, expired) or did not run while recording its
	// result.
	RuleStoppedAfterClaim = "stopped-after-claim"
	// RuleEndAfterDeny: a task with an accepted deny ends denied.
	RuleEndAfterDeny = "end-after-deny"
	// RuleOutcomeApprovals: the outcome lists exactly the chain's accepted
	// decisions, in order.
	RuleOutcomeApprovals = "outcome-approvals"
	// RuleOutcome: the rest of the outcome is what the chain says.
	RuleOutcome = "outcome-mismatch"
	// RuleNotSealed: the chain ends with its outcome (unless
	// [VerifyOptions.AllowIncomplete]).
	RuleNotSealed = "not-sealed"
)

// Failure is one broken rule in a task's chain.
type Failure struct {
	Rule string `json:"rule"`
	// Record is the seq of the record that breaks the rule, -1 when no
	// single record does (an unreadable line, a chain not sealed).
	Record  int    `json:"record"`
	Kind    string `json:"kind,omitempty"`
	Message string `json:"message"`
}

// String is the failure as one line: "[rule] record 5 (claimed): message".
func (f Failure) String() string {
	if f.Record < 0 {
		return fmt.Sprintf("[%s] %s", f.Rule, f.Message)
	}
	return fmt.Sprintf("[%s] record %d (%s): %s", f.Rule, f.Record, f.Kind, f.Message)
}

// TaskVerdict is the verifier's answer for one task's chain.
type TaskVerdict struct {
	TaskID string `json:"taskId"`
	OK     bool   `json:"ok"`
	// Complete is true when the chain is sealed by its outcome.
	Complete bool `json:"complete"`
	// Status is what a task's chain says of the task: its end's status,
	// or, with no end, "claimed" when it holds the execution claim (the
	// tool may have run) and empty otherwise (pending). A token or admin
	// chain gives its own state.
	Status      string `json:"status,omitempty"`
	Disposition string `json:"disposition,omitempty"`
	Records     int    `json:"records"`
	// Approvals is the number of distinct approvers whose approvals the
	// chain accepted.
	Approvals int `json:"approvals"`
	// Problems are Failures as lines ([Failure.String]).
	Problems []string  `json:"problems,omitempty"`
	Failures []Failure `json:"failures,omitempty"`
	Notes    []string  `json:"notes,omitempty"`
}

// Rules lists the distinct rules the chain breaks, in the order found.
func (v TaskVerdict) Rules() []string {
	var out []string
	for _, f := range v.Failures {
		if !slices.Contains(out, f.Rule) {
			out = append(out, f.Rule)
		}
	}
	return out
}

// Report is the verifier's answer for an export.
type Report struct {
	OK    bool          `json:"ok"`
	Tasks []TaskVerdict `json:"tasks"`
	// Problems not tied to one task (unreadable lines).
	Problems []string `json:"problems,omitempty"`
}

// What a chain is, by its ID ([ChainKindOf]).
const (
	ChainTask  = "task"  // a task's chain ("tsk_…")
	ChainAdmin = "admin" // an admin chain ([AdminChainID]: "admin-…")
	ChainToken = "token" // a transaction token's chain ("txt_…", "txr_…")
)

// ChainKindOf is what the chain of ID id is: ChainAdmin, ChainToken or
// ChainTask. It goes by the ID, which each record of the chain names, so a
// chain whose records are broken is still counted as what it is.
func ChainKindOf(id string) string {
	switch {
	case strings.HasPrefix(id, "admin-"):
		return ChainAdmin
	case strings.HasPrefix(id, "txt_"), strings.HasPrefix(id, "txr_"):
		return ChainToken
	default:
		return ChainTask
	}
}

// Summary is the report in one line: the chains, counted by what they are,
// and how many failed, e.g. "3 chains: 2 tasks, 1 admin chain; 1 failed".
// Problems not tied to one chain (unreadable lines) are counted apart.
func (r Report) Summary() string {
	n := map[string]int{}
	failed := 0
	for _, v := range r.Tasks {
		n[ChainKindOf(v.TaskID)]++
		if !v.OK {
			failed++
		}
	}
	plural := func(k int, one, many string) string {
		if k == 1 {
			return "1 " + one
		}
		return fmt.Sprintf("%d %s", k, many)
	}
	s := plural(len(r.Tasks), "chain", "chains")
	var parts []string
	for _, c := range []struct{ kind, one, many string }{
		{ChainTask, "task", "tasks"},
		{ChainAdmin, "admin chain", "admin chains"},
		{ChainToken, "transaction-token chain", "transaction-token chains"},
	} {
		if n[c.kind] > 0 {
			parts = append(parts, plural(n[c.kind], c.one, c.many))
		}
	}
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, ", ")
	}
	s += fmt.Sprintf("; %d failed", failed)
	if len(r.Problems) > 0 {
		s += "; " + plural(len(r.Problems), "other problem", "other problems")
	}
	return s
}

// VerifyOptions adjusts [Verify].
type VerifyOptions struct {
	// AllowIncomplete accepts chains that are not sealed yet (tasks still
	// pending when exported). Without it an unsealed chain fails: a dropped
	// tail looks exactly like a pending task.
	AllowIncomplete bool
	// Checkpoints are earlier checkpoints of the same log ([NewCheckpoint],
	// [ReadCheckpoint]): every chain one saw must be in the export, at least
	// as long, with the same record at the checkpoint's head
	// ([RuleCheckpoint]). The export must then be whole (no --since): a
	// chain left out is reported missing.
	Checkpoints []*Checkpoint
}

// MaxLineBytes bounds one record line in [VerifyReader].
const MaxLineBytes = 4 << 20

// VerifyReader verifies a JSON Lines export.
func VerifyReader(r io.Reader, pubkeys []ed25519.PublicKey, opts VerifyOptions) (Report, error) {
	lines, err := ReadExport(r)
	if err != nil {
		return Report{}, err
	}
	return Verify(lines, pubkeys, opts), nil
}

// ReadExport reads a JSON Lines export as [Verify] and [NewCheckpoint]
// take it: every line, blank ones too (they count in line numbers), each
// at most MaxLineBytes.
func ReadExport(r io.Reader) ([][]byte, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	var lines [][]byte
	for sc.Scan() {
		lines = append(lines, bytes.Clone(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit: read export: %w", err)
	}
	return lines, nil
}

// Verify checks every record of an export: canonical form, signature (by
// key ID), chain links, the action hash recomputed from the recorded
// arguments, every WebAuthn assertion against the recorded public key and
// challenge, the outcome against the chain, and that the disposition is
// consistent with the steps. It groups the records by task and checks each
// chain as [CheckChain] does. lines are the export's lines in file order:
// a blank one is skipped, but counted in the line numbers problems name.
func Verify(lines [][]byte, pubkeys []ed25519.PublicKey, opts VerifyOptions) Report {
	p := newRecordParser(pubkeys, false)
	rep := Report{OK: true}
	records := 0
	type chainAcc struct {
		recs   []Record
		hashes []string
		bad    []Failure
	}
	chains := map[string]*chainAcc{}
	var order []string
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		records++
		r, h, err := p.parse(line)
		if err != nil {
			// Name the task if the line still says which.
			var probe struct {
				TaskID string `json:"taskId"`
			}
			if json.Unmarshal(line, &probe) == nil && ValidTaskID(probe.TaskID) {
				acc := chains[probe.TaskID]
				if acc == nil {
					acc = &chainAcc{}
					chains[probe.TaskID] = acc
					order = append(order, probe.TaskID)
				}
				acc.bad = append(acc.bad, lineFailure(i, err))
				continue
			}
			rep.Problems = append(rep.Problems, lineFailure(i, err).String())
			rep.OK = false
			continue
		}
		acc := chains[r.TaskID]
		if acc == nil {
			acc = &chainAcc{}
			chains[r.TaskID] = acc
			order = append(order, r.TaskID)
		}
		acc.recs = append(acc.recs, r)
		acc.hashes = append(acc.hashes, h)
	}
	for _, cp := range opts.Checkpoints {
		for _, h := range cp.Chains {
			acc := chains[h.Chain]
			if acc == nil {
				rep.OK = false
				rep.Problems = append(rep.Problems, Failure{Rule: RuleCheckpoint, Record: -1,
					Message: fmt.Sprintf("chain %s, %d records at the checkpoint of %s, is missing from the export", h.Chain, h.Records, cp.CreatedAt.UTC().Format(time.RFC3339))}.String())
				continue
			}
			acc.bad = append(acc.bad, checkpointFailures(h, cp.CreatedAt, acc.recs, acc.hashes)...)
		}
	}
	for _, id := range order {
		acc := chains[id]
		v := checkTask(id, acc.recs, acc.hashes, acc.bad, opts)
		if !v.OK {
			rep.OK = false
		}
		rep.Tasks = append(rep.Tasks, v)
	}
	if records == 0 {
		rep.OK = false
		rep.Problems = append(rep.Problems, Failure{Rule: RuleRecordIntegrity, Record: -1, Message: "the export holds no records"}.String())
	}
	return rep
}

// CheckOptions adjusts [CheckChain]. Set exactly one of Keys and
// SkipSignatures: the zero value is refused, so no caller skips the
// signatures by leaving the keys out.
type CheckOptions struct {
	// Keys are the audit public keys; every record must be signed by one.
	Keys []ed25519.PublicKey
	// SkipSignatures checks the chain without Keys, for a holder of none
	// (the HTTP-only web server): each record must still carry a key ID
	// and an Ed25519-sized signature, but the signature is not verified,
	// so the verdict does not prove who wrote the records. Every other
	// rule is checked, the WebAuthn assertions of accepted decisions
	// included (their public keys are in the records).
	SkipSignatures bool
	// AllowIncomplete accepts a chain not sealed yet, as in
	// [VerifyOptions].
	AllowIncomplete bool
}

// ErrCheckOptions reports [CheckOptions] that set both or neither of Keys
// and SkipSignatures.
var ErrCheckOptions = errors.New("audit: check options need public keys, or SkipSignatures without keys")

// CheckChain checks one task's chain, its lines in order, by every rule
// [Verify] applies; with [CheckOptions.SkipSignatures], all but the
// records' signatures. A line of another task breaks [RuleRecordIntegrity].
// The verdict says whether the chain holds (OK) and which rules it breaks;
// the records are those that parsed, in order, to be used only when the
// verdict is OK. The error is [ErrInvalidTaskID] or [ErrCheckOptions]: the
// chain was not checked.
func CheckChain(taskID string, lines [][]byte, opts CheckOptions) (TaskVerdict, []Record, error) {
	if (len(opts.Keys) == 0) != opts.SkipSignatures {
		return TaskVerdict{}, nil, ErrCheckOptions
	}
	if !ValidTaskID(taskID) {
		return TaskVerdict{}, nil, ErrInvalidTaskID
	}
	p := newRecordParser(opts.Keys, opts.SkipSignatures)
	recs := make([]Record, 0, len(lines))
	hashes := make([]string, 0, len(lines))
	var bad []Failure
	for i, line := range lines {
		r, h, err := p.parse(line)
		if err == nil && r.TaskID != taskID {
			err = fmt.Errorf("audit: record of task %q, not %q", r.TaskID, taskID)
		}
		if err != nil {
			bad = append(bad, lineFailure(i, err))
			continue
		}
		recs = append(recs, r)
		hashes = append(hashes, h)
	}
	v := checkTask(taskID, recs, hashes, bad, VerifyOptions{AllowIncomplete: opts.AllowIncomplete})
	if opts.SkipSignatures {
		v.Notes = append(v.Notes, "signatures not checked: no public keys")
	}
	return v, recs, nil
}

// lineFailure is the failure of the i-th line (0-based) to parse.
func lineFailure(i int, err error) Failure {
	return Failure{Rule: RuleRecordIntegrity, Record: -1, Message: fmt.Sprintf("line %d: %v", i+1, err)}
}

// checkTask checks one task's parsed records; bad are the failures of its
// lines that did not parse, reported first.
func checkTask(taskID string, recs []Record, hashes []string, bad []Failure, opts VerifyOptions) TaskVerdict {
	v := verifyChain(taskID, recs, hashes, opts)
	if len(bad) > 0 {
		v.Failures = append(bad, v.Failures...)
	}
	v.Problems = nil
	for _, f := range v.Failures {
		v.Problems = append(v.Problems, f.String())
	}
	v.OK = len(v.Failures) == 0
	return v
}

// verifyChain checks one task's records, given in file order; checkTask,
// its one caller, sets the verdict's OK and Problems from its Failures.
func verifyChain(taskID string, recs []Record, hashes []string, opts VerifyOptions) (v TaskVerdict) {
	v = TaskVerdict{TaskID: taskID, Records: len(recs)}
	// fail records that record at (-1: none) breaks rule.
	fail := func(rule string, at int, format string, args ...any) {
		f := Failure{Rule: rule, Record: at, Message: fmt.Sprintf(format, args...)}
		if at >= 0 && at < len(recs) {
			f.Kind = recs[at].Kind
		}
		v.Failures = append(v.Failures, f)
	}
	// Links.
	for i, r := range recs {
		if r.Seq != i {
			fail(RuleChainLinks, i, "seq %d: records missing, duplicated or out of order", r.Seq)
			return v
		}
		want := ""
		if i > 0 {
			want = hashes[i-1]
		}
		if r.Prev != want {
			fail(RuleChainLinks, i, "prev does not match the hash of record %d", i-1)
			return v
		}
	}
	seenStep := map[string]bool{}
	for i, r := range recs {
		if seenStep[r.StepID] {
			fail(RuleChainLinks, i, "step %q recorded twice", r.StepID)
		}
		seenStep[r.StepID] = true
	}
	if len(recs) == 0 {
		fail(RuleChainLinks, -1, "no valid records")
		return v
	}
	if IsTokenChainStart(recs[0].Kind) {
		verifyTokenChain(recs, fail, &v)
		return v
	}
	if recs[0].Kind == KindAdmin {
		verifyAdminChain(taskID, recs, fail, &v)
		return v
	}
	if recs[0].Kind != KindRequested {
		fail(RuleRequested, 0, "the first record is %q, want %q", recs[0].Kind, KindRequested)
		return v
	}
	var req Requested
	if err := strictUnmarshal(recs[0].Body, &req); err != nil {
		fail(RuleRequested, 0, "requested body: %v", err)
		return v
	}
	actionHash, err := canon.ParseActionHash(req.Envelope.ActionHash)
	if err != nil {
		fail(RuleRequested, 0, "%v", err)
		return v
	}
	checkEnvelope(req.Envelope, actionHash, func(format string, args ...any) { fail(RuleRequested, 0, format, args...) }, &v)
	quorum := req.Requirement.Quorum
	unattended := quorum == 0 && req.Requirement.Group == ""
	switch {
	case unattended:
		v.Notes = append(v.Notes, "unattended: policy allowed the call without approval")
	case quorum < 1:
		fail(RuleRequested, 0, "quorum %d", quorum)
	}

	// Steps in order.
	var (
		approvers   = map[string]int{} // approver ID → record of their counted approval
		creds       = map[string]string{}
		keyCreds    = map[string]string{} // COSE public key → credential ID
		deniedAt    = -1                  // the first accepted deny
		quorumAt    = -1                  // the approval that met the quorum
		reevalAllow bool
		claimedAt   = -1
		terminalAt  = -1
		outcomeAt   = -1
	)
	for i, r := range recs[1:] {
		i++
		if terminalAt >= 0 && !(r.Kind == KindOutcome && i == terminalAt+1) {
			fail(RuleAfterEnd, i, "%s after the terminal record %q (record %d)", r.Kind, recs[terminalAt].Kind, terminalAt)
			continue
		}
		switch r.Kind {
		case KindNotified, KindNotifyFail, KindCancelRefused:
			// Whether the approvers were told, and a cancel refused because
			// the call was claimed (the call goes on): they change nothing
			// the rules look at, and say nothing more than their kind.
			if err := strictUnmarshal(r.Body, &struct{}{}); err != nil {
				fail(RuleRecordBody, i, "%s body: %v", r.Kind, err)
			}
		case KindDecision:
			var d Decision
			if err := strictUnmarshal(r.Body, &d); err != nil {
				fail(RuleRecordBody, i, "decision body: %v", err)
				continue
			}
			if !d.Accepted {
				// A rejected decision is a true statement wherever it falls
				// before the end, after the claim or a deny too.
				if d.Approval != nil || d.Unsigned != nil {
					fail(RuleApprovalEvidence, i, "rejected decision carries an approval")
				}
				continue
			}
			switch {
			case claimedAt >= 0:
				fail(RuleDecisionAfterClaim, i, "accepted %s after the execution claim (record %d): no decision counts once the call is claimed", d.Decision, claimedAt)
			case deniedAt >= 0:
				fail(RuleDecisionAfterDeny, i, "accepted %s after the accepted deny (record %d): the task takes no decision once denied", d.Decision, deniedAt)
			}
			if d.Unsigned != nil {
				if d.Decision != "deny" || d.Approval != nil {
					fail(RuleApprovalEvidence, i, "an unsigned decision can only be a deny")
					continue
				}
				if d.Unsigned.ApproverID == "" {
					fail(RuleApproverIdentity, i, "unsigned deny names no approver")
				}
				if deniedAt < 0 {
					deniedAt = i
				}
				v.Notes = append(v.Notes, fmt.Sprintf("denied without a passkey by %s via %s", d.Unsigned.ApproverName, d.Unsigned.Via))
				continue
			}
			if d.Approval == nil || d.Approval.Decision != d.Decision {
				fail(RuleApprovalEvidence, i, "accepted decision without its assertion")
				continue
			}
			a := d.Approval
			if err := VerifyAssertion(*a, actionHash); err != nil {
				fail(RuleApprovalEvidence, i, "%s's %s: %v", a.ApproverName, d.Decision, err)
				continue
			}
			// An approver group's challenges bind their decision; an
			// in-band call's (no group) can only approve and keep
			// SEP-2672's random nonce.
			if req.Requirement.Group != "" && !AssertionShowsDecision(*a) {
				v.Notes = append(v.Notes, fmt.Sprintf("%s's %s (record %d): the assertion does not show which decision it was made for (a challenge issued before decision-bound nonces)", a.ApproverName, d.Decision, i))
			}
			if a.ApproverID == "" || a.CredentialID == "" {
				fail(RuleApproverIdentity, i, "accepted %s names no approver or no credential (approver %q, credential %q)", d.Decision, a.ApproverID, a.CredentialID)
				continue
			}
			if other, ok := creds[a.CredentialID]; ok && other != a.ApproverID {
				fail(RuleApproverCountedTwice, i, "credential %s used by two approvers, %s and %s", a.CredentialID, other, a.ApproverID)
			}
			creds[a.CredentialID] = a.ApproverID
			if other, ok := keyCreds[string(a.PublicKey)]; ok && other != a.CredentialID {
				fail(RuleApproverCountedTwice, i, "credential %s of %s has the same public key as credential %s of %s: one authenticator, counted for two", a.CredentialID, a.ApproverID, other, creds[other])
			}
			keyCreds[string(a.PublicKey)] = a.CredentialID
			switch d.Decision {
			case "approve":
				if first, ok := approvers[a.ApproverID]; ok {
					fail(RuleApproverCountedTwice, i, "approver %s approved twice (first at record %d); an approver counts once toward the quorum", a.ApproverID, first)
					continue
				}
				if quorum >= 1 && quorumAt >= 0 && claimedAt < 0 && deniedAt < 0 {
					fail(RuleApprovalBeyondQuorum, i, "approval by %s (%s) accepted after the quorum of %d was met (record %d): an approval the workflow could not count",
						a.ApproverID, a.ApproverName, quorum, quorumAt)
				}
				approvers[a.ApproverID] = i
				if len(approvers) == quorum && quorumAt < 0 {
					quorumAt = i
				}
			case "deny":
				if deniedAt < 0 {
					deniedAt = i
				}
			default:
				fail(RuleApprovalEvidence, i, "decision %q", d.Decision)
			}
		case KindReevaluated:
			var p Policy
			if err := strictUnmarshal(r.Body, &p); err != nil {
				fail(RuleRecordBody, i, "reevaluated body: %v", err)
				continue
			}
			if claimedAt >= 0 {
				fail(RuleClaim, i, "re-evaluation after the claim (record %d)", claimedAt)
			}
			reevalAllow = p.Allow
		case KindClaimed:
			var p Policy
			if err := strictUnmarshal(r.Body, &p); err != nil {
				fail(RuleRecordBody, i, "claimed body: %v", err)
				continue
			}
			if claimedAt >= 0 {
				fail(RuleClaim, i, "second execution claim (the first is record %d)", claimedAt)
				continue
			}
			claimedAt = i
			if !p.Allow {
				fail(RuleClaim, i, "execution claimed under a policy that did not allow the call (effect %q)", p.Effect)
			}
			if !reevalAllow {
				fail(RuleClaim, i, "execution claimed without a re-evaluation that allowed it")
			}
			if deniedAt >= 0 {
				fail(RuleClaimAfterDeny, i, "execution claimed after the accepted deny (record %d)", deniedAt)
			}
			if n := len(approvers); n < quorum {
				fail(RuleQuorumBeforeClaim, i, "execution claimed with %d distinct approver(s) accepted before it, quorum is %d", n, quorum)
			}
		case KindOutcome:
			if terminalAt < 0 {
				fail(RuleRecordBody, i, "outcome without a terminal record before it")
				continue
			}
			outcomeAt = i
		default:
			if !IsTerminalKind(r.Kind) {
				fail(RuleUnknownKind, i, "unknown kind %q", r.Kind)
				continue
			}
			terminalAt = i
			var e Ended
			if err := strictUnmarshal(r.Body, &e); err != nil {
				fail(RuleRecordBody, i, "terminal body: %v", err)
				continue
			}
			tk := terminalKinds[r.Kind]
			if unattended {
				tk = unattendedEnd(r.Kind, tk)
			}
			if e.Status != tk.status || e.Disposition != tk.disposition {
				fail(RuleEndDisposition, i, "%s with status %q and disposition %q, want %q and %q", r.Kind, e.Status, e.Disposition, tk.status, tk.disposition)
			}
			switch {
			case tk.executed && claimedAt < 0:
				fail(RuleExecutionWithoutClaim, i, "%s without an execution claim: the tool ran with no claim and no quorum committed before one", r.Kind)
			case !tk.executed && claimedAt >= 0 && e.ResultDigest != "":
				fail(RuleStoppedAfterClaim, i, "%s (%s/%s) after the execution claim (record %d) records the tool's result: the tool ran", r.Kind, e.Status, e.Disposition, claimedAt)
			case (r.Kind == KindCancelled || r.Kind == KindExpired) && claimedAt >= 0:
				fail(RuleStoppedAfterClaim, i, "%s after the execution claim (record %d): a claimed call cannot be stopped", r.Kind, claimedAt)
			case !tk.executed && e.ResultDigest != "":
				fail(RuleEndDisposition, i, "%s records a tool result, but the call was never claimed", r.Kind)
			case r.Kind == KindDenied && claimedAt >= 0:
				note := "denied after the execution claim: the call was refused before the tool ran"
				if e.Detail != "" {
					note += " (" + e.Detail + ")"
				}
				v.Notes = append(v.Notes, note)
			}
			if deniedAt >= 0 && r.Kind != KindDenied {
				fail(RuleEndAfterDeny, i, "%s after the accepted deny (record %d)", r.Kind, deniedAt)
			}
			if r.Kind == KindExecuted && e.ResultDigest == "" {
				fail(RuleEndDisposition, i, "executed without a result digest")
			}
			v.Status, v.Disposition = e.Status, e.Disposition
		}
	}
	v.Approvals = len(approvers)

	if outcomeAt < 0 {
		if claimedAt >= 0 && terminalAt < 0 {
			// Not "pending": the call was claimed, and its end is not
			// here (still running, or dropped).
			v.Status = "claimed"
			v.Notes = append(v.Notes, fmt.Sprintf("claimed at record %d with no end: the tool may have run", claimedAt))
		}
		if opts.AllowIncomplete {
			v.Notes = append(v.Notes, "not sealed: the task had not ended when exported")
		} else {
			fail(RuleNotSealed, -1, "chain not sealed by an outcome record (task pending, or records dropped)")
		}
		return v
	}
	v.Complete = true
	want, err := BuildOutcome(recs[:outcomeAt], hashes[:outcomeAt])
	if err != nil {
		fail(RuleOutcome, outcomeAt, "%v", err)
		return v
	}
	var got Outcome
	if err := strictUnmarshal(recs[outcomeAt].Body, &got); err != nil {
		fail(RuleRecordBody, outcomeAt, "outcome body: %v", err)
		return v
	}
	checkOutcome(got, want, func(rule, format string, args ...any) { fail(rule, outcomeAt, format, args...) })
	return v
}

// checkOutcome compares the outcome record with the one the chain implies:
// first its approvals, then every other member.
func checkOutcome(got, want Outcome, fail func(rule, format string, args ...any)) {
	if len(got.Approvals) != len(want.Approvals) {
		fail(RuleOutcomeApprovals, "outcome lists %d approvals; the chain accepted %d decision(s) with an assertion", len(got.Approvals), len(want.Approvals))
	} else {
		for j := range got.Approvals {
			g, err1 := canonical(got.Approvals[j])
			w, err2 := canonical(want.Approvals[j])
			if err1 != nil || err2 != nil || !bytes.Equal(g, w) {
				fail(RuleOutcomeApprovals, "outcome approval %d (%s) is not the chain's accepted decision (%s)", j, got.Approvals[j].ApproverID, want.Approvals[j].ApproverID)
			}
		}
	}
	got.Approvals, want.Approvals = nil, nil
	var gm, wm map[string]json.RawMessage
	gb, err1 := json.Marshal(got)
	wb, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil || json.Unmarshal(gb, &gm) != nil || json.Unmarshal(wb, &wm) != nil {
		fail(RuleOutcome, "outcome record cannot be compared with the chain it seals")
		return
	}
	var diff []string
	for k := range gm {
		if _, ok := wm[k]; !ok {
			diff = append(diff, k)
		}
	}
	for k, w := range wm {
		g, ok := gm[k]
		if !ok {
			diff = append(diff, k)
			continue
		}
		gc, err1 := jcs.Transform(g)
		wc, err2 := jcs.Transform(w)
		if err1 != nil || err2 != nil || !bytes.Equal(gc, wc) {
			diff = append(diff, k)
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		fail(RuleOutcome, "outcome record does not match the chain it seals (%s)", strings.Join(diff, ", "))
	}
}

// checkEnvelope recomputes the action hash from the recorded arguments.
func checkEnvelope(env Envelope, want canon.ActionHash, fail func(string, ...any), v *TaskVerdict) {
	if env.Redacted {
		if len(env.Arguments) != 0 {
			fail("requested: redacted envelope carries arguments")
		}
		v.Notes = append(v.Notes, "arguments redacted: action hash not recomputed (argumentsDigest binds them)")
		return
	}
	c, err := canon.Canonicalize(env.Arguments)
	if err != nil {
		fail("requested: arguments: %v", err)
		return
	}
	if d := sha256.Sum256(c); hex.EncodeToString(d[:]) != env.ArgumentsDigest {
		fail("requested: argumentsDigest does not match the arguments")
	}
	got, err := canon.Hash(env.Tool, env.Arguments, env.ServerID)
	if err != nil {
		fail("requested: action hash: %v", err)
		return
	}
	if got != want {
		fail("requested: action hash does not match tool, arguments and server id")
	}
}

// VerifyAssertion re-verifies one approval's WebAuthn assertion offline:
// clientDataJSON is a webauthn.get over the recorded challenge, whose last
// 32 bytes are the task's action hash and whose nonce, when bound to a
// decision (canon.DecisionNonce), is bound to the recorded one; the RP ID
// hash matches the origin's host; user presence and verification are set;
// and the signature over authenticatorData ‖ SHA-256(clientDataJSON)
// verifies with the recorded COSE public key. A nonce bound to no decision
// (challenges issued before nonces were bound) passes;
// [AssertionShowsDecision] tells them apart.
func VerifyAssertion(a Approval, actionHash canon.ActionHash) error {
	var cd struct {
		Type      string `json:"type"`
		Challenge string `json:"challenge"`
		Origin    string `json:"origin"`
	}
	if err := json.Unmarshal(a.ClientDataJSON, &cd); err != nil {
		return fmt.Errorf("clientDataJSON: %w", err)
	}
	if cd.Type != "webauthn.get" {
		return fmt.Errorf("clientDataJSON type %q, want webauthn.get", cd.Type)
	}
	if cd.Challenge != a.Challenge {
		return errors.New("clientDataJSON challenge is not the recorded challenge")
	}
	ch, err := base64.RawURLEncoding.DecodeString(cd.Challenge)
	if err != nil || len(ch) != 32+canon.HashSize {
		return errors.New("challenge is not base64url(32-byte nonce ‖ action hash)")
	}
	if !bytes.Equal(ch[32:], actionHash[:]) {
		return errors.New("challenge is not bound to the task's action hash")
	}
	if bound := canon.NonceDecision(ch[:32], decisions...); bound != "" && bound != a.Decision {
		return fmt.Errorf("the passkey signed a challenge for %s, recorded as %s", bound, a.Decision)
	}
	ad := a.AuthenticatorData
	if len(ad) < 37 {
		return errors.New("authenticatorData too short")
	}
	const flagUP, flagUV = 0x01, 0x04
	if ad[32]&flagUP == 0 || ad[32]&flagUV == 0 {
		return errors.New("user presence or verification flag not set")
	}
	u, err := url.Parse(cd.Origin)
	if err != nil || u.Hostname() == "" {
		return errors.New("clientDataJSON origin is not a URL")
	}
	if !rpIDMatches(ad[:32], u.Hostname()) {
		return errors.New("RP ID hash does not match the origin")
	}
	key, err := webauthncose.ParsePublicKey(a.PublicKey)
	if err != nil {
		return fmt.Errorf("public key: %w", err)
	}
	cdHash := sha256.Sum256(a.ClientDataJSON)
	ok, err := webauthncose.VerifySignature(key, append(bytes.Clone(ad), cdHash[:]...), a.Signature)
	if err != nil || !ok {
		return errors.New("assertion signature does not verify")
	}
	return nil
}

// decisions are the decisions an approver's nonce may be bound to.
var decisions = []string{"approve", "deny"}

// AssertionShowsDecision reports whether a's challenge nonce is bound to
// its decision (canon.DecisionNonce), so that the assertion itself shows
// whether the approver approved or denied; it is checked, with the rest,
// by [VerifyAssertion]. Challenges issued before nonces were bound show
// no decision.
func AssertionShowsDecision(a Approval) bool {
	ch, err := base64.RawURLEncoding.DecodeString(a.Challenge)
	return err == nil && len(ch) == 32+canon.HashSize && canon.NonceDecision(ch[:32], decisions...) == a.Decision
}

// rpIDMatches reports whether hash is SHA-256 of host or of one of its
// parent domains (an RP ID may be a registrable suffix of the origin).
func rpIDMatches(hash []byte, host string) bool {
	for h := host; h != ""; {
		s := sha256.Sum256([]byte(h))
		if bytes.Equal(s[:], hash) {
			return true
		}
		i := strings.IndexByte(h, '.')
		if i < 0 {
			break
		}
		h = h[i+1:]
	}
	return false
}

// unattendedEnd is what a terminal kind carries for an unattended task
// (policy allowed the call on an asynchronous tool; nothing was approved): an
// executed end has no disposition (its result is the tool's own, whether or
// not the tool reported an error), and "expired" means the client never
// answered the task's input requests, which fails the task.
func unattendedEnd(kind string, tk terminalKind) terminalKind {
	switch kind {
	case KindExecuted:
		tk.disposition = ""
	case KindExpired:
		tk.status, tk.disposition = "failed", ""
	}
	return tk
}
