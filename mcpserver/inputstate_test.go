package mcpserver

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/countersign/countersign/tasks"
)

type askResult struct {
	ResultType    string                     `json:"resultType"`
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
	RequestState  string                     `json:"requestState"`
}

func accept(content map[string]any) map[string]any {
	return map[string]any{"action": "accept", "content": content}
}

func (h *harness) roundCall(t *testing.T, tool string, responses map[string]any, state string) rpc {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": map[string]any{}}
	if responses != nil {
		params["inputResponses"] = responses
	}
	if state != "" {
		params["requestState"] = state
	}
	return h.do(t, call{era: tasks.Era2026, caps: elicitation, method: "tools/call", params: params})
}

func TestInputRoundsCarrySignedState(t *testing.T) {
	h := newConformanceHarness(t)
	const tool = "test_input_required_result_multi_round"
	var r1, r2 askResult
	h.roundCall(t, tool, nil, "").ok(t, &r1)
	if r1.ResultType != "input_required" || r1.InputRequests["step1"] == nil || r1.RequestState == "" {
		t.Fatalf("round 1: %+v", r1)
	}
	h.roundCall(t, tool, map[string]any{"step1": accept(map[string]any{"name": "Alice"})}, r1.RequestState).ok(t, &r2)
	if r2.ResultType != "input_required" || r2.InputRequests["step2"] == nil || r2.RequestState == "" || r2.RequestState == r1.RequestState {
		t.Fatalf("round 2: %+v", r2)
	}
	var done toolCallResult
	h.roundCall(t, tool, map[string]any{"step2": accept(map[string]any{"color": "blue"})}, r2.RequestState).ok(t, &done)
	if done.ResultType != "complete" || done.IsError {
		t.Fatalf("round 3: %+v", done)
	}
	// The tool saw both rounds' answers.
	if txt := done.text(); txt != "Received 2 input response(s): [step1 step2]" && txt != "Received 2 input response(s): [step2 step1]" {
		t.Errorf("result: %q", txt)
	}

	for _, tc := range []struct {
		name, tool, state string
	}{
		{"tampered", tool, r1.RequestState + "-TAMPERED"},
		{"not base64", tool, "!!.!!"},
		{"no signature", tool, "abc"},
		{"another tool's", "test_input_required_result_request_state", r1.RequestState},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.roundCall(t, tc.tool, map[string]any{"step1": accept(map[string]any{"name": "Mallory"})}, tc.state).fails(t, http.StatusBadRequest, codeInvalidParams)
		})
	}
	t.Run("another caller's", func(t *testing.T) {
		st := inputState{Principal: "someone-else", Tool: tool, Hash: "x", Answers: map[string]json.RawMessage{}}
		h.roundCall(t, tool, nil, h.srv.sealInputState(st, time.Now())).fails(t, http.StatusBadRequest, codeInvalidParams)
	})
}

func TestInputStateExpires(t *testing.T) {
	s := &Server{stateKey: []byte("0123456789abcdef0123456789abcdef")}
	want := inputState{Principal: "p", Tool: "t", Hash: "h", Answers: map[string]json.RawMessage{"a": json.RawMessage(`{}`)}}
	now := time.Unix(1_800_000_000, 0)
	raw := s.sealInputState(want, now)
	if got, err := s.openInputState(raw, want, now.Add(inputStateTTL)); err != nil || string(got.Answers["a"]) != `{}` {
		t.Fatalf("within its TTL: %+v %v", got, err)
	}
	if _, err := s.openInputState(raw, want, now.Add(inputStateTTL+time.Second)); err == nil {
		t.Error("an expired requestState was accepted")
	}
	other := &Server{stateKey: []byte("another key of thirty-two bytes!")}
	if _, err := other.openInputState(raw, want, now); err == nil {
		t.Error("a requestState signed with another key was accepted")
	}
}

// A requestState comes from the client: no input may panic, and only what
// this server sealed opens.
func FuzzOpenInputState(f *testing.F) {
	s := &Server{stateKey: []byte("0123456789abcdef0123456789abcdef")}
	want := inputState{Principal: "p", Tool: "t", Hash: "h", Answers: map[string]json.RawMessage{}}
	now := time.Unix(1_800_000_000, 0)
	f.Add(s.sealInputState(want, now))
	f.Add("")
	f.Add(".")
	f.Add("e30.")
	f.Fuzz(func(t *testing.T, raw string) {
		st, err := s.openInputState(raw, want, now)
		if err == nil && (st.Principal != "p" || st.Tool != "t" || st.Hash != "h") {
			t.Fatalf("opened a state for another call: %+v", st)
		}
	})
}
