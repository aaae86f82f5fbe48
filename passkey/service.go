package passkey

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket names. All state lives in these JetStream key-value buckets so every
// replica of the server shares it.
const (
	BucketApprovers   = "countersign_approvers"
	BucketInvites     = "countersign_invites"
	BucketCredentials = "countersign_credentials"
	BucketChallenges  = "countersign_challenges"
)

// Defaults and limits.
const (
	DefaultChallengeTTL = 5 * time.Minute
	// DefaultInBandChallengeTTL is the SEP-2672 §4.4.3 default for the
	// challenges of approval/challenge/create.
	DefaultInBandChallengeTTL = 60 * time.Second
	DefaultInviteTTL          = 72 * time.Hour
	// MaxChallengeTTL bounds ChallengeTTL so that the challenges bucket's
	// housekeeping age (ChallengeRetention) always outlives a challenge.
	MaxChallengeTTL = 24 * time.Hour
	// enrollmentTTL is how long a registration challenge from BeginEnrollment
	// stays valid (SEP-2672 §4.4.1 SHOULD default).
	enrollmentTTL = 5 * time.Minute
	// ChallengeRetention is the challenges bucket MaxAge: how long a
	// consumed challenge is kept. Expiry is always checked on read; a
	// purged challenge reads as unknown, which still rejects. A consumed
	// challenge is purged this long after its consume; until then the same
	// signed evidence is its own consumer's (VerifyRequest.ConsumerKey), so
	// the task store keeps a verified call's task record longer
	// (tasks.RetentionGrace). A challenge never answered goes much sooner:
	// see challengeKeyTTL.
	ChallengeRetention = 2 * MaxChallengeTTL
	// challengeMarkerTTL is how long the challenges bucket keeps the delete
	// marker NATS writes when a key ages out (KeyValueConfig.LimitMarkerTTL,
	// which also turns on per-key TTLs). Nothing reads the markers.
	challengeMarkerTTL = time.Minute
	// casAttempts bounds compare-and-set retry loops.
	casAttempts = 16
	// DefaultChallengeMaxBytes is the challenges bucket's size cap when
	// Options.ChallengeMaxBytes is 0, and MinChallengeMaxBytes its least:
	// its last eighth (ChallengeAdmitBytes) then holds a score of consumes
	// of the largest challenges (4 KB of display text, plus the assertion).
	DefaultChallengeMaxBytes = 256 << 20
	MinChallengeMaxBytes     = 1 << 20
)

// Options configures a [Service]. The zero value of each optional field is
// documented next to it.
type Options struct {
	// RPID is the WebAuthn relying party id, a registrable domain such as
	// "approvals.example.com" or "localhost". Required.
	RPID string
	// RPOrigins are the origins the approver site is served from, such as
	// "https://approvals.example.com". At least one is required; each host must
	// equal RPID or be a subdomain of it. http is accepted only for localhost.
	RPOrigins []string
	// RPDisplayName is shown by authenticators. Empty means "Countersign".
	RPDisplayName string
	// ChallengeTTL is how long an issued approval challenge is accepted.
	// Zero means DefaultChallengeTTL; at most MaxChallengeTTL.
	ChallengeTTL time.Duration
	// InBandChallengeTTL is how long an in-band challenge
	// (ChallengeRequest.Principal) is accepted. Zero means
	// DefaultInBandChallengeTTL; at most MaxChallengeTTL.
	InBandChallengeTTL time.Duration
	// InBandEnrollment says who may enroll a passkey in-band (SEP-2672
	// approval/enroll/*, authorized by the bearer token alone):
	// EnrollOpen (the zero value), EnrollFirst or EnrollClosed. Approver-site
	// enrollments (invites) are not affected.
	InBandEnrollment string
	// InviteTTL is how long an enrollment invite is valid. Zero means DefaultInviteTTL.
	InviteTTL time.Duration
	// ChallengeMaxBytes caps the challenges bucket (its MaxBytes, applied
	// to an existing bucket too). IssueChallenge refuses with
	// ErrChallengeCapacity an agent's challenge once the bucket holds
	// AgentChallengeAdmitBytes of it, and the approver site's once it
	// holds ChallengeAdmitBytes; the rest is kept for the consumes of the
	// challenges already issued. Nothing stored is ever evicted. Zero
	// means DefaultChallengeMaxBytes; at least MinChallengeMaxBytes.
	ChallengeMaxBytes int64
	// Replicas is the JetStream replica count of the buckets. Zero means 1;
	// use 3 on a production NATS cluster.
	Replicas int
	// IgnoreUnsolicitedExtensions accepts (and ignores) client extension
	// outputs the server did not request, instead of failing the ceremony.
	// They are unsigned client data this package never uses; some MCP
	// clients' authenticators (such as the SEP-2672 reference's test
	// emulator) return credProps unasked. For the in-band ceremony, run by
	// clients outside Countersign's control.
	IgnoreUnsolicitedExtensions bool
	// Record is given every change to who can approve (an approver added,
	// an enrollment invite issued, a passkey enrolled) before it takes
	// effect; an error refuses the change, and nothing of it is stored
	// (record.go). Nil records nothing.
	Record func(context.Context, Event) error
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
	// Now is the clock, for tests. Nil means time.Now.
	Now func() time.Time
}

