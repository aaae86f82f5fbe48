package audit

import (
	"fmt"
	"time"

	"github.com/countersign/countersign/internal/canon"
)

// Transaction-token chains. A single-use transaction token (package
// txtoken) has a chain of its own, named by its jti ("txt_…"): it starts
// with "token-issued" and may hold "token-rejected" records (a verified
// token refused: another principal, another tool, changed parameters,
// expired, already used), at most one "token-consumed" (the jti was taken:
// the call runs now) and, after it, at most one "token-result" (what the
// run returned). A token that never verified (malformed, foreign key, bad
// signature) has no trusted jti: its rejection is a chain of one
// "token-rejected" record of its own ("txr_…"). Token chains have no
// outcome record: a token expires within a minute, and every record is
// final when written.
const (
	KindTokenIssued   = "token-issued"
	KindTokenRejected = "token-rejected"
	KindTokenConsumed = "token-consumed"
	KindTokenResult   = "token-result"
)

// A token lives at most TokenMaxLifetime (exp - iat), and its use is
// checked with a clock skew of at most TokenMaxSkew: package txtoken's
// MaxLifetime and MaxSkew are these.
const (
	TokenMaxLifetime = 60 * time.Second
	TokenMaxSkew     = 30 * time.Second
)

// Step IDs of a token chain's once-only steps.
const (
	StepTokenIssued   = "issued"
	StepTokenConsumed = "consumed"
	StepTokenResult   = "result"
)

// RuleToken: a token chain follows its grammar (issued first; rejections;
// one consumption; one result after it), the token lives at most
// [TokenMaxLifetime], and the consumption is of the issued binding,
// within the token's lifetime give or take [TokenMaxSkew].
const RuleToken = "token-chain"

// IsTokenChainStart reports whether kind may open a token chain.
func IsTokenChainStart(kind string) bool {
	return kind == KindTokenIssued || kind == KindTokenRejected
}

// TokenIssued is the body of "token-issued": who may use the token, for
// which exact call, until when, and who asked for it.
type TokenIssued struct {
	JTI           string    `json:"jti"`
	KeyID         string    `json:"keyId"`
	Envelope      Envelope  `json:"envelope"`
	IssuedBy      string    `json:"issuedBy"` // "agent:<name>" or "admin:<name>"
	PolicyVersion string    `json:"policyVersion,omitempty"`
	IssuedAt      time.Time `json:"issuedAt"`
	ExpiresAt     time.Time `json:"expiresAt"`
}

// TokenRejected is the body of "token-rejected": the RFC error type, the
// specific reason, and the call it was presented with.
type TokenRejected struct {
	JTI        string    `json:"jti,omitempty"` // set only for a verified token
	ErrorType  string    `json:"errorType"`
	Reason     string    `json:"reason"`
	Principal  string    `json:"principal"`
	Tool       string    `json:"tool"`
	ActionHash string    `json:"actionHash"`
	At         time.Time `json:"at"`
}

// TokenConsumed is the body of "token-consumed": the jti was taken for
// this call, which runs next.
type TokenConsumed struct {
	JTI        string    `json:"jti"`
	Principal  string    `json:"principal"`
	Tool       string    `json:"tool"`
	ActionHash string    `json:"actionHash"`
	At         time.Time `json:"at"`
}

// TokenResult is the body of "token-result": what the one run returned.
type TokenResult struct {
	Disposition  string    `json:"disposition"`
	ResultDigest string    `json:"resultDigest,omitempty"`
	At           time.Time `json:"at"`
}

