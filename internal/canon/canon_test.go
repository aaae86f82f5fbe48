package canon

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
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

func TestHashRefusesInexactNumbers(t *testing.T) {
	for _, tc := range []struct {
		name, lit string
		want      string // the JCS form in the error; "" when accepted
	}{
		{"integer", "5000", ""},
		{"one tenth", "0.1", ""},
		{"trailing zeros", "4.50", ""},
		{"exponent", "1.0e2", ""},
		{"capital exponent", "1E+2", ""},
		{"1e21", "1e21", ""},
		{"1e20 written out", "100000000000000000000", ""},
		{"smallest subnormal", "5e-324", ""},
		{"largest double", "1.7976931348623157e308", ""},
		{"2^53", "9007199254740992", ""},
		{"negative fraction", "-123.456e-2", ""},
		{"shortest third", "0.3333333333333333", ""},
		{"zero", "0", ""},
		{"negative zero", "-0", ""},
		{"zero with exponent", "0.000e999999999999999999", ""},
		{"2^53+1", "9007199254740993", "9007199254740992"},
		{"account number", "12345678901234567891", "12345678901234567000"},
		{"too precise tenth", "0.10000000000000000001", "0.1"},
		{"too precise third", "0.33333333333333333", "0.3333333333333333"},
		{"subnormal rounded", "3e-324", "5e-324"},
		{"underflow", "1e-400", "0"},
		{"huge negative exponent", "1e-99999999999999999999", "0"},
		{"long literal", "1.00000000000000000000000000000000000000001", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := `{"a":[true,{"b/~":` + tc.lit + `}]}`
			_, err := Hash("t", []byte(args), "s")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("%s refused: %v", tc.lit, err)
				}
				return
			}
			var ne *NumberError
			if !errors.As(err, &ne) || !errors.Is(err, ErrInexactNumber) {
				t.Fatalf("%s: got %v, want a *NumberError", tc.lit, err)
			}
			if ne.Pointer != "/a/1/b~1~0" || ne.Nearest != tc.want || !strings.HasPrefix(tc.lit, strings.TrimSuffix(ne.Literal, "…")) {
				t.Fatalf("%s: got %+v, want pointer /a/1/b~1~0, nearest %s", tc.lit, *ne, tc.want)
			}
		})
	}
}

func TestHashSeparatesNumbersThatRoundTogether(t *testing.T) {
	// Before the check these two hashed the same (SEP-2672 binding).
	a, err := Hash("t", []byte(`{"acct":12345678901234567000}`), "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Hash("t", []byte(`{"acct":12345678901234567891}`), "s"); !errors.Is(err, ErrInexactNumber) {
		t.Fatalf("12345678901234567891 hashed (as %s?): %v", a, err)
	}
}

func TestNumberPointer(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{`9007199254740993`, ""},
		{`[1,2,9007199254740993]`, "/2"},
		{`{"x":{},"y":[[],{"z":"1e400"}],"a":{"":[0.5,9007199254740993]}}`, "/a//1"},
		{`{"k":[{"m":1},{"m":9007199254740993}]}`, "/k/1/m"},
		{`{"s\"1":"a\"2\\","t":["\\",-3,9007199254740993]}`, `/t/2`},
		{`{"":{"a/b~":[{"9":9007199254740993}]}}`, "//a~1b~0/0/9"},
	} {
		var ne *NumberError
		if err := checkNumbers([]byte(tc.args)); !errors.As(err, &ne) || ne.Pointer != tc.want {
			t.Errorf("%s: got %v, want pointer %q", tc.args, err, tc.want)
		}
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
	for _, s := range []string{`{}`, `{"a":[1,2,{"b":null}]}`, `{"n":1e300}`, `"\u00e9"`, `[`, `{"a":1,"a":2}`,
		`{"big":9007199254740993,"frac":0.1,"neg0":-0,"min":5e-324}`, `[0.10000000000000000001,{"a/b":1e-400}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Canonicalize(b)
		if err != nil {
			return
		}
		// The number check reads every document JCS reads, and the
		// canonical form's numbers are exact by construction.
		err = checkNumbers(b)
		if err != nil && !errors.Is(err, ErrInexactNumber) {
			t.Fatalf("JCS accepts %q, the number check fails: %v", b, err)
		}
		// The pointer finds the number the scan refused: "" only when the
		// document is that number.
		if ne := (*NumberError)(nil); errors.As(err, &ne) && ne.Pointer == "" {
			if d := bytes.TrimSpace(b); len(d) == 0 || d[0] != '-' && (d[0] < '0' || d[0] > '9') {
				t.Fatalf("%q: %v has no pointer", b, err)
			}
		}
		if err := checkNumbers(c); err != nil {
			t.Fatalf("canonical form %q refused: %v", c, err)
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

// FuzzNumber checks the exact comparison against math/big: a number is
// accepted exactly when its JCS form, parsed back, has the same value.
func FuzzNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "0.1", "1.0e2", "1e21", "5e-324", "3e-324", "9007199254740992",
		"9007199254740993", "0.10000000000000000001", "12345678901234567891", "1.7976931348623157e308", "1e-400", "-0.0e-5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lit string) {
		var n json.Number
		// Bound the exponent: big.Rat would otherwise build 10^exp.
		if len(lit) > 400 || json.Unmarshal([]byte(lit), &n) != nil || string(n) != lit {
			return
		}
		if i := strings.IndexAny(lit, "eE"); i >= 0 && len(strings.TrimLeft(lit[i+1:], "+-0")) > 3 {
			return
		}
		c, err := Canonicalize([]byte(lit))
		if err != nil {
			return // out of range
		}
		want, ok1 := new(big.Rat).SetString(lit)
		got, ok2 := new(big.Rat).SetString(string(c))
		if !ok1 || !ok2 {
			t.Fatalf("big.Rat cannot read %q or %q", lit, c)
		}
		exact := want.Cmp(got) == 0
		err = checkNumbers([]byte(lit))
		if exact && err != nil {
			t.Fatalf("%s refused, its JCS form %s has the same value: %v", lit, c, err)
		}
		if !exact && !errors.Is(err, ErrInexactNumber) {
			t.Fatalf("%s accepted, its JCS form %s differs: %v", lit, c, err)
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
