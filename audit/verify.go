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
	"strings"

	"github.com/go-webauthn/webauthn/protocol/webauthncose"

	"github.com/countersign/countersign/internal/canon"
)

// TaskVerdict is the verifier's answer for one task's chain.
type TaskVerdict struct {
	TaskID string `json:"taskId"`
	OK     bool   `json:"ok"`
	// Complete is true when the chain is sealed by its outcome.
	Complete    bool     `json:"complete"`
	Status      string   `json:"status,omitempty"`
	Disposition string   `json:"disposition,omitempty"`
	Records     int      `json:"records"`
	Approvals   int      `json:"approvals"`
	Problems    []string `json:"problems,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// Report is the verifier's answer for an export.
type Report struct {
	OK    bool          `json:"ok"`
	Tasks []TaskVerdict `json:"tasks"`
	// Problems not tied to one task (unreadable lines).
	Problems []string `json:"problems,omitempty"`
}

// VerifyOptions adjusts [Verify].
type VerifyOptions struct {
	// AllowIncomplete accepts chains that are not sealed yet (tasks still
	// pending when exported). Without it an unsealed chain fails: a dropped
	// tail looks exactly like a pending task.
	AllowIncomplete bool
}

// MaxLineBytes bounds one record line in [VerifyReader].
const MaxLineBytes = 4 << 20

// VerifyReader verifies a JSON Lines export.
func VerifyReader(r io.Reader, pubkeys []ed25519.PublicKey, opts VerifyOptions) (Report, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	var lines [][]byte
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		lines = append(lines, bytes.Clone(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		return Report{}, fmt.Errorf("audit: read export: %w", err)
	}
	return Verify(lines, pubkeys, opts), nil
}

// Verify checks every record of an export: canonical form, signature (by
// key ID), chain links, the action hash recomputed from the recorded
// arguments, every WebAuthn assertion against the recorded public key and
// challenge, the outcome against the chain, and that the disposition is
// consistent with the steps.
func Verify(lines [][]byte, pubkeys []ed25519.PublicKey, opts VerifyOptions) Report {
	keys := make(map[string]ed25519.PublicKey, len(pubkeys))
	for _, k := range pubkeys {
		keys[KeyID(k)] = k
	}
	rep := Report{OK: true}
	type chainAcc struct {
		recs   []Record
		hashes []string
		bad    []string
	}
	chains := map[string]*chainAcc{}
	var order []string
	for i, line := range lines {
		r, h, err := ParseRecord(line, keys)
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
				acc.bad = append(acc.bad, fmt.Sprintf("line %d: %v", i+1, err))
				continue
			}
			rep.Problems = append(rep.Problems, fmt.Sprintf("line %d: %v", i+1, err))
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
	for _, id := range order {
		acc := chains[id]
		v := verifyChain(id, acc.recs, acc.hashes, opts)
		if len(acc.bad) > 0 {
			v.Problems = append(acc.bad, v.Problems...)
			v.OK = false
		}
		if !v.OK {
			rep.OK = false
		}
		rep.Tasks = append(rep.Tasks, v)
	}
	if len(lines) == 0 {
		rep.OK = false
		rep.Problems = append(rep.Problems, "the export holds no records")
	}
	return rep
}

// verifyChain checks one task's records, given in file order.
func verifyChain(taskID string, recs []Record, hashes []string, opts VerifyOptions) (v TaskVerdict) {
	v = TaskVerdict{TaskID: taskID, Records: len(recs)}
	fail := func(format string, args ...any) { v.Problems = append(v.Problems, fmt.Sprintf(format, args...)) }
	defer func() { v.OK = len(v.Problems) == 0 }()

	// Links.
	for i, r := range recs {
		if r.Seq != i {
			fail("record %d: seq %d: records missing, duplicated or out of order", i, r.Seq)
			return v
		}
		want := ""
		if i > 0 {
			want = hashes[i-1]
		}
		if r.Prev != want {
			fail("record %d (%s): prev does not match the hash of record %d", i, r.Kind, i-1)
			return v
		}
	}
	seenStep := map[string]bool{}
	for i, r := range recs {
		if seenStep[r.StepID] {
			fail("record %d: step %q recorded twice", i, r.StepID)
		}
		seenStep[r.StepID] = true
	}
	if len(recs) == 0 {
		fail("no valid records")
		return v
	}
	if recs[0].Kind != KindRequested {
		fail("record 0 is %q, want %q", recs[0].Kind, KindRequested)
		return v
	}
	var req Requested
	if err := strictUnmarshal(recs[0].Body, &req); err != nil {
		fail("requested body: %v", err)
		return v
	}
	actionHash, err := canon.ParseActionHash(req.Envelope.ActionHash)
	if err != nil {
		fail("requested: %v", err)
		return v
	}
	checkEnvelope(req.Envelope, actionHash, fail, &v)
	switch {
	case req.Requirement.Quorum == 0 && req.Requirement.Group == "":
		v.Notes = append(v.Notes, "unattended: policy allowed the call without approval")
	case req.Requirement.Quorum < 1:
		fail("requested: quorum %d", req.Requirement.Quorum)
	}

	// Steps in order.
	approvers := map[string]bool{}
	creds := map[string]string{}
	var (
		denied      bool
		reevalAllow bool
		claimedAt   = -1
		terminalAt  = -1
		outcomeAt   = -1
	)
	for i, r := range recs[1:] {
		i++
		if terminalAt >= 0 && !(r.Kind == KindOutcome && i == terminalAt+1) {
			fail("record %d (%s) after the terminal record %q", i, r.Kind, recs[terminalAt].Kind)
			continue
		}
		switch r.Kind {
		case KindNotified, KindNotifyFail:
		case KindDecision:
			var d Decision
			if err := strictUnmarshal(r.Body, &d); err != nil {
				fail("record %d: decision body: %v", i, err)
				continue
			}
			if claimedAt >= 0 || denied {
				fail("record %d: decision after the task stopped taking decisions", i)
			}
			if !d.Accepted {
				if d.Approval != nil || d.Unsigned != nil {
					fail("record %d: rejected decision carries an approval", i)
				}
				continue
			}
			if d.Unsigned != nil {
				if d.Decision != "deny" || d.Approval != nil {
					fail("record %d: an unsigned decision can only be a deny", i)
					continue
				}
				denied = true
				v.Notes = append(v.Notes, fmt.Sprintf("denied without a passkey by %s via %s", d.Unsigned.ApproverName, d.Unsigned.Via))
				continue
			}
			if d.Approval == nil || d.Approval.Decision != d.Decision {
				fail("record %d: accepted decision without its assertion", i)
				continue
			}
			if err := VerifyAssertion(*d.Approval, actionHash); err != nil {
				fail("record %d: %s's %s: %v", i, d.Approval.ApproverName, d.Decision, err)
				continue
			}
			if other, ok := creds[d.Approval.CredentialID]; ok && other != d.Approval.ApproverID {
				fail("record %d: credential used by two approvers", i)
			}
			creds[d.Approval.CredentialID] = d.Approval.ApproverID
			switch d.Decision {
			case "approve":
				if approvers[d.Approval.ApproverID] {
					fail("record %d: approver %s approved twice", i, d.Approval.ApproverID)
				}
				approvers[d.Approval.ApproverID] = true
			case "deny":
				denied = true
			default:
				fail("record %d: decision %q", i, d.Decision)
			}
		case KindReevaluated:
			var p Policy
			if err := strictUnmarshal(r.Body, &p); err != nil {
				fail("record %d: reevaluated body: %v", i, err)
				continue
			}
			if claimedAt >= 0 {
				fail("record %d: re-evaluation after the claim", i)
			}
			reevalAllow = p.Allow
		case KindClaimed:
			var p Policy
			if err := strictUnmarshal(r.Body, &p); err != nil {
				fail("record %d: claimed body: %v", i, err)
				continue
			}
			if claimedAt >= 0 {
				fail("record %d: second execution claim", i)
			}
			claimedAt = i
			if !reevalAllow {
				fail("record %d: execution claimed without a re-evaluation that allowed it", i)
			}
			if denied {
				fail("record %d: execution claimed after a denial", i)
			}
			if len(approvers) < req.Requirement.Quorum {
				fail("record %d: execution claimed with %d valid approvals, quorum is %d", i, len(approvers), req.Requirement.Quorum)
			}
		case KindOutcome:
			if terminalAt < 0 {
				fail("record %d: outcome without a terminal record before it", i)
				continue
			}
			outcomeAt = i
		default:
			if !IsTerminalKind(r.Kind) {
				fail("record %d: unknown kind %q", i, r.Kind)
				continue
			}
			terminalAt = i
			var e Ended
			if err := strictUnmarshal(r.Body, &e); err != nil {
				fail("record %d: terminal body: %v", i, err)
				continue
			}
			tk := terminalKinds[r.Kind]
			if e.Status != tk.status || e.Disposition != tk.disposition {
				fail("record %d: %s with status %q and disposition %q", i, r.Kind, e.Status, e.Disposition)
			}
			if tk.executed && claimedAt < 0 {
				fail("record %d: %s without an execution claim", i, r.Kind)
			}
			if (r.Kind == KindCancelled || r.Kind == KindExpired) && claimedAt >= 0 {
				fail("record %d: %s after the execution claim", i, r.Kind)
			}
			if denied && r.Kind != KindDenied {
				fail("record %d: %s after an approver denied", i, r.Kind)
			}
			if r.Kind == KindExecuted && e.ResultDigest == "" {
				fail("record %d: executed without a result digest", i)
			}
			v.Status, v.Disposition = e.Status, e.Disposition
		}
	}
	v.Approvals = len(approvers)

	if outcomeAt < 0 {
		if opts.AllowIncomplete {
			v.Notes = append(v.Notes, "not sealed: the task had not ended when exported")
		} else {
			fail("chain not sealed by an outcome record (task pending, or records dropped)")
		}
		return v
	}
	v.Complete = true
	want, err := BuildOutcome(recs[:outcomeAt], hashes[:outcomeAt])
	if err != nil {
		fail("outcome: %v", err)
		return v
	}
	wantC, err1 := canonical(want)
	gotC, err2 := canonicalRaw(recs[outcomeAt].Body)
	if err1 != nil || err2 != nil || !bytes.Equal(wantC, gotC) {
		fail("outcome record does not match the chain it seals")
	}
	return v
}

func canonicalRaw(b []byte) ([]byte, error) {
	var o Outcome
	if err := strictUnmarshal(b, &o); err != nil {
		return nil, err
	}
	return canonical(o)
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
// 32 bytes are the task's action hash; the RP ID hash matches the origin's
// host; user presence and verification are set; and the signature over
// authenticatorData ‖ SHA-256(clientDataJSON) verifies with the recorded
// COSE public key.
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
