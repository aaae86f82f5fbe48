package bench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/internal/testpasskey"
)

// approver is an approver the run enrolled, with a software passkey. One
// goroutine uses it at a time: the signature counter must rise in the order
// the server sees the assertions.
type approver struct {
	id   string
	rp   virtualwebauthn.RelyingParty
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

// enrollApprover adds an approver in group through the admin API and
// enrolls a software passkey for them through the approver API, as the
// enrollment page does.
func (c *benchClient) enrollApprover(ctx context.Context, name, group string) (*approver, error) {
	var added struct {
		ApproverID string `json:"approverId"`
		EnrollURL  string `json:"enrollUrl"`
	}
	if err := c.api(ctx, http.MethodPost, "/admin/v1/approvers", c.admin, map[string]any{"name": name, "groups": []string{group}}, &added); err != nil {
		return nil, fmt.Errorf("add approver %s: %w", name, err)
	}
	u, err := url.Parse(added.EnrollURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("add approver %s: enroll URL %q", name, added.EnrollURL)
	}
	token := added.EnrollURL[strings.LastIndexByte(added.EnrollURL, '/')+1:]
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	if err := c.api(ctx, http.MethodPost, "/approver/v1/enrollments/"+token+"/begin", "", struct{}{}, &begin); err != nil {
		return nil, fmt.Errorf("enroll %s: %w", name, err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		return nil, fmt.Errorf("enroll %s: creation options: %w", name, err)
	}
	// The approver site's origin is the public URL the enroll link names.
	a := &approver{id: added.ApproverID, rp: virtualwebauthn.RelyingParty{ID: opts.RelyingPartyID, Name: opts.RelyingPartyName, Origin: u.Scheme + "://" + u.Host}}
	a.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	a.cred = testpasskey.NewEC2Credential()
	a.auth.AddCredential(a.cred)
	resp := virtualwebauthn.CreateAttestationResponse(a.rp, a.auth, a.cred, *opts)
	if err := c.api(ctx, http.MethodPost, "/approver/v1/enrollments/"+token+"/finish", "", map[string]any{"response": json.RawMessage(resp)}, nil); err != nil {
		return nil, fmt.Errorf("enroll %s: finish: %w", name, err)
	}
	return a, nil
}

// sign makes the approver's assertion over request options.
func (a *approver) sign(requestOptions json.RawMessage) (json.RawMessage, error) {
	opts, err := virtualwebauthn.ParseAssertionOptions(string(requestOptions))
	if err != nil {
		return nil, fmt.Errorf("request options: %w", err)
	}
	a.cred.Counter++
	a.auth.Credentials[0].Counter = a.cred.Counter
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(a.rp, a.auth, a.cred, *opts)), nil
}

// inBandSigner is an agent's passkey enrolled in-band (SEP-2672,
// approval/enroll/*), for one worker.
type inBandSigner struct {
	rp   virtualwebauthn.RelyingParty
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

// enrollInBand enrolls a passkey for the agent through the MCP endpoint,
// from a client page at origin.
func (c *benchClient) enrollInBand(ctx context.Context, token, origin string) (*inBandSigner, error) {
	res, err := c.rpc(ctx, token, "approval/enroll/begin", "", nil, false)
	if err != nil {
		return nil, fmt.Errorf("approval/enroll/begin: %w", err)
	}
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	if err := json.Unmarshal(res, &begin); err != nil {
		return nil, fmt.Errorf("approval/enroll/begin: %s", res)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		return nil, fmt.Errorf("approval/enroll/begin options: %w", err)
	}
	s := &inBandSigner{rp: virtualwebauthn.RelyingParty{ID: opts.RelyingPartyID, Name: opts.RelyingPartyName, Origin: origin}}
	s.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	s.cred = testpasskey.NewEC2Credential()
	var att map[string]any
	if err := json.Unmarshal([]byte(virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, s.cred, *opts)), &att); err != nil {
		return nil, err
	}
	// A cross-platform authenticator (a phone over hybrid, or a key), as
	// place_trade's policy asks.
	att["response"].(map[string]any)["transports"] = []string{"hybrid", "internal"}
	if _, err := c.rpc(ctx, token, "approval/enroll/finish", "", map[string]any{"response": att}, false); err != nil {
		return nil, fmt.Errorf("approval/enroll/finish (is %s among the server's --verified-origins?): %w", origin, err)
	}
	s.auth.AddCredential(s.cred)
	return s, nil
}

// ceremony runs one SEP-2672 in-band ceremony for args: the challenge, then
// the signed call. It records the challenge and the call on p, and reports
// whether both succeeded.
func (c *benchClient) ceremony(ctx context.Context, p *phase, token string, s *inBandSigner, args map[string]any) bool {
	var env struct {
		ChallengeID    string `json:"challengeId"`
		RequestOptions struct {
			Challenge string `json:"challenge"`
			RPID      string `json:"rpId"`
		} `json:"requestOptions"`
	}
	if err := timed(p, "sep2672-challenge", func() error {
		res, err := c.rpc(ctx, token, "approval/challenge/create", "", map[string]any{"toolName": "place_trade", "arguments": args}, false)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(res, &env); err != nil || env.ChallengeID == "" {
			return unexpectedError{"challenge", string(res)}
		}
		return nil
	}); err != nil {
		return false
	}
	challenge, err := base64.RawURLEncoding.DecodeString(env.RequestOptions.Challenge)
	if err != nil {
		p.fail("sep2672-call", unexpectedError{"challenge", env.RequestOptions.Challenge})
		return false
	}
	s.cred.Counter++
	s.auth.Credentials[0].Counter = s.cred.Counter
	var assertion map[string]any
	if err := json.Unmarshal([]byte(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, s.cred,
		virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: env.RequestOptions.RPID})), &assertion); err != nil {
		p.fail("sep2672-call", err)
		return false
	}
	meta := map[string]any{"io.modelcontextprotocol/verified-approval": map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": assertion}}
	return timed(p, "sep2672-call", func() error {
		res, err := c.callTool(ctx, token, "place_trade", args, meta, false)
		if err != nil {
			return err
		}
		var r struct {
			IsError bool           `json:"isError"`
			Meta    map[string]any `json:"_meta"`
		}
		if err := json.Unmarshal(res, &r); err != nil || r.IsError {
			return unexpectedError{"not-executed", string(res)}
		}
		return nil
	}) == nil
}