// Service manages approvers, their passkeys and SEP-2672 challenges. It is
// safe for concurrent use, and any number of Services (in one process or in
// several replicas) may share the same NATS buckets.
type Service struct {
	wa           *webauthn.WebAuthn
	rpID         string
	challengeTTL time.Duration
	inBandTTL    time.Duration
	inviteTTL    time.Duration
	// challengeMax is the challenges bucket's MaxBytes.
	challengeMax int64
	adm          admission
	log          *slog.Logger
	now          func() time.Time
	recordFn     func(context.Context, Event) error
	enrollment   string // Options.InBandEnrollment, never empty

	approvers   jetstream.KeyValue
	invites     jetstream.KeyValue
	credentials jetstream.KeyValue
	challenges  jetstream.KeyValue
	dir         *directory // the approvers bucket in memory; see directory.go
}

// New validates opts and creates (or updates) the buckets. A bad relying
// party configuration fails here rather than at the first ceremony.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Service, error) {
	if js == nil {
		return nil, errors.New("passkey: nil JetStream")
	}
	if err := validateRP(opts.RPID, opts.RPOrigins); err != nil {
		return nil, err
	}
	s := &Service{
		rpID:         opts.RPID,
		challengeTTL: opts.ChallengeTTL,
		inBandTTL:    opts.InBandChallengeTTL,
		inviteTTL:    opts.InviteTTL,
		log:          opts.Logger,
		now:          opts.Now,
		recordFn:     opts.Record,
		enrollment:   opts.InBandEnrollment,
	}
	switch s.enrollment {
	case "":
		s.enrollment = EnrollOpen
	case EnrollOpen, EnrollFirst, EnrollClosed:
	default:
		return nil, fmt.Errorf("passkey: InBandEnrollment %q must be %s, %s or %s", opts.InBandEnrollment, EnrollOpen, EnrollFirst, EnrollClosed)
	}
	if s.challengeTTL == 0 {
		s.challengeTTL = DefaultChallengeTTL
	}
	if s.challengeTTL < 0 || s.challengeTTL > MaxChallengeTTL {
		return nil, fmt.Errorf("passkey: ChallengeTTL must be in (0, %s]", MaxChallengeTTL)
	}
	if s.inBandTTL == 0 {
		s.inBandTTL = DefaultInBandChallengeTTL
	}
	if s.inBandTTL < 0 || s.inBandTTL > MaxChallengeTTL {
		return nil, fmt.Errorf("passkey: InBandChallengeTTL must be in (0, %s]", MaxChallengeTTL)
	}
	if s.inviteTTL == 0 {
		s.inviteTTL = DefaultInviteTTL
	}
	if s.inviteTTL < 0 {
		return nil, errors.New("passkey: InviteTTL must be positive")
	}
	s.challengeMax = opts.ChallengeMaxBytes
	if s.challengeMax == 0 {
		s.challengeMax = DefaultChallengeMaxBytes
	}
	if s.challengeMax < MinChallengeMaxBytes {
		return nil, fmt.Errorf("passkey: ChallengeMaxBytes %d is under the minimum, %d", opts.ChallengeMaxBytes, MinChallengeMaxBytes)
	}
	if opts.Replicas < 0 || opts.Replicas > 5 {
		return nil, errors.New("passkey: Replicas must be between 0 and 5")
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	name := opts.RPDisplayName
	if name == "" {
		name = "Countersign"
	}
	residentKey := false
	unsolicited := protocol.UnsolicitedOutputPolicyReject
	if opts.IgnoreUnsolicitedExtensions {
		unsolicited = protocol.UnsolicitedOutputPolicyIgnore
	}
	wa, err := webauthn.New(&webauthn.Config{
		RPID:          opts.RPID,
		RPDisplayName: name,
		RPOrigins:     append([]string(nil), opts.RPOrigins...),
		AuthenticatorSelection: protocol.AuthenticatorSelection{
			RequireResidentKey: &residentKey,
			ResidentKey:        protocol.ResidentKeyRequirementPreferred,
			UserVerification:   protocol.VerificationRequired,
		},
		AttestationPreference:             protocol.PreferNoAttestation,
		ExtensionsUnsolicitedOutputPolicy: unsolicited,
		// Expiry is enforced by this package against s.now, not by the
		// library's wall clock, so Enforce stays false.
		Timeouts: webauthn.TimeoutsConfig{
			Login:        webauthn.TimeoutConfig{Timeout: s.challengeTTL, TimeoutUVD: s.challengeTTL},
			Registration: webauthn.TimeoutConfig{Timeout: enrollmentTTL, TimeoutUVD: enrollmentTTL},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("passkey: webauthn config: %w", err)
	}
	s.wa = wa

	replicas := max(opts.Replicas, 1)
	buckets := []struct {
		dst      *jetstream.KeyValue
		name     string
		desc     string
		maxAge   time.Duration
		maxBytes int64
		// markerTTL (KeyValueConfig.LimitMarkerTTL) turns on per-key
		// TTLs; an existing bucket gets them too: NATS allows turning
		// them on, never off.
		markerTTL time.Duration
	}{
		{&s.approvers, BucketApprovers, "Countersign approvers", 0, 0, 0},
		{&s.invites, BucketInvites, "Countersign enrollment invites (keyed by token hash)", 0, 0, 0},
		{&s.credentials, BucketCredentials, "Countersign WebAuthn credentials", 0, 0, 0},
		// A KV bucket discards new writes when full (DiscardNew), never
		// old ones: a consumed challenge is never evicted, so it is never
		// replayable.
		{&s.challenges, BucketChallenges, "Countersign SEP-2672 challenges", ChallengeRetention, s.challengeMax, challengeMarkerTTL},
	}
	for _, b := range buckets {
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         b.name,
			Description:    b.desc,
			History:        1,
			TTL:            b.maxAge,
			MaxBytes:       b.maxBytes,
			Storage:        jetstream.FileStorage,
			Replicas:       replicas,
			LimitMarkerTTL: b.markerTTL,
		})
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			return nil, fmt.Errorf("passkey: bucket %s: unanswered challenges age out by per-key TTL, which needs NATS server 2.11 or later; this one is %s: %w",
				b.name, js.Conn().ConnectedServerVersion(), err)
		}
		if err != nil {
			return nil, fmt.Errorf("passkey: bucket %s: %w", b.name, err)
		}
		*b.dst = kv
	}
	s.dir = newDirectory(s.approvers)
	return s, nil
}

