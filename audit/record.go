package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gowebpki/jcs"
)

// RecordVersion is the layout of [Record].
const RecordVersion = 1

// MetaKey is the _meta key under which a completed task's result carries
// its [Receipt].
const MetaKey = "io.countersign/audit"

// Step kinds.
const (
	KindRequested   = "requested"
	KindNotified    = "notified"
	KindNotifyFail  = "notify-failed"
	KindDecision    = "decision"
	KindReevaluated = "reevaluated"
	KindClaimed     = "claimed"
	// KindCancelRefused records a cancel that arrived once the call was
	// claimed and was refused: the call goes on. Its body is empty. It is
	// not a cancel, and may stand anywhere between "requested" and the end.
	KindCancelRefused = "cancel-refused"
	// Terminal kinds: exactly one per sealed chain, right before the outcome.
	KindExecuted       = "executed"
	KindExecutionError = "execution-error"
	KindOutcomeUnknown = "outcome-unknown"
	KindDenied         = "denied"
	KindExpired        = "expired"
	KindCancelled      = "cancelled"
	KindFailed         = "failed"
	// KindOutcome is the last record of a sealed chain.
	KindOutcome = "outcome"
)

// Step IDs of the steps that happen once per task.
const (
	StepRequested = "requested"
	StepEnd       = "end"
	StepOutcome   = "outcome"
)

// terminalKinds maps each terminal kind to the status and disposition it
// must carry, and whether it follows an execution claim.
var terminalKinds = map[string]terminalKind{
	KindExecuted:       {"completed", "approved-executed", true},
	KindExecutionError: {"completed", "execution-error", true},
	KindOutcomeUnknown: {"completed", "outcome-unknown", true},
	KindDenied:         {"completed", "denied-not-executed", false},
	KindExpired:        {"completed", "denied-not-executed", false},
	KindCancelled:      {"cancelled", "", false},
	KindFailed:         {"failed", "", false},
}

// terminalKind is what a terminal step must carry.
type terminalKind struct {
	status, disposition string
	executed            bool // the tool was called: a claim and quorum are required
}

// IsTerminalKind reports whether kind ends a task.
func IsTerminalKind(kind string) bool { _, ok := terminalKinds[kind]; return ok }

// Record is one audit record. Its wire form is the JCS canonical JSON of
// this struct; see the package documentation.
type Record struct {
	Version int             `json:"v"`
	TaskID  string          `json:"taskId"`
	Seq     int             `json:"seq"`
	Kind    string          `json:"kind"`
	StepID  string          `json:"stepId"`
	At      time.Time       `json:"at"`
	Prev    string          `json:"prev"`
	KeyID   string          `json:"keyId"`
	Body    json.RawMessage `json:"body"`
	Sig     string          `json:"sig,omitempty"`
}

// Envelope is the held call as recorded. With redaction, Arguments is
// absent and only ArgumentsDigest (SHA-256 of the JCS arguments, hex) binds
// them.
type Envelope struct {
	Tool            string          `json:"tool"`
	Arguments       json.RawMessage `json:"arguments,omitempty"`
	ArgumentsDigest string          `json:"argumentsDigest"`
	Redacted        bool            `json:"redacted,omitempty"`
	ActionHash      string          `json:"actionHash"`
	Principal       string          `json:"principal"`
	Resource        string          `json:"resource"`
	ServerID        string          `json:"serverId"`
	CreatedAt       time.Time       `json:"createdAt"`
}

// Requirement is what policy demanded at request time.
type Requirement struct {
	Group              string `json:"group"`
	Quorum             int    `json:"quorum"`
	TTLSeconds         int64  `json:"ttlSeconds"`
	AuthenticatorClass string `json:"authenticatorClass"`
	Reason             string `json:"reason"`
}

// Requested is the body of the "requested" record.
type Requested struct {
	Envelope      Envelope    `json:"envelope"`
	PolicyVersion string      `json:"policyVersion"`
	Requirement   Requirement `json:"requirement"`
	ApprovalRef   string      `json:"approvalRef"`
	DisplayText   string      `json:"displayText"`
	ExpiresAt     time.Time   `json:"expiresAt"`
}

