package authn

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/countersign/countersign/internal/testnats"
)

func TestIssueLookup(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	tok, err := Open(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := tok.Issue(ctx, "billing-bot", KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tok.Issue(ctx, "ops@example.com", KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if name, err := tok.Agent(ctx, agent); err != nil || name != "billing-bot" {
		t.Fatalf("agent lookup: %q %v", name, err)
	}
	if _, err := tok.Agent(ctx, admin); !errors.Is(err, ErrInvalidToken) {
		t.Fatal("admin token accepted as agent")
	}
	if !tok.IsAdmin(ctx, admin) || tok.IsAdmin(ctx, agent) {
		t.Fatal("IsAdmin wrong")
	}
	if _, err := tok.Lookup(ctx, agent+"x"); !errors.Is(err, ErrInvalidToken) || errors.Is(err, ErrDisabled) {
		t.Fatalf("forged token: %v", err)
	}
	if _, err := tok.Issue(ctx, "billing-bot", KindAgent); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("duplicate agent name: %v", err)
	}
	for _, bad := range []string{"", "has space", "a/b", string(make([]byte, 65))} {
		if _, err := tok.Issue(ctx, bad, KindAgent); !errors.Is(err, ErrInvalidName) {
			t.Fatalf("name %q: %v", bad, err)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for h, want := range map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "": "", "Bearer": ""} {
		if got := BearerToken(h); got != want {
			t.Errorf("BearerToken(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestAuthorizeAdmin(t *testing.T) {
	js, nc := testnats.Start(t)
	ctx := context.Background()
	tok, err := Open(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := tok.Issue(ctx, "billing-bot", KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tok.Issue(ctx, "ops@example.com", KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	req := func(auth string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/admin/v1/approvers", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return r
	}
	if err := tok.AuthorizeAdmin(req("Bearer " + admin)); err != nil {
		t.Fatalf("admin token refused: %v", err)
	}
	for name, auth := range map[string]string{
		"no header":     "",
		"not bearer":    "Basic " + admin,
		"empty bearer":  "Bearer ",
		"agent token":   "Bearer " + agent,
		"unknown token": "Bearer " + admin + "x",
		"too long":      "Bearer " + string(make([]byte, 300)),
	} {
		if err := tok.AuthorizeAdmin(req(auth)); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%s: %v, want ErrInvalidToken", name, err)
		}
	}

	// The token store is down: an error, and not ErrInvalidToken (500, not
	// 401).
	nc.Close()
	err = tok.AuthorizeAdmin(req("Bearer " + admin))
	if err == nil || errors.Is(err, ErrInvalidToken) {
		t.Fatalf("store down: %v, want a store error", err)
	}
}
