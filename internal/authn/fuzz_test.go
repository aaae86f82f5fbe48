package authn

import (
	"strings"
	"testing"
)

// FuzzBearerToken feeds arbitrary Authorization headers to BearerToken: it
// never panics, gives "" unless the scheme is Bearer (any case), and
// otherwise the rest of the header without surrounding space.
func FuzzBearerToken(f *testing.F) {
	for _, seed := range []string{"Bearer csag_abc", "bearer  x ", "BEARER", "Basic dXNlcjpwYXNz", "Bearer", "Bearer ", " Bearer x", "Bearer a b", "Bearer\tx", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		tok := BearerToken(header)
		scheme, rest, ok := strings.Cut(header, " ")
		bearer := ok && strings.EqualFold(scheme, "Bearer")
		switch {
		case !bearer && tok != "":
			t.Fatalf("%q: token %q without the Bearer scheme", header, tok)
		case bearer && tok != strings.TrimSpace(rest):
			t.Fatalf("%q: token %q, want %q", header, tok, strings.TrimSpace(rest))
		case tok != strings.TrimSpace(tok):
			t.Fatalf("%q: token %q keeps surrounding space", header, tok)
		}
	})
}