// validateRP checks the relying party id and origins: each origin must parse,
// have no path, query or credentials, use https (http only for localhost),
// and its host must equal the RP id or be a subdomain of it.
func validateRP(rpID string, origins []string) error {
	if rpID == "" {
		return errors.New("passkey: RPID is required")
	}
	if rpID != strings.ToLower(rpID) || strings.ContainsAny(rpID, ":/ ") || net.ParseIP(rpID) != nil {
		return fmt.Errorf("passkey: RPID %q must be a lowercase domain name without scheme or port", rpID)
	}
	if err := protocol.ValidateRPID(rpID); err != nil {
		return fmt.Errorf("passkey: RPID %q: %w", rpID, err)
	}
	if len(origins) == 0 {
		return errors.New("passkey: at least one RP origin is required")
	}
	for _, o := range origins {
		u, err := url.Parse(o)
		if err != nil {
			return fmt.Errorf("passkey: RP origin %q: %w", o, err)
		}
		if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return fmt.Errorf("passkey: RP origin %q must be scheme://host[:port] only", o)
		}
		host := strings.ToLower(u.Hostname())
		if host == "" {
			return fmt.Errorf("passkey: RP origin %q has no host", o)
		}
		local := host == "localhost" || strings.HasSuffix(host, ".localhost")
		switch {
		case u.Scheme == "https":
		case u.Scheme == "http" && local:
		default:
			return fmt.Errorf("passkey: RP origin %q must use https (http only for localhost)", o)
		}
		if host != rpID && !strings.HasSuffix(host, "."+rpID) {
			return fmt.Errorf("passkey: RP origin %q is not within RPID %q", o, rpID)
		}
	}
	return nil
}

// randomID returns n random bytes, hex encoded: a valid KV key.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// isHexID reports whether s looks like an id from randomID(16).
func isHexID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// errNoChange lets a casUpdate mutation skip the write.
var errNoChange = errors.New("passkey: no change")

// errCASExhausted is returned when a compare-and-set loop keeps losing races.
var errCASExhausted = errors.New("passkey: too much contention on key")

func isNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// getJSON reads key into v and returns its revision.
func getJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("passkey: decode %s/%s: %w", kv.Bucket(), key, err)
	}
	return e.Revision(), nil
}

// createJSON stores v under key only if the key does not exist.
func createJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("passkey: encode: %w", err)
	}
	return kv.Create(ctx, key, b)
}

// putJSON stores v under key whatever was there.
func putJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("passkey: encode: %w", err)
	}
	return kv.Put(ctx, key, b)
}

// updateJSON stores v under key only if the key is still at revision rev.
func updateJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("passkey: encode: %w", err)
	}
	return kv.Update(ctx, key, b, rev)
}

// casUpdate reads key, applies fn and writes it back at the read revision,
// retrying when another writer got there first. fn must be safe to run more
// than once; it returns errNoChange to skip the write.
func casUpdate[T any](ctx context.Context, kv jetstream.KeyValue, key string, fn func(*T) error) (T, error) {
	for range casAttempts {
		var v T
		rev, err := getJSON(ctx, kv, key, &v)
		if err != nil {
			return v, err
		}
		if err := fn(&v); err != nil {
			if errors.Is(err, errNoChange) {
				return v, nil
			}
			return v, err
		}
		_, err = updateJSON(ctx, kv, key, &v, rev)
		if err == nil {
			return v, nil
		}
		if !isConflict(err) {
			return v, err
		}
		if err := ctx.Err(); err != nil {
			return v, err
		}
	}
	var zero T
	return zero, errCASExhausted
}
