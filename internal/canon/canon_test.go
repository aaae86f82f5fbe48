package canon

import (
	"crypto/sha256"
	"testing"
)

func TestHashIsKeyOrderAndWhitespaceIndependent(t *testing.T) {
	a, err := Hash("transfer_funds", []byte(`{"to":"acct-1","amount":5000,"currency":"USD"}`), "srv-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Hash("transfer_funds", []byte("{ \"currency\":\"USD\",\n \"amount\": 5000.0, \"to\":\"acct-1\" }"), "srv-1")
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("same logical arguments hashed differently: %s vs %s", a, b)
	}
}

func TestHashMatchesSEP2672Construction(t *testing.T) {
	got, err := Hash("delete_resource", []byte(`{"resourceId":"abc123"}`), "https://mcp.example.com")
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("delete_resource\x00{\"resourceId\":\"abc123\"}\x00https://mcp.example.com"))
	if got != ActionHash(want) {
		t.Fatalf("got %s, want %x", got, want)
	}
}

func TestHashBindsEveryField(t *testing.T) {
	base, _ := Hash("t", []byte(`{"a":1}`), "s")
	for _, tc := range []struct {
		name, tool, args, server string
	}{
		{"tool", "u", `{"a":1}`, "s"},
		{"args", "t", `{"a":2}`, "s"},
		{"server", "t", `{"a":1}`, "s2"},
		{"boundary", "t\x00{", `{"a":1}`, "s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Hash(tc.tool, []byte(tc.args), tc.server)
			if err != nil {
				t.Fatal(err)
			}
			if h == base {
				t.Fatalf("changing %s did not change the hash", tc.name)
			}
		})
	}
}

func TestHashRejectsBadInput(t *testing.T) {
	if _, err := Hash("t", []byte(`{"a":`), "s"); err == nil {
		t.Fatal("malformed JSON accepted")
	}
	if _, err := Hash("t", []byte(`{}`), ""); err != ErrEmptyServerID {
		t.Fatalf("empty server id: got %v", err)
	}
}

func TestParseActionHashRoundTrip(t *testing.T) {
	h, _ := Hash("t", nil, "s")
	p, err := ParseActionHash(h.String())
	if err != nil || p != h {
		t.Fatalf("round trip failed: %v", err)
	}
	if _, err := ParseActionHash("zz"); err == nil {
		t.Fatal("bad hex accepted")
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2,{"b":null}]}`, `{"n":1e300}`, `"\u00e9"`, `[`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Canonicalize(b)
		if err != nil {
			return
		}
		// Canonical form is a fixed point.
		c2, err := Canonicalize(c)
		if err != nil {
			t.Fatalf("canonical output does not re-parse: %v", err)
		}
		if string(c) != string(c2) {
			t.Fatalf("not idempotent: %q -> %q", c, c2)
		}
	})
}

func BenchmarkHash1KB(b *testing.B) {
	args := []byte(`{"to":"acct-991","amount":50000,"currency":"USD","memo":"` + string(make([]byte, 0)) + `x"}`)
	for len(args) < 1024 {
		args = append(args[:len(args)-2], []byte(`xxxxxxxx"}`)...)
	}
	b.SetBytes(int64(len(args)))
	for b.Loop() {
		if _, err := Hash("transfer_funds", args, "srv"); err != nil {
			b.Fatal(err)
		}
	}
}
