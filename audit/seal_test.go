package audit

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// sealChecked seals r and checks the line against the signed record
// encoded and canonicalized whole, as seal did before it encoded once.
func sealChecked(t testing.TB, r Record, k *Keyring) []byte {
	t.Helper()
	line, rec, err := seal(r, k)
	if err != nil {
		t.Fatal(err)
	}
	want, err := canonical(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(line, want) {
		t.Fatalf("seal's line differs from the signed record's canonical form:\n got %s\nwant %s", line, want)
	}
	return line
}

// The signed line seal builds from the unsigned one is byte for byte the
// canonical form of the signed record, whatever the body holds: keys that
// sort around "sig" and "stepId", nested "stepId" keys, the key's bytes
// inside strings, escapes, unicode, numbers; and the line parses.
func TestSealLineIsCanonical(t *testing.T) {
	k := testKeys(t)
	bodies := []string{
		`{}`,
		`{"stepId":"inner","sig":"x","seq":1}`,
		`{"a":{"b":[{"stepId":"deep"},{",\"stepId\":":1}]}}`,
		`{"note":",\"stepId\":\"fake\",\"sig\":\"forged\""}`,
		`{"s":"\u00e9\u2028\ud83d\ude00 \\ \" / \n","n":[1e21,1.5,-0,0.1,12345678901234567890]}`,
		`{"z":null,"y":true,"x":false,"":""}`,
		`[1,"stepId",{"stepId":{}}]`,
		`"a plain string"`,
		`null`,
	}
	for i, body := range bodies {
		r := Record{TaskID: "tsk_sealtest", Seq: i, Kind: KindRequested, StepID: `step ,"stepId": "` + body,
			At: time.Date(2026, 11, 27, 4, 0, 0, 123, time.UTC), Prev: "ab", Body: json.RawMessage(body)}
		line := sealChecked(t, r, k)
		if _, _, err := newRecordParser(k.PublicKeys(), false).parse(line); err != nil {
			t.Fatalf("body %s: the sealed line does not parse: %v", body, err)
		}
	}
}

// FuzzSealLine: for any JSON body and step ID, seal's line is the signed
// record's canonical form.
func FuzzSealLine(f *testing.F) {
	f.Add(`{"stepId":"x"}`, "decision/1")
	f.Add(`{"a":",\"stepId\":"}`, `,"stepId":`)
	f.Add(`[]`, "")
	k := testKeys(f)
	f.Fuzz(func(t *testing.T, body, stepID string) {
		if !json.Valid([]byte(body)) {
			return
		}
		r := Record{TaskID: "tsk_fuzz", Kind: KindRequested, StepID: stepID, Body: json.RawMessage(body)}
		if _, err := canonical(r); err != nil {
			return // not a record seal can encode
		}
		sealChecked(t, r, k)
	})
}

// BenchmarkSeal: one record sealed, a requested record (the held call) and
// a decision with its passkey assertion (~1.5 KB). "seal" is what Append
// does; "seal+canonical" adds the second encoding seal did before.
func BenchmarkSeal(b *testing.B) {
	k := testKeys(b)
	at := time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC)
	req, _ := requestedStep(b, at)
	reqBody, _ := json.Marshal(req.Body)
	assertion := bytes.Repeat([]byte("A"), 1024)
	decBody, _ := json.Marshal(map[string]any{"decision": "approve", "accepted": true, "challengeId": "ch_" + string(assertion[:20]),
		"assertion": map[string]any{"authenticatorData": string(assertion[:50]), "clientDataJSON": string(assertion), "signature": string(assertion[:96])}})
	for _, c := range []struct {
		name string
		body []byte
	}{{"requested", reqBody}, {"decision", decBody}} {
		r := Record{TaskID: "tsk_bench", Seq: 1, Kind: KindRequested, StepID: "s", At: at, Prev: "ab", Body: c.body}
		b.Run(c.name+"/seal", func(b *testing.B) {
			for b.Loop() {
				if _, _, err := seal(r, k); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/seal+canonical", func(b *testing.B) {
			for b.Loop() {
				_, rec, err := seal(r, k)
				if err == nil {
					_, err = canonical(rec)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
