package passkey

import (
	"testing"

	"github.com/go-webauthn/webauthn/protocol"
)

func TestEveryReasonHasAMessage(t *testing.T) {
	reasons := []string{
		ReasonMissingEvidence, ReasonUnsupportedMethod, ReasonChallengeUnknown, ReasonChallengeConsumed,
		ReasonChallengeExpired, ReasonChallengeWrongTask, ReasonChallengeWrongTool, ReasonChallengeWrongDecision, ReasonUnknownCredential,
		ReasonAuthenticatorClassMismatch, ReasonSignatureVerificationFailed, ReasonSignatureCounterRegression,
		ReasonArgumentHashMismatch, ReasonApproverNotEligible, ReasonSelfApproval, ReasonToolNotApprovalRequired,
		ReasonNoEligibleCredential, ReasonCredentialAlreadyEnrolled, ReasonNoPendingEnrollment, ReasonVerificationFailed,
		ReasonCredentialRevoked, ReasonCredentialDisabled, ReasonApproverRevoked, ReasonApproverDisabled,
	}
	if len(messages) != len(reasons) {
		t.Errorf("%d messages for %d reasons", len(messages), len(reasons))
	}
	for _, r := range reasons {
		e := newError(r, nil)
		if e.Message == "" {
			t.Errorf("reason %s has no message", r)
		}
		if e.Error() == "" || e.Unwrap() != nil {
			t.Errorf("reason %s: Error %q", r, e.Error())
		}
	}
}

func TestClassAllows(t *testing.T) {
	tests := []struct {
		class      string
		transports []string
		want       bool
	}{
		{ClassCrossPlatform, []string{"internal"}, false},
		{ClassCrossPlatform, []string{"internal", "internal"}, false},
		{ClassCrossPlatform, []string{"hybrid", "internal"}, true},
		{ClassCrossPlatform, []string{"usb"}, true},
		{ClassCrossPlatform, []string{"nfc"}, true},
		{ClassCrossPlatform, []string{"ble", "internal"}, true},
		{ClassCrossPlatform, nil, false},                    // no transports reported: none of §4.7's four
		{ClassCrossPlatform, []string{"smart-card"}, false}, // not one of §4.7's four either
		{ClassPlatform, nil, true},
		{ClassPlatform, []string{"internal"}, true},
	}
	for _, tt := range tests {
		var ts []protocol.AuthenticatorTransport
		for _, s := range tt.transports {
			ts = append(ts, protocol.AuthenticatorTransport(s))
		}
		if got := classAllows(tt.class, ts); got != tt.want {
			t.Errorf("classAllows(%s, %v) = %v, want %v", tt.class, tt.transports, got, tt.want)
		}
	}
}
