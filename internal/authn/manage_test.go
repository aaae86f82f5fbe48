package authn

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/testnats"
)

func openTokens(t *testing.T) *Tokens {
	t.Helper()
	js, _ := testnats.Start(t)
	tok, err := Open(context.Background(), js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAgentStatus(t *testing.T) {
	tok := openTokens(t)
	ctx := context.Background()
	agent, err := tok.Issue(ctx, "billing-bot", KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Issue(ctx, "other", KindAgent); err != nil {
		t.Fatal(err)
	}
	step := func(action, wantStatus string, wantChanged bool) Change {
		t.Helper()
		p, ch, err := tok.SetAgentStatus(ctx, "billing-bot", action)
		if err != nil || ch.Changed != wantChanged || ch.Status != wantStatus || p.Status() != wantStatus || ch.Revision == 0 {
			t.Fatalf("%s: %+v %+v %v; want %s changed=%t", action, p, ch, err, wantStatus, wantChanged)
		}
		_, lerr := tok.Agent(ctx, agent)
		if active := wantStatus == StatusActive; active != (lerr == nil) {
			t.Fatalf("after %s: lookup %v", action, lerr)
		}
		// A disabled agent's token is told so (ErrDisabled, an
		// ErrInvalidToken); a revoked one only that it is invalid.
		if lerr != nil && (!errors.Is(lerr, ErrInvalidToken) || errors.Is(lerr, ErrDisabled) != (wantStatus == StatusDisabled)) {
			t.Fatalf("after %s: lookup %v", action, lerr)
		}
		return ch
	}
	step(ActionDisable, StatusDisabled, true)
	step(ActionDisable, StatusDisabled, false)
	step(ActionEnable, StatusActive, true)
	step(ActionEnable, StatusActive, false)
	first := step(ActionRevoke, StatusRevoked, true)
	again := step(ActionRevoke, StatusRevoked, false)
	if !again.At.Equal(first.At) || again.Revision != first.Revision {
		t.Fatalf("second revoke %+v, first %+v", again, first)
	}
	for _, a := range []string{ActionEnable, ActionDisable} {
		if _, _, err := tok.SetAgentStatus(ctx, "billing-bot", a); !errors.Is(err, ErrRevoked) {
			t.Fatalf("%s revoked: %v", a, err)
		}
	}
	// The name stays taken: its tasks belong to it.
	if _, err := tok.Issue(ctx, "billing-bot", KindAgent); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("reuse revoked name: %v", err)
	}
	for _, name := range []string{"nobody", "a/b", ""} {
		if _, _, err := tok.SetAgentStatus(ctx, name, ActionRevoke); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%q: %v", name, err)
		}
	}
	if _, _, err := tok.SetAgentStatus(ctx, "other", "delete"); err == nil {
		t.Fatal("unknown action accepted")
	}
	agents, err := tok.Agents(ctx)
	if err != nil || len(agents) != 2 || agents[0].Name != "billing-bot" || agents[0].Status() != StatusRevoked || agents[1].Status() != StatusActive {
		t.Fatalf("Agents: %+v %v", agents, err)
	}
}

// A disabled admin token fails the one admin gate with ErrInvalidToken.
func TestAuthorizeAdminInactive(t *testing.T) {
	tok := openTokens(t)
	ctx := context.Background()
	admin, ch, err := tok.InitAdmin(ctx, "admin", false)
	if err != nil || !ch.Changed || ch.Fingerprint != Fingerprint(admin) {
		t.Fatalf("InitAdmin: %+v %v", ch, err)
	}
	r := httptest.NewRequest("GET", "/admin/v1/agents", nil)
	r.Header.Set("Authorization", "Bearer "+admin)
	if err := tok.AuthorizeAdmin(r); err != nil {
		t.Fatal(err)
	}
	d := digest(admin)
	if _, _, err := tok.setStatus(ctx, "t."+d, ActionDisable, ch.At); err != nil {
		t.Fatal(err)
	}
	if err := tok.AuthorizeAdmin(r); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("disabled admin: %v", err)
	}
	// At /mcp an admin token is no agent's, disabled or not.
	if _, err := tok.Agent(ctx, admin); !errors.Is(err, ErrInvalidToken) || errors.Is(err, ErrDisabled) {
		t.Fatalf("disabled admin as agent: %v", err)
	}
}

