package passkey

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/canon"
)

// Authenticator classes (SEP-2672 §4.7).
const (
	// ClassCrossPlatform admits only credentials whose stored transports
	// include a roaming one (hybrid, usb, nfc or ble): it excludes those
	// that are exclusively "internal" (same-device-only) and those that
	// reported no transports. It is the SEP default: an empty class means
	// cross-platform.
	ClassCrossPlatform = "cross-platform"
	// ClassPlatform accepts every enrolled credential.
	ClassPlatform = "platform"
)

// Who asks for a challenge (ChallengeRequest.Asker). It decides how full
// the challenges bucket may be for the challenge to be admitted, so that
// agents can never take the room approvers need.
const (
	// AskerAgent is an agent asking in-band (approval/challenge/create):
	// admitted while the bucket holds less than AgentChallengeAdmitBytes.
	// An empty Asker means AskerAgent.
	AskerAgent = "agent"
	// AskerApprover is the approver site (an approval's page or an
	// approver's inbox): admitted while the bucket holds less than
	// ChallengeAdmitBytes.
	AskerApprover = "approver"
)

// normalizeClass maps "" to the SEP default and rejects unknown values.
func normalizeClass(c string) (string, error) {
	switch c {
	case "", ClassCrossPlatform:
		return ClassCrossPlatform, nil
	case ClassPlatform:
		return ClassPlatform, nil
	}
	return "", fmt.Errorf("%w: authenticator class %q", ErrInvalidArgument, c)
}

// classAllows applies the §4.7 capability filter to a credential's stored
// transports. Cross-platform admits a credential whose transports include
// at least one of hybrid, usb, nfc or ble, as §4.7 defines the class (and
// the reference implementation checks it): one that is exclusively
// "internal" is excluded, and so is one that reported no transports (or
// only others, such as "smart-card"), since nothing says it can leave the
// device. Platform admits every credential.
func classAllows(class string, transports []protocol.AuthenticatorTransport) bool {
	if class == ClassPlatform {
		return true
	}
	for _, t := range transports {
		switch t {
		case protocol.Hybrid, protocol.USB, protocol.NFC, protocol.BLE:
			return true
		}
	}
	return false
}

// ChallengeRequest asks for a SEP-2672 challenge bound to one call.
type ChallengeRequest struct {
	TaskID     string
	Tool       string
	ActionHash canon.ActionHash
	// Group is the approver group whose passkeys may answer.
	Group string
	// Principal, for an in-band challenge (SEP-2672 on the MCP endpoint),
	// is the bearer principal whose own passkeys may answer: those of the
	// approvers mapped to it ([Approver.MappedTo]). It replaces Group (which
	// must then be empty) and TaskID may be empty: the call is not a task
	// yet. Only the same principal can use the challenge.
	Principal string
	// AuthenticatorClass is ClassPlatform or ClassCrossPlatform ("" means cross-platform).
	AuthenticatorClass string
	// DisplayText is the server-built description shown to the approver (§4.4.3).
	DisplayText string
	// Decision, when set ("approve" or "deny"), binds the challenge to that
	// decision: an assertion over it counts only for the same decision, so a
	// signed denial can never be replayed or rewritten as an approval.
	Decision string
	// Asker is AskerAgent or AskerApprover ("" means AskerAgent): who asks
	// for the challenge, set by each caller. An in-band challenge
	// (Principal set) is always an agent's.
	Asker string
}

// Challenge is what the approver's browser needs for navigator.credentials.get().
// Its JSON form is the SEP-2672 §4.4.3 challenge envelope.
type Challenge struct {
	ID          string    `json:"challengeId"`
	DisplayText string    `json:"displayText"`
	ExpiresAt   time.Time `json:"expiresAt"`
	// RequestOptions: challenge = base64url(nonce ‖ actionHash) (86 chars),
	// userVerification "required", allowCredentials = the group's passkeys
	// filtered by class.
	RequestOptions protocol.PublicKeyCredentialRequestOptions `json:"requestOptions"`
}

