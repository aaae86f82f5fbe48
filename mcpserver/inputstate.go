package mcpserver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// inputStateTTL is how long a requestState stays valid: a client answers
// its input requests in one sitting.
const inputStateTTL = 10 * time.Minute

// inputState is what a SEP-2322 requestState carries from one round of
// input requests to the next: the answers so far, bound to the caller, the
// tool and the arguments (their action hash). It goes out signed and comes
// back untrusted: openInputState checks it before anything reads it.
//
// The signing key is per process (Server.stateKey): a requestState is
// honoured by the replica that issued it, and not after a restart. Only
// conformance fixtures ask in rounds.
type inputState struct {
	Principal string                     `json:"p"`
	Tool      string                     `json:"t"`
	Hash      string                     `json:"h"`
	Round     int                        `json:"r"`
	Answers   map[string]json.RawMessage `json:"a"`
	Expires   int64                      `json:"e"` // Unix seconds
}

// sealInputState encodes st as base64url(JSON) "." base64url(HMAC-SHA256).
func (s *Server) sealInputState(st inputState, now time.Time) string {
	st.Expires = now.Add(inputStateTTL).Unix()
	body, _ := json.Marshal(st) // plain values and raw JSON already validated
	mac := hmac.New(sha256.New, s.stateKey)
	mac.Write(body)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(body) + "." + enc.EncodeToString(mac.Sum(nil))
}

// errBadRequestState answers a requestState that fails verification.
var errBadRequestState = invalidParams("Invalid params: requestState failed its integrity check")

// openInputState verifies a requestState the client echoed and returns it.
// want names the caller, tool and action hash it must be bound to. Any
// failure (malformed, wrong signature, expired, issued for another call)
// is -32602; nothing about it is trusted before the signature checks.
func (s *Server) openInputState(raw string, want inputState, now time.Time) (inputState, error) {
	enc := base64.RawURLEncoding
	b64body, b64mac, ok := strings.Cut(raw, ".")
	if !ok {
		return inputState{}, errBadRequestState
	}
	body, err1 := enc.DecodeString(b64body)
	sum, err2 := enc.DecodeString(b64mac)
	if err1 != nil || err2 != nil {
		return inputState{}, errBadRequestState
	}
	mac := hmac.New(sha256.New, s.stateKey)
	mac.Write(body)
	if !hmac.Equal(sum, mac.Sum(nil)) {
		return inputState{}, errBadRequestState
	}
	var st inputState
	if err := json.Unmarshal(body, &st); err != nil {
		return inputState{}, errBadRequestState
	}
	if st.Principal != want.Principal || st.Tool != want.Tool || st.Hash != want.Hash || st.Round < 0 || st.Answers == nil {
		return inputState{}, invalidParams("Invalid params: requestState is not for this call")
	}
	if now.Unix() > st.Expires {
		return inputState{}, invalidParams("Invalid params: requestState has expired; call again without it")
	}
	return st, nil
}