func TestInitAdmin(t *testing.T) {
	tok := openTokens(t)
	ctx := context.Background()
	first, _, err := tok.InitAdmin(ctx, "admin", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tok.InitAdmin(ctx, "someone-else", false); !errors.Is(err, ErrAdminExists) {
		t.Fatalf("second init: %v", err)
	}
	if !tok.IsAdmin(ctx, first) {
		t.Fatal("refused init changed the first token")
	}
	second, ch, err := tok.InitAdmin(ctx, "admin", true)
	if err != nil || !ch.Changed || ch.Replaced != Fingerprint(first) {
		t.Fatalf("rotate: %+v %v", ch, err)
	}
	if tok.IsAdmin(ctx, first) || !tok.IsAdmin(ctx, second) {
		t.Fatal("rotation did not replace the token")
	}
	admins, err := tok.Admins(ctx)
	if err != nil || len(admins) != 2 || admins[0].Status() != StatusRevoked || admins[1].Status() != StatusActive {
		t.Fatalf("Admins: %+v %v", admins, err)
	}
	if _, _, err := tok.InitAdmin(ctx, "bad name", true); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
}

// RegisterAdmin is what every replica runs at start with the same secret:
// idempotent; a new secret rotates; the old secret never comes back.
func TestRegisterAdmin(t *testing.T) {
	tok := openTokens(t)
	ctx := context.Background()
	secret := NewToken(KindAdmin)
	ch, err := tok.RegisterAdmin(ctx, secret, "admin")
	if err != nil || !ch.Changed || ch.Replaced != "" {
		t.Fatalf("first: %+v %v", ch, err)
	}
	again, err := tok.RegisterAdmin(ctx, secret, "admin")
	if err != nil || again.Changed || again.Revision != ch.Revision {
		t.Fatalf("second replica: %+v %v", again, err)
	}
	rotated := NewToken(KindAdmin)
	rch, err := tok.RegisterAdmin(ctx, rotated, "admin")
	if err != nil || !rch.Changed || rch.Replaced != Fingerprint(secret) {
		t.Fatalf("rotation: %+v %v", rch, err)
	}
	if tok.IsAdmin(ctx, secret) || !tok.IsAdmin(ctx, rotated) {
		t.Fatal("rotation did not take")
	}
	if _, err := tok.RegisterAdmin(ctx, secret, "admin"); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("old secret: %v", err)
	}
	if !tok.IsAdmin(ctx, rotated) {
		t.Fatal("old secret undid the rotation")
	}
	agent, err := tok.Issue(ctx, "bot", KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.RegisterAdmin(ctx, agent, "admin"); err == nil {
		t.Fatal("an agent's token registered as admin")
	}
	if _, err := tok.RegisterAdmin(ctx, "short", "admin"); err == nil {
		t.Fatal("short token accepted")
	}
}

func TestWatchInactive(t *testing.T) {
	tok := openTokens(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range []string{"a", "b"} {
		if _, err := tok.Issue(ctx, n, KindAgent); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan Principal, 4)
	if err := tok.WatchInactive(ctx, func(p Principal) { got <- p }); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ name, action, want string }{
		{"a", ActionDisable, StatusDisabled},
		{"a", ActionEnable, ""}, // active again: nothing to end
		{"b", ActionRevoke, StatusRevoked},
	} {
		if _, _, err := tok.SetAgentStatus(ctx, step.name, step.action); err != nil {
			t.Fatal(err)
		}
		if step.want == "" {
			continue
		}
		select {
		case p := <-got:
			if p.Name != step.name || p.Status() != step.want {
				t.Fatalf("%s %s: got %+v", step.action, step.name, p)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %s: no notice", step.action, step.name)
		}
	}
	select {
	case p := <-got:
		t.Fatalf("extra notice %+v", p)
	default:
	}
}

// TestOAuthStatus: an OAuth principal has no record until an admin
// disables or revokes it; its status then follows the agents' rules, is
// read on every check, is listed with the agents and is watched.
func TestOAuthStatus(t *testing.T) {
	tok := openTokens(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const who = "oauth:svc-billing@example.com"
	got := make(chan Principal, 4)
	if err := tok.WatchInactive(ctx, func(p Principal) { got <- p }); err != nil {
		t.Fatal(err)
	}
	if err := tok.OAuthActive(ctx, who); err != nil {
		t.Fatalf("a principal without a record: %v", err)
	}
	if p, ch, err := tok.SetOAuthStatus(ctx, who, ActionEnable); err != nil || ch.Changed || ch.Status != StatusActive || p.Name != who {
		t.Fatalf("enable without a record: %+v %+v %v", p, ch, err)
	}
	step := func(action, wantStatus string, wantChanged bool) {
		t.Helper()
		p, ch, err := tok.SetOAuthStatus(ctx, who, action)
		if err != nil || ch.Changed != wantChanged || ch.Status != wantStatus || p.Kind != KindOAuth || p.Name != who || ch.Revision == 0 {
			t.Fatalf("%s: %+v %+v %v; want %s changed=%t", action, p, ch, err, wantStatus, wantChanged)
		}
		aerr := tok.OAuthActive(ctx, who)
		if active := wantStatus == StatusActive; active != (aerr == nil) || (!active && !errors.Is(aerr, ErrInvalidToken)) {
			t.Fatalf("after %s: OAuthActive %v", action, aerr)
		}
	}
	step(ActionDisable, StatusDisabled, true)
	select {
	case p := <-got:
		if p.Name != who || p.Kind != KindOAuth || p.Status() != StatusDisabled {
			t.Fatalf("watch: %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch: no notice of the disable")
	}
	step(ActionDisable, StatusDisabled, false)
	step(ActionEnable, StatusActive, true)
	if err := tok.OAuthActive(ctx, "oauth:someone-else"); err != nil {
		t.Fatalf("another principal: %v", err)
	}
	step(ActionRevoke, StatusRevoked, true)
	step(ActionRevoke, StatusRevoked, false)
	for _, a := range []string{ActionEnable, ActionDisable} {
		if _, _, err := tok.SetOAuthStatus(ctx, who, a); !errors.Is(err, ErrRevoked) {
			t.Fatalf("%s revoked: %v", a, err)
		}
	}
	if _, _, err := tok.SetOAuthStatus(ctx, "billing-bot", ActionDisable); !errors.Is(err, ErrNotFound) {
		t.Fatalf("not an OAuth principal: %v", err)
	}
	if _, _, err := tok.SetOAuthStatus(ctx, who, "delete"); err == nil {
		t.Fatal("unknown action accepted")
	}
	if _, err := tok.Issue(ctx, "billing-bot", KindAgent); err != nil {
		t.Fatal(err)
	}
	agents, err := tok.Agents(ctx)
	if err != nil || len(agents) != 2 || agents[0].Name != "billing-bot" || agents[1].Name != who || agents[1].Status() != StatusRevoked {
		t.Fatalf("Agents: %+v %v", agents, err)
	}
	if admins, err := tok.Admins(ctx); err != nil || len(admins) != 0 {
		t.Fatalf("Admins: %+v %v", admins, err)
	}
}
