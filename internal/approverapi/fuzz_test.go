package approverapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzDecisionBody feeds arbitrary bodies to what the decision endpoints
// run first (Decode, then Validate): nothing panics; every refusal is a
// 400 *Error with a bounded, valid UTF-8 message; a body that passes both
// encodes and decodes again to the same request.
func FuzzDecisionBody(f *testing.F) {
	for _, seed := range []string{
		`{"challengeId":"ch_1","decision":"approve","response":{"id":"x","type":"public-key"}}`,
		`{"challengeId":"ch_1","decision":"deny","comment":"no\nway","response":{}}`,
		`{"challengeId":"","decision":"approve","response":{}}`, `{"challengeId":"ch_1","decision":"maybe","response":{}}`,
		`{"challengeId":"ch_1","decision":"approve","response":[]}`, `{"challengeId":1}`, `{"bogus":1}`,
		`{} {}`, `[`, `"x"`, `null`, "", `{"comment":"\u0000"}`, `{"challengeId":"ch_1","decision":"approve","response":{},"response":{}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req DecisionRequest
		err := Decode(body, &req)
		if err == nil {
			err = req.Validate()
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
				t.Fatalf("refusal %T %v is not a 400 *Error", err, err)
			}
			if !utf8.ValidString(e.Message) || len(e.Message) > 512 {
				t.Fatalf("message %d bytes, valid UTF-8 %v: %q", len(e.Message), utf8.ValidString(e.Message), e.Message)
			}
			return
		}
		out, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var again DecisionRequest
		if err := Decode(out, &again); err != nil {
			t.Fatalf("an accepted request does not decode again: %v", err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("an accepted request is refused again: %v", err)
		}
		if !reflect.DeepEqual(compact(t, req), compact(t, again)) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}

// compact is req with its response compacted, for comparison.
func compact(t *testing.T, req DecisionRequest) DecisionRequest {
	var v any
	if err := json.Unmarshal(req.Response, &v); err != nil {
		t.Fatal(err)
	}
	req.Response, _ = json.Marshal(v)
	return req
}