// Approval is one accepted approver decision with the raw WebAuthn
// assertion that carried it. Challenge is the base64url challenge the
// authenticator signed (nonce ‖ action hash; the nonce bound to Decision,
// canon.DecisionNonce, for challenges issued since nonces were bound);
// PublicKey is the credential's COSE key. Byte fields are base64
// (standard) in JSON.
type Approval struct {
	Decision          string    `json:"decision"`
	ApproverID        string    `json:"approverId"`
	ApproverName      string    `json:"approverName"`
	CredentialID      string    `json:"credentialId"`
	PublicKey         []byte    `json:"publicKey"`
	ChallengeID       string    `json:"challengeId"`
	Challenge         string    `json:"challenge"`
	AuthenticatorData []byte    `json:"authenticatorData"`
	ClientDataJSON    []byte    `json:"clientDataJSON"`
	Signature         []byte    `json:"signature"`
	SignCount         uint32    `json:"signCount"`
	Comment           string    `json:"comment,omitempty"`
	At                time.Time `json:"at"`
}

// Decision is the body of a "decision" record: an accepted decision with
// its assertion, or a rejected one with its reason (the evidence of a
// rejected decision is not kept).
type Decision struct {
	Decision    string    `json:"decision"`
	Accepted    bool      `json:"accepted"`
	Reason      string    `json:"reason,omitempty"`
	ChallengeID string    `json:"challengeId,omitempty"`
	Approval    *Approval `json:"approval,omitempty"`
	// Unsigned is a deny another channel authenticated without a passkey:
	// it can only stop a call, never count toward a quorum.
	Unsigned *Unsigned `json:"unsigned,omitempty"`
}

// Unsigned names who denied without a passkey, and through which channel.
type Unsigned struct {
	ApproverID   string `json:"approverId"`
	ApproverName string `json:"approverName"`
	Via          string `json:"via"`
	Comment      string `json:"comment,omitempty"`
}

// Policy is the body of "reevaluated" and "claimed" records.
type Policy struct {
	Allow         bool   `json:"allow"`
	Effect        string `json:"effect,omitempty"`
	Reason        string `json:"reason,omitempty"`
	PolicyVersion string `json:"policyVersion"`
}

// Ended is the body of a terminal record.
type Ended struct {
	Status       string `json:"status"`
	Disposition  string `json:"disposition,omitempty"`
	Detail       string `json:"detail,omitempty"`
	ResultDigest string `json:"resultDigest,omitempty"`
}

// Outcome is the body of the "outcome" record: everything an auditor needs
// about the task in one signed object. [BuildOutcome] derives it from the
// chain, and the verifier derives it again and compares.
type Outcome struct {
	TaskID                   string      `json:"taskId"`
	Envelope                 Envelope    `json:"envelope"`
	Requirement              Requirement `json:"requirement"`
	PolicyVersionAtRequest   string      `json:"policyVersionAtRequest"`
	PolicyVersionAtExecution string      `json:"policyVersionAtExecution,omitempty"`
	Approvals                []Approval  `json:"approvals"`
	Status                   string      `json:"status"`
	Disposition              string      `json:"disposition,omitempty"`
	ResultDigest             string      `json:"resultDigest,omitempty"`
	RequestedAt              time.Time   `json:"requestedAt"`
	ClaimedAt                *time.Time  `json:"claimedAt,omitempty"`
	EndedAt                  time.Time   `json:"endedAt"`
	Steps                    int         `json:"steps"`
	// Chain is the hash of the terminal record: the outcome commits to the
	// whole chain before it.
	Chain string `json:"chain"`
}

// Receipt is what a completed task's result carries under [MetaKey].
type Receipt struct {
	RecordRef string `json:"recordRef"` // <taskId>/<seq>
	Hash      string `json:"hash"`      // hex SHA-256 of the canonical record
	Signature string `json:"signature"` // the record's sig
	KeyID     string `json:"keyId"`
}

// canonical returns the JCS form of v.
func canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(b)
}

