package devtest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/internal/testpasskey"
)

// Approver is a person with a software passkey.
type Approver struct {
	Name string
	ID   string
	Auth virtualwebauthn.Authenticator
	Cred virtualwebauthn.Credential
	RP   virtualwebauthn.RelyingParty
}

// Enroll adds an approver in groups through the admin API and enrolls a
// software passkey for them through the approver API.
func (s *Stack) Enroll(name string, groups ...string) *Approver {
	s.T.Helper()
	var added struct {
		ApproverID string `json:"approverId"`
		EnrollURL  string `json:"enrollUrl"`
	}
	if code := s.HTTPJSON("POST", "/admin/v1/approvers", s.AdminToken, map[string]any{"name": name, "groups": groups}, &added); code != 200 && code != 201 {
		s.T.Fatalf("add approver: HTTP %d", code)
	}
	token := added.EnrollURL[strings.LastIndexByte(added.EnrollURL, '/')+1:]
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	if code := s.HTTPJSON("POST", "/approver/v1/enrollments/"+token+"/begin", "", struct{}{}, &begin); code != 200 {
		s.T.Fatalf("enroll begin: HTTP %d", code)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		s.T.Fatalf("parse creation options: %v", err)
	}
	a := &Approver{Name: name, ID: added.ApproverID, RP: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: s.Base}}
	// ParseAttestationOptions has already decoded user.id.
	a.Auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	a.Cred = testpasskey.NewEC2Credential()
	a.Auth.AddCredential(a.Cred)
	resp := virtualwebauthn.CreateAttestationResponse(a.RP, a.Auth, a.Cred, *opts)
	var fin struct {
		CredentialID string `json:"credentialId"`
	}
	if code := s.HTTPJSON("POST", "/approver/v1/enrollments/"+token+"/finish", "", map[string]any{"response": json.RawMessage(resp)}, &fin); code != 200 && code != 201 {
		s.T.Fatalf("enroll finish: HTTP %d", code)
	}
	return a
}

// Challenge is the approver API's answer to a challenge request.
type Challenge struct {
	ChallengeID    string          `json:"challengeId"`
	DisplayText    string          `json:"displayText"`
	RequestOptions json.RawMessage `json:"requestOptions"`
}

// DecisionResult is the approver API's answer to a decision.
type DecisionResult struct {
	Accepted bool   `json:"accepted"`
	Reason   string `json:"reason"`
	Status   string `json:"status"`
	Approved int    `json:"approved"`
	Needed   int    `json:"needed"`
	Error    string `json:"error"`
}

// Challenge asks for a challenge to decide ref; anything but 200 or 201
// fails the test.
func (s *Stack) Challenge(ref, decision string) Challenge {
	s.T.Helper()
	var c Challenge
	if code := s.HTTPJSON("POST", "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": decision}, &c); code != 200 && code != 201 {
		s.T.Fatalf("challenge for %s: HTTP %d", ref, code)
	}
	return c
}

// Sign makes the approver's assertion over a challenge.
func (a *Approver) Sign(t testing.TB, c Challenge) json.RawMessage {
	t.Helper()
	opts, err := virtualwebauthn.ParseAssertionOptions(string(c.RequestOptions))
	if err != nil {
		t.Fatalf("parse request options: %v", err)
	}
	a.Cred.Counter++
	a.Auth.Credentials[0].Counter = a.Cred.Counter
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(a.RP, a.Auth, a.Cred, *opts))
}

// Decide posts a decision with the assertion resp over challenge c.
func (s *Stack) Decide(ref string, c Challenge, decision string, resp json.RawMessage) DecisionResult {
	s.T.Helper()
	var r DecisionResult
	s.HTTPJSON("POST", "/approver/v1/approvals/"+ref+"/decision", "", map[string]any{
		"challengeId": c.ChallengeID, "decision": decision, "response": resp,
	}, &r)
	return r
}

// Approve runs the whole ceremony: challenge, sign, decide.
func (s *Stack) Approve(a *Approver, ref, decision string) DecisionResult {
	s.T.Helper()
	c := s.Challenge(ref, decision)
	return s.Decide(ref, c, decision, a.Sign(s.T, c))
}