// challengeRecord is the stored challenge, keyed by challenge id. The
// display text is not stored: nothing reads it back (the task record has
// the call), and an agent chooses it, through the arguments, up to
// MaxDisplayText bytes, up to six times as many escaped. Records stored
// before it was left out still have it (and decode: it is ignored).
type challengeRecord struct {
	TaskID             string    `json:"taskId"`
	Tool               string    `json:"tool"`
	ActionHash         string    `json:"actionHash"` // hex
	Nonce              string    `json:"nonce"`      // base64url, 32 bytes
	Group              string    `json:"group"`
	Principal          string    `json:"principal,omitempty"`
	AuthenticatorClass string    `json:"authenticatorClass"`
	Decision           string    `json:"decision,omitempty"`
	CreatedAt          time.Time `json:"createdAt"`
	ExpiresAt          time.Time `json:"expiresAt"`
	// ConsumedBy is the consumer key of the verification that used the
	// challenge; empty until consumed.
	ConsumedBy string    `json:"consumedBy"`
	ConsumedAt time.Time `json:"consumedAt,omitzero"`
	// Result is returned again to a retry with the same consumer key.
	Result *Verified `json:"result,omitempty"`
}

// wireChallenge returns the base64url of nonce ‖ actionHash, the exact value
// the authenticator signs over (in clientDataJSON.challenge).
func (r *challengeRecord) wireChallenge() (string, error) {
	nonce, err := base64.RawURLEncoding.DecodeString(r.Nonce)
	if err != nil || len(nonce) != protocol.ChallengeLength {
		return "", errors.New("passkey: stored nonce is malformed")
	}
	h, err := canon.ParseActionHash(r.ActionHash)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(append(nonce, h[:]...)), nil
}

const (
	maxTaskIDLen      = 256
	maxToolLen        = 256
	maxDisplayTextLen = 4096
	challengeIDSize   = 16
)

// MaxDisplayText is the longest display text, in bytes, that
// [ClipDisplayText] leaves: with its ellipsis it fits a challenge.
const MaxDisplayText = 4000

