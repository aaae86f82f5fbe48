package config

import (
	"errors"
	"strings"
	"testing"
)

// fuzzSecret is every ${NAME}'s value in FuzzParse: it must never appear in
// a problem or a printed form unless the input itself holds it.
const fuzzSecret = "xoxb-S3CR3T-7f3a9"

// FuzzParse feeds arbitrary files to the parser: it never panics; a file it
// refuses gives an *Error whose every line is "c.yaml[:line]: …" and no
// configuration; a file it accepts prints (String) without a secret, and
// what String prints loads again to the same printed form.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{full, sectionsExample, "", "{}", "upstreams: []\n", "- a\n", "a: &x 1\nb: *x\n",
		"upstreams:\n  - name: a\n    url: http://h/mcp\n    headers: {X: \"${T}\"}\n",
		"temporal:\n  tls:\n    cert: c\n", "nats:\n  url: nats://u:p@h:1\n", "limits:\n  poll_interval: 1h\n",
		"slack:\n  token: ${T}\n  channel: c\n", "---\n---\n", "inline_wait: 10m\n", "<<: {a: 1}\n"} {
		f.Add(seed)
	}
	lookup := func(string) (string, bool) { return fuzzSecret, true }
	f.Fuzz(func(t *testing.T, content string) {
		file, err := Parse("/cfg/c.yaml", []byte(content), lookup)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 || file != nil {
				t.Fatalf("refusal %T %v with file %v", err, err, file)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "/cfg/c.yaml") {
					t.Fatalf("problem line without the file: %q", line)
				}
			}
			if strings.Contains(err.Error(), fuzzSecret) && !strings.Contains(content, fuzzSecret) {
				t.Fatalf("a problem shows a secret: %v", err)
			}
			return
		}
		printed := file.String()
		if strings.Contains(printed, fuzzSecret) && !strings.Contains(content, fuzzSecret) {
			t.Fatalf("String shows a secret:\n%s", printed)
		}
		// Redacted secrets reload as a token-shaped placeholder.
		again, err := Parse("/cfg/c.yaml", []byte(strings.ReplaceAll(printed, RedactedValue, "xoxb-redacted")), lookup)
		if err != nil {
			t.Fatalf("String does not load again: %v\n%s", err, printed)
		}
		if got := again.String(); got != printed {
			t.Fatalf("String changed on reload:\nfirst:\n%s\nagain:\n%s", printed, got)
		}
	})
}