// Hash is the hex SHA-256 of a canonical record line.
func Hash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// seal signs r with k and returns its canonical line.
func seal(r Record, k *Keyring) ([]byte, Record, error) {
	r.Version = RecordVersion
	r.Sig = ""
	r.KeyID = k.CurrentID()
	unsigned, err := canonical(r)
	if err != nil {
		return nil, r, fmt.Errorf("audit: encode record: %w", err)
	}
	// Signed with the key the record names, even if another became
	// current meanwhile (a keyring never drops a key).
	sig := k.signWith(r.KeyID, unsigned)
	r.Sig = base64.RawURLEncoding.EncodeToString(sig)
	if line, ok := withSig(unsigned, r.Sig); ok {
		return line, r, nil
	}
	line, err := canonical(r)
	if err != nil {
		return nil, r, err
	}
	return line, r, nil
}

// withSig returns the canonical line of a record from the canonical line
// of the same record unsigned: JCS orders the top-level keys "seq", "sig",
// "stepId", and a signature is base64url, which JSON never escapes, so the
// signed line is the unsigned one with `"sig":"…",` before the top-level
// "stepId". That key is the last `,"stepId":` in the line: inside a string
// a quote is escaped, so those bytes only ever begin a key, and every
// value after the top-level one is a scalar (the task ID, the version).
// It saves encoding and canonicalizing each record a second time.
// (A line without the key, which seal never makes, reports false.)
func withSig(unsigned []byte, sig string) ([]byte, bool) {
	i := bytes.LastIndex(unsigned, []byte(`,"stepId":`))
	if i < 0 {
		return nil, false
	}
	line := make([]byte, 0, len(unsigned)+len(sig)+len(`,"sig":""`))
	line = append(line, unsigned[:i]...)
	line = append(line, `,"sig":"`...)
	line = append(line, sig...)
	line = append(line, '"')
	return append(line, unsigned[i:]...), true
}

// Errors of [ParseRecord].
var (
	ErrNotCanonical = errors.New("audit: record is not in canonical (JCS) form")
	ErrBadSignature = errors.New("audit: signature does not verify")
	ErrUnknownKey   = errors.New("audit: record signed by an unknown key")
)

// ParseRecord checks one line: canonical JSON, the known fields only, a
// signature by one of keys (matched by key ID). It returns the record and
// its hash.
func ParseRecord(line []byte, keys map[string]ed25519.PublicKey) (Record, string, error) {
	return recordParser{keys: keys}.parse(line)
}

// recordParser checks lines as [ParseRecord] does; with skipSigs, a
// record's signature is checked for its form only (a key ID and an
// Ed25519-sized signature), not verified.
type recordParser struct {
	keys     map[string]ed25519.PublicKey
	skipSigs bool
}

func newRecordParser(pubkeys []ed25519.PublicKey, skipSigs bool) recordParser {
	keys := make(map[string]ed25519.PublicKey, len(pubkeys))
	for _, k := range pubkeys {
		keys[KeyID(k)] = k
	}
	return recordParser{keys: keys, skipSigs: skipSigs}
}

func (p recordParser) parse(line []byte) (Record, string, error) {
	var r Record
	c, err := jcs.Transform(line)
	if err != nil {
		return r, "", fmt.Errorf("audit: record is not JSON: %w", err)
	}
	if string(c) != string(line) {
		return r, "", ErrNotCanonical
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return r, "", fmt.Errorf("audit: record is not a JSON object: %w", err)
	}
	if err := strictUnmarshal(line, &r); err != nil {
		return r, "", fmt.Errorf("audit: record: %w", err)
	}
	// The struct must say exactly what the line says (no field the struct
	// drops, no case-folded names).
	if again, err := canonical(r); err != nil || string(again) != string(line) {
		return r, "", ErrNotCanonical
	}
	if r.Version != RecordVersion {
		return r, "", fmt.Errorf("audit: record version %d, want %d", r.Version, RecordVersion)
	}
	sig, sigErr := base64.RawURLEncoding.DecodeString(r.Sig)
	if p.skipSigs {
		if !validKeyID(r.KeyID) || sigErr != nil || len(sig) != ed25519.SignatureSize {
			return r, "", errUnsigned
		}
		return r, Hash(line), nil
	}
	pub, ok := p.keys[r.KeyID]
	if !ok {
		return r, "", fmt.Errorf("%w %q", ErrUnknownKey, r.KeyID)
	}
	if sigErr != nil || len(sig) != ed25519.SignatureSize {
		return r, "", ErrBadSignature
	}
	u := r
	u.Sig = ""
	unsigned, err := canonical(u)
	if err != nil || !ed25519.Verify(pub, unsigned, sig) {
		return r, "", ErrBadSignature
	}
	return r, Hash(line), nil
}