// verifyTokenChain checks a token chain (recs[0] opens one) by RuleToken.
// Links and step uniqueness are checked by the caller.
func verifyTokenChain(recs []Record, fail func(rule string, at int, format string, args ...any), v *TaskVerdict) {
	v.Complete = true
	if recs[0].Kind == KindTokenRejected {
		var rj TokenRejected
		if err := strictUnmarshal(recs[0].Body, &rj); err != nil {
			fail(RuleRecordBody, 0, "token-rejected body: %v", err)
		}
		if len(recs) != 1 {
			fail(RuleToken, 1, "a rejection of an unverified token is a chain of one record")
		}
		v.Status, v.Disposition = "rejected", "denied-not-executed"
		return
	}
	var iss TokenIssued
	if err := strictUnmarshal(recs[0].Body, &iss); err != nil {
		fail(RuleRecordBody, 0, "token-issued body: %v", err)
		return
	}
	h, err := canon.ParseActionHash(iss.Envelope.ActionHash)
	if err != nil {
		fail(RuleToken, 0, "%v", err)
		return
	}
	checkEnvelope(iss.Envelope, h, func(format string, args ...any) { fail(RuleToken, 0, format, args...) }, v)
	if iss.JTI != recs[0].TaskID {
		fail(RuleToken, 0, "jti %q is not the chain's %q", iss.JTI, recs[0].TaskID)
	}
	if life := iss.ExpiresAt.Sub(iss.IssuedAt); life <= 0 || life > TokenMaxLifetime {
		fail(RuleToken, 0, "expires at %v, %v after its issuance: a token lives more than 0 and at most %v", iss.ExpiresAt, life, TokenMaxLifetime)
	}
	v.Status = "issued"
	consumedAt, resultAt := -1, -1
	for i := 1; i < len(recs); i++ {
		r := recs[i]
		switch r.Kind {
		case KindTokenRejected:
			var rj TokenRejected
			if err := strictUnmarshal(r.Body, &rj); err != nil {
				fail(RuleRecordBody, i, "token-rejected body: %v", err)
			} else if rj.JTI != iss.JTI {
				fail(RuleToken, i, "rejection of jti %q in the chain of %q", rj.JTI, iss.JTI)
			}
		case KindTokenConsumed:
			var c TokenConsumed
			if err := strictUnmarshal(r.Body, &c); err != nil {
				fail(RuleRecordBody, i, "token-consumed body: %v", err)
				continue
			}
			if consumedAt >= 0 {
				fail(RuleToken, i, "consumed twice (first at record %d)", consumedAt)
				continue
			}
			consumedAt = i
			if c.JTI != iss.JTI || c.Principal != iss.Envelope.Principal || c.Tool != iss.Envelope.Tool || c.ActionHash != iss.Envelope.ActionHash {
				fail(RuleToken, i, "consumed for %s/%s/%s, issued for %s/%s/%s", c.Principal, c.Tool, c.ActionHash, iss.Envelope.Principal, iss.Envelope.Tool, iss.Envelope.ActionHash)
			}
			if c.At.Before(iss.IssuedAt.Add(-TokenMaxSkew)) || c.At.After(iss.ExpiresAt.Add(TokenMaxSkew)) {
				fail(RuleToken, i, "consumed at %v, outside the token's lifetime (%v to %v, give or take %v of clock skew)",
					c.At, iss.IssuedAt, iss.ExpiresAt, TokenMaxSkew)
			}
			v.Status = "consumed"
		case KindTokenResult:
			var res TokenResult
			if err := strictUnmarshal(r.Body, &res); err != nil {
				fail(RuleRecordBody, i, "token-result body: %v", err)
				continue
			}
			switch {
			case consumedAt < 0:
				fail(RuleToken, i, "a result without a consumption: the call ran without taking the token")
			case resultAt >= 0:
				fail(RuleToken, i, "second result (first at record %d)", resultAt)
			}
			resultAt = i
			v.Disposition = res.Disposition
		default:
			fail(RuleUnknownKind, i, "kind %q in a token chain", r.Kind)
		}
	}
	if consumedAt >= 0 && resultAt < 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("token %s consumed without a result: the process stopped during the call (outcome unknown; it ran at most once)", iss.JTI))
	}
}