// ClipDisplayText cuts s to MaxDisplayText bytes at a character boundary
// (a cut inside one would show as U+FFFD) and marks the cut with "…"; a
// shorter s is returned as is. The approval page shows a call's arguments
// whole; the display text is its summary.
func ClipDisplayText(s string) string {
	if len(s) <= MaxDisplayText {
		return s
	}
	i := MaxDisplayText
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func validateChallengeRequest(req *ChallengeRequest) error {
	inBand := req.Principal != ""
	switch {
	case inBand && req.Group != "":
		return fmt.Errorf("%w: an in-band challenge names a principal, not a group", ErrInvalidArgument)
	case inBand && len(req.Principal) > 4*maxPrincipalLen:
		return fmt.Errorf("%w: principal too long", ErrInvalidArgument)
	case (req.TaskID == "" && !inBand) || len(req.TaskID) > maxTaskIDLen:
		return fmt.Errorf("%w: task id must be 1-%d bytes", ErrInvalidArgument, maxTaskIDLen)
	case req.Tool == "" || len(req.Tool) > maxToolLen:
		return fmt.Errorf("%w: tool must be 1-%d bytes", ErrInvalidArgument, maxToolLen)
	case req.ActionHash.IsZero():
		return fmt.Errorf("%w: action hash is zero", ErrInvalidArgument)
	case req.DisplayText == "" || len(req.DisplayText) > maxDisplayTextLen || !utf8.ValidString(req.DisplayText):
		return fmt.Errorf("%w: display text must be 1-%d bytes of UTF-8", ErrInvalidArgument, maxDisplayTextLen)
	case req.Asker != "" && req.Asker != AskerAgent && req.Asker != AskerApprover:
		return fmt.Errorf("%w: asker %q is neither %q nor %q", ErrInvalidArgument, req.Asker, AskerAgent, AskerApprover)
	case req.Decision != "" && req.Decision != "approve" && req.Decision != "deny":
		return fmt.Errorf("%w: decision %.32q is neither \"approve\" nor \"deny\"", ErrInvalidArgument, req.Decision)
	case inBand && req.Decision != "":
		return fmt.Errorf("%w: an in-band challenge can only approve its call; it names no decision", ErrInvalidArgument)
	case inBand && req.Asker == AskerApprover:
		return fmt.Errorf("%w: an in-band challenge is an agent's, not the approver site's", ErrInvalidArgument)
	}
	if inBand {
		return nil
	}
	if req.Group == InBandGroup {
		// Any agent can enroll into it in-band: it decides no task.
		return fmt.Errorf("%w: group %q decides no task", ErrInvalidArgument, InBandGroup)
	}
	return validateGroup(req.Group)
}

// IssueChallenge creates a fresh single-use challenge for one call. The wire
// challenge is nonce ‖ actionHash, where the 32-byte nonce comes from
// protocol.CreateChallenge; it is passed verbatim to the library with
// webauthn.WithChallenge. It fails with no_eligible_credential when no
// approver of the group has a passkey allowed by the class.
func (s *Service) IssueChallenge(ctx context.Context, req ChallengeRequest) (Challenge, error) {
	if err := validateChallengeRequest(&req); err != nil {
		return Challenge{}, err
	}
	class, err := normalizeClass(req.AuthenticatorClass)
	if err != nil {
		return Challenge{}, err
	}
	var allow []protocol.CredentialDescriptor
	if req.Principal != "" {
		allow, err = s.PrincipalCredentials(ctx, req.Principal, class)
	} else {
		allow, err = s.eligibleDescriptors(ctx, req.Group, class)
	}
	if err != nil {
		return Challenge{}, err
	}
	if len(allow) == 0 {
		return Challenge{}, newError(ReasonNoEligibleCredential,
			fmt.Errorf("no passkey in group %q (principal set: %t) for class %q", req.Group, req.Principal != "", class))
	}

	nonce, err := protocol.CreateChallenge()
	if err != nil {
		return Challenge{}, fmt.Errorf("passkey: nonce: %w", err)
	}
	// A challenge for a decision binds it in its nonce (canon.DecisionNonce),
	// so that its assertion shows offline what the approver signed. One
	// that decides nothing (the inbox's) keeps the random nonce, and so does
	// an in-band one, which validation keeps from naming a decision:
	// SEP-2672 §4.4.3 wants its 32-byte nonce drawn from a CSPRNG, and it
	// can only approve its call (there is no in-band deny to pass off).
	if req.Decision != "" {
		if nonce, err = canon.DecisionNonce(nonce[:canon.NonceSize/2], req.Decision); err != nil {
			return Challenge{}, fmt.Errorf("passkey: nonce: %w", err)
		}
	}
	wire := make([]byte, 0, len(nonce)+canon.HashSize)
	wire = append(append(wire, nonce...), req.ActionHash[:]...)
	assertion, _, err := s.wa.BeginDiscoverableLogin(
		webauthn.WithChallenge(wire),
		webauthn.WithAllowedCredentials(allow),
		webauthn.WithUserVerification(protocol.VerificationRequired),
	)
	if err != nil {
		return Challenge{}, fmt.Errorf("passkey: begin login: %w", err)
	}

	now := s.now().UTC()
	ttl := s.challengeTTL
	if req.Principal != "" {
		ttl = s.inBandTTL
	}
	rec := challengeRecord{
		TaskID:             req.TaskID,
		Tool:               req.Tool,
		ActionHash:         req.ActionHash.String(),
		Nonce:              base64.RawURLEncoding.EncodeToString(nonce),
		Group:              req.Group,
		Principal:          req.Principal,
		AuthenticatorClass: class,
		Decision:           req.Decision,
		CreatedAt:          now,
		ExpiresAt:          now.Add(ttl),
	}
	// The browser's own timeout is the challenge's lifetime.
	assertion.Response.Timeout = int(ttl / time.Millisecond)
	if err := s.admitChallenge(ctx, req.Asker); err != nil {
		return Challenge{}, err
	}
	b, err := json.Marshal(&rec)
	if err != nil {
		return Challenge{}, fmt.Errorf("passkey: encode challenge: %w", err)
	}
	for range casAttempts {
		id := randomID(challengeIDSize)
		_, err := s.challenges.Create(ctx, id, b, jetstream.KeyTTL(challengeKeyTTL(ttl)))
		if isConflict(err) {
			continue // id collision: astronomically unlikely, try another
		}
		if isFull(err) {
			return Challenge{}, fmt.Errorf("%w: the bucket refused the challenge: %w", ErrChallengeCapacity, err)
		}
		if err != nil {
			return Challenge{}, fmt.Errorf("passkey: store challenge: %w", err)
		}
		s.adm.mu.Lock()
		s.adm.bytes += uint64(len(b) + challengeRecordOverhead)
		s.adm.mu.Unlock()
		s.log.InfoContext(ctx, "challenge issued", "challenge_id", id, "task_id", req.TaskID,
			"tool", req.Tool, "group", req.Group, "authenticator_class", class, "allowed_credentials", len(allow))
		return Challenge{
			ID:             id,
			DisplayText:    req.DisplayText,
			ExpiresAt:      rec.ExpiresAt,
			RequestOptions: assertion.Response,
		}, nil
	}
	return Challenge{}, errCASExhausted
}

// challengeKeyTTL is how long NATS keeps a challenge of lifetime ttl that
// is never answered: its lifetime and as long again, at most five minutes
// more, in whole seconds (at least one, NATS's least). Until then a late
// answer is told challenge_expired, after it challenge_unknown; either
// rejects. A consume rewrites the record without a TTL, so a consumed
// challenge is kept ChallengeRetention (the bucket's MaxAge) and its replay
// is challenge_consumed. Unanswered challenges, which anyone holding an
// approval link or an agent's credentials can ask for, thus hold the
// bucket minutes, not days.
func challengeKeyTTL(ttl time.Duration) time.Duration {
	d := ttl + min(ttl, 5*time.Minute)
	return max((d + time.Second - 1).Truncate(time.Second), time.Second)
}

// eligibleDescriptors lists the credentials of the group's approvers that the
// class allows, with their transports.
func (s *Service) eligibleDescriptors(ctx context.Context, group, class string) ([]protocol.CredentialDescriptor, error) {
	out, _, err := s.eligible(ctx, group, class, 0)
	return out, err
}

// EligibleApprovers counts the group's active approvers who hold an active
// passkey the authenticator class allows (the people who could decide a
// task of that requirement now), up to enough: it stops reading
// credentials once that many are found.
func (s *Service) EligibleApprovers(ctx context.Context, group, class string, enough int) (int, error) {
	_, n, err := s.eligible(ctx, group, class, enough)
	return n, err
}

// eligible returns the credentials of the group's active approvers that
// the class allows, and how many approvers hold at least one; with enough
// above 0, it stops at the approver that makes the count enough.
func (s *Service) eligible(ctx context.Context, group, class string, enough int) (descs []protocol.CredentialDescriptor, approvers int, err error) {
	all, err := s.Approvers(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, a := range all {
		if enough > 0 && approvers >= enough {
			break
		}
		if !inGroup(a, group) || !a.Active() {
			continue
		}
		creds, err := s.approverCredentials(ctx, a)
		if err != nil {
			return nil, 0, err
		}
		held := len(descs)
		for _, c := range creds {
			if c.active() && classAllows(class, c.Credential.Transport) {
				descs = append(descs, c.Credential.Descriptor())
			}
		}
		if len(descs) > held {
			approvers++
		}
	}
	return descs, approvers, nil
}

func inGroup(a Approver, group string) bool {
	for _, g := range a.Groups {
		if g == group {
			return true
		}
	}
	return false
}

// ChallengeAdmitBytes is how much of a challenges bucket of maxBytes
// (Options.ChallengeMaxBytes) the approver site's challenges
// (AskerApprover) may fill: seven eighths. The last eighth is kept for the
// consumes of the challenges already issued: a consume rewrites its record
// with the assertion (it grows), and NATS stores a write, even one that
// replaces a record, only if the bucket has room for the whole new record.
func ChallengeAdmitBytes(maxBytes int64) int64 { return maxBytes - maxBytes/8 }

// AgentChallengeAdmitBytes is how much of a challenges bucket of maxBytes
// agents' in-band challenges (AskerAgent) may fill: half. Agents choose
// how many challenges they ask for and, through the arguments, how large
// each one's display text is; the room from half to ChallengeAdmitBytes
// is only the approver site's, so agents, however many, cannot starve
// approvers of challenges.
func AgentChallengeAdmitBytes(maxBytes int64) int64 { return maxBytes / 2 }

// admissionRefresh is how long a reading of the challenges bucket's size
// stands in for a new one while the bucket is far from its limit.
const admissionRefresh = time.Second

// admission is what a process knows of the challenges bucket's size: the
// last reading (when, and its bytes) plus an upper estimate of what this
// process stored since. It spares IssueChallenge a stream-info request to
// NATS on every challenge while the bucket is an eighth of its cap or more
// below the asker's admission limit (under three eighths of the cap for
// an agent, three quarters for the approver site); nearer, every
// challenge of that asker reads the size.
type admission struct {
	mu    sync.Mutex
	at    time.Time // monotonic; zero until the first reading
	bytes uint64
}

// challengeRecordOverhead bounds a stored challenge record's size beyond
// its JSON (the stream's own subject and headers).
const challengeRecordOverhead = 1 << 10

// admitChallenge refuses a new challenge, with ErrChallengeCapacity, once
// the challenges bucket holds the asker's admission limit:
// AgentChallengeAdmitBytes for an agent, ChallengeAdmitBytes for the
// approver site. Concurrent issuers (and other replicas, between readings)
// may pass it together; the bucket's own cap still bounds them.
func (s *Service) admitChallenge(ctx context.Context, asker string) error {
	admit := AgentChallengeAdmitBytes(s.challengeMax)
	if asker == AskerApprover {
		admit = ChallengeAdmitBytes(s.challengeMax)
	} else {
		asker = AskerAgent
	}
	s.adm.mu.Lock()
	far := !s.adm.at.IsZero() && time.Since(s.adm.at) < admissionRefresh &&
		s.adm.bytes < uint64(admit-s.challengeMax/8)
	s.adm.mu.Unlock()
	if far {
		return nil
	}
	st, err := s.challenges.Status(ctx)
	if err != nil {
		return fmt.Errorf("passkey: challenges bucket status: %w", err)
	}
	s.adm.mu.Lock()
	s.adm.at, s.adm.bytes = time.Now(), st.Bytes()
	s.adm.mu.Unlock()
	if st.Bytes() >= uint64(admit) {
		s.log.WarnContext(ctx, "challenges bucket at capacity", "asker", asker, "bytes", st.Bytes(), "admit_bytes", admit, "max_bytes", s.challengeMax)
		return fmt.Errorf("%w: the challenges bucket holds %d bytes, the admission limit of an %s's challenge is %d of its cap %d",
			ErrChallengeCapacity, st.Bytes(), asker, admit, s.challengeMax)
	}
	return nil
}

// errCodeStreamStoreFailed is the JetStream API error code of a write the
// stream refused to store; "maximum bytes exceeded" says it is full.
const errCodeStreamStoreFailed = 10077

// isFull reports whether err is a bucket's refusal of a write for its
// MaxBytes.
func isFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamStoreFailed &&
		strings.Contains(apiErr.Description, "maximum bytes exceeded")
}