// errUnsigned: a record checked without keys lacks a well-formed key ID or
// signature.
var errUnsigned = errors.New("audit: record carries no well-formed key ID and Ed25519 signature")

// validKeyID reports whether id has the form [KeyID] gives.
func validKeyID(id string) bool {
	h, ok := strings.CutPrefix(id, "ed25519-")
	if !ok || len(h) != 32 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytesReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

// BuildOutcome derives the outcome body from a chain that ends with its
// terminal record (the outcome itself excluded). The server writes what it
// returns; the verifier recomputes and compares.
func BuildOutcome(chain []Record, hashes []string) (Outcome, error) {
	if len(chain) == 0 || chain[0].Kind != KindRequested {
		return Outcome{}, errors.New("audit: chain does not start with a requested record")
	}
	last := chain[len(chain)-1]
	if !IsTerminalKind(last.Kind) {
		return Outcome{}, errors.New("audit: chain does not end with a terminal record")
	}
	var req Requested
	if err := json.Unmarshal(chain[0].Body, &req); err != nil {
		return Outcome{}, fmt.Errorf("audit: requested body: %w", err)
	}
	var end Ended
	if err := json.Unmarshal(last.Body, &end); err != nil {
		return Outcome{}, fmt.Errorf("audit: terminal body: %w", err)
	}
	o := Outcome{
		TaskID:                 chain[0].TaskID,
		Envelope:               req.Envelope,
		Requirement:            req.Requirement,
		PolicyVersionAtRequest: req.PolicyVersion,
		Approvals:              []Approval{},
		Status:                 end.Status,
		Disposition:            end.Disposition,
		ResultDigest:           end.ResultDigest,
		RequestedAt:            chain[0].At,
		EndedAt:                last.At,
		Steps:                  len(chain),
		Chain:                  hashes[len(hashes)-1],
	}
	for _, r := range chain[1 : len(chain)-1] {
		switch r.Kind {
		case KindDecision:
			var d Decision
			if err := json.Unmarshal(r.Body, &d); err != nil {
				return Outcome{}, fmt.Errorf("audit: decision body: %w", err)
			}
			if d.Accepted && d.Approval != nil {
				o.Approvals = append(o.Approvals, *d.Approval)
			}
		case KindClaimed:
			var p Policy
			if err := json.Unmarshal(r.Body, &p); err != nil {
				return Outcome{}, fmt.Errorf("audit: claimed body: %w", err)
			}
			o.PolicyVersionAtExecution = p.PolicyVersion
			at := r.At
			o.ClaimedAt = &at
		}
	}
	return o, nil
}

// NewEnvelope records a held call; with redact, the arguments are replaced
// by their digest.
func NewEnvelope(tool string, args json.RawMessage, actionHash, principal, resource, serverID string, createdAt time.Time, redact bool) (Envelope, error) {
	c, err := jcs.Transform(orEmpty(args))
	if err != nil {
		return Envelope{}, fmt.Errorf("audit: arguments: %w", err)
	}
	d := sha256.Sum256(c)
	e := Envelope{
		Tool: tool, ArgumentsDigest: hex.EncodeToString(d[:]), ActionHash: actionHash,
		Principal: principal, Resource: resource, ServerID: serverID, CreatedAt: createdAt.UTC(),
	}
	if redact {
		e.Redacted = true
	} else {
		e.Arguments = c
	}
	return e, nil
}

func orEmpty(b []byte) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	return b
}

// Digest is the hex SHA-256 of the JCS form of v (a tool result).
func Digest(v any) (string, error) {
	c, err := canonical(v)
	if err != nil {
		return "", err
	}
	d := sha256.Sum256(c)
	return hex.EncodeToString(d[:]), nil
}
