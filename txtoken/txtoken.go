package txtoken

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/canon"
)

// Buckets.
const (
	// KeyBucket holds each signing key in two records, its public half
	// (PKIX, under "pub.<kid>"), which verification reads, and its private
	// half (PKCS#8, under "key.<kid>"), which only signing reads and which
	// is purged PurgeAfter after the key's retirement ("retired.<kid>");
	// and the kid of the key that signs ("current").
	KeyBucket = "countersign_txtoken_keys"
	// UsedBucket holds one entry per consumed jti, created with a
	// compare-and-set; entries live UsedTTL.
	UsedBucket = "countersign_txtoken_used"
)

// Limits.
const (
	// MaxLifetime is the longest a token lives (exp - iat); the audit
	// verifier holds token chains to it.
	MaxLifetime = audit.TokenMaxLifetime
	// DefaultLifetime is a token's lifetime when Options.Lifetime is 0.
	DefaultLifetime = 60 * time.Second
	// DefaultSkew is the clock skew tolerated between replicas.
	DefaultSkew = 5 * time.Second
	// MaxSkew bounds Options.Skew; the audit verifier allows it around
	// a token's lifetime.
	MaxSkew = audit.TokenMaxSkew
	// UsedTTL is how long a consumed jti is remembered: longer than any
	// token lives plus the skew, so a jti is never forgotten while its
	// token could still pass the expiry check.
	UsedTTL = 5 * time.Minute
	// MaxTokenBytes bounds a presented token; a longer one is malformed.
	MaxTokenBytes = 4096
	// PurgeAfter is how long after its retirement a key's private half is
	// purged ([Service.PurgeRetired]): by then every token it signed is
	// refused (issued after the retirement, or expired, under the largest
	// skew any replica may allow), and the key signs nothing more. Its
	// public half stays, so those tokens keep their precise refusal.
	PurgeAfter = MaxLifetime + MaxSkew
)

// Algorithm is the one signature algorithm tokens use and accept.
const Algorithm = jose.EdDSA

// MetaKey is the tools/call params._meta key that carries a token.
const MetaKey = "io.countersign/transaction-token"

// Options configures [Open].
type Options struct {
	// ServerID is the issuer and the audience of every token: Countersign's
	// SEP-2672 server ID, the one the action hash binds. Required.
	ServerID string
	// Audit records every issuance and use. Required, with signing keys:
	// a token that cannot be audited is not issued and not used.
	Audit *audit.Log
	// Lifetime of an issued token (default and maximum 60 s).
	Lifetime time.Duration
	// Skew tolerated on iat and exp (default 5 s, at most 30 s).
	Skew time.Duration
	// Replicas of the buckets; 0 means 1.
	Replicas int
	// Now is the clock (tests); nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Service issues, verifies and consumes transaction tokens. Every replica
// opens the same buckets: any one may issue, all verify, exactly one
// consumes a given jti.
type Service struct {
	opts Options
	log  *slog.Logger
	keys jetstream.KeyValue
	used jetstream.KeyValue

	mu      sync.RWMutex
	signer  jose.Signer
	current string
	pubs    map[string]ed25519.PublicKey
}

// Open opens (creating if needed) the buckets and loads the signing key,
// creating the first one when there is none. Replicas race safely: the
// first "current" written wins and the others load it.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Service, error) {
	switch {
	case opts.ServerID == "":
		return nil, errors.New("txtoken: ServerID is required")
	case opts.Audit == nil:
		return nil, errors.New("txtoken: Audit is required")
	case opts.Lifetime < 0 || (opts.Lifetime > 0 && opts.Lifetime < time.Second) || opts.Lifetime > MaxLifetime:
		return nil, fmt.Errorf("txtoken: Lifetime must be from 1s to %v", MaxLifetime)
	case opts.Skew < 0 || opts.Skew > MaxSkew:
		return nil, fmt.Errorf("txtoken: Skew must be from 0 to %v", MaxSkew)
	}
	if opts.Lifetime == 0 {
		opts.Lifetime = DefaultLifetime
	}
	if opts.Skew == 0 {
		opts.Skew = DefaultSkew
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := max(opts.Replicas, 1)
	keys, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: KeyBucket, Description: "Countersign transaction-token signing keys",
		History: 1, Storage: jetstream.FileStorage, Replicas: rep,
	})
	if err != nil {
		return nil, fmt.Errorf("txtoken: key bucket: %w", err)
	}
	used, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: UsedBucket, Description: "Countersign consumed transaction-token IDs",
		History: 1, Storage: jetstream.FileStorage, Replicas: rep, TTL: UsedTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("txtoken: used bucket: %w", err)
	}
	s := &Service{opts: opts, log: log, keys: keys, used: used, pubs: map[string]ed25519.PublicKey{}}
	if err := s.loadCurrent(ctx); err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := s.PurgeRetired(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// KeyID derives a key ID from an Ed25519 public key, as the audit keys do.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519-" + hex.EncodeToString(sum[:16])
}

var kidRE = regexp.MustCompile(`^ed25519-[0-9a-f]{32}$`)

const currentKey = "current"

// Key records: a key's public half, its private half, its retirement.
const (
	pubPrefix     = "pub."
	privPrefix    = "key."
	retiredPrefix = "retired."
)

// newKey generates a signing key and stores it under its kid (not yet
// current): the public half first, so that no key of this version exists
// without it.
func (s *Service) newKey(ctx context.Context) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	kid := KeyID(pub)
	if err := s.storePublic(ctx, kid, pub); err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	if _, err := s.keys.Create(ctx, privPrefix+kid, der); err != nil {
		return "", fmt.Errorf("txtoken: store key: %w", err)
	}
	return kid, nil
}

// storePublic writes kid's public half, create-only: a record already
// there is the same key's (a kid is the hash of its public key, and
// readPublic checks it).
func (s *Service) storePublic(ctx context.Context, kid string, pub ed25519.PublicKey) error {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return err
	}
	if _, err := s.keys.Create(ctx, pubPrefix+kid, der); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("txtoken: store public key %s: %w", kid, err)
	}
	return nil
}

// migrate gives every key stored before the keys were split (a private
// half alone, "key.<kid>") its public half, so that verification never
// needs the private one. It runs at Open; a key an older replica adds
// later is migrated when first verified (publicKey).
func (s *Service) migrate(ctx context.Context) error {
	kids, err := s.listKids(ctx, privPrefix)
	if err != nil {
		return err
	}
	for _, kid := range kids {
		if _, err := s.readPublic(ctx, kid); !errors.Is(err, jetstream.ErrKeyNotFound) {
			if err != nil {
				return err
			}
			continue
		}
		priv, err := s.privateKey(ctx, kid)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // purged meanwhile, by a replica that stored its public half first
		}
		if err != nil {
			return err
		}
		if err := s.storePublic(ctx, kid, priv.Public().(ed25519.PublicKey)); err != nil {
			return err
		}
		s.log.InfoContext(ctx, "txtoken: stored the public half of a key of the old shape", "kid", kid)
	}
	return nil
}

// listKids lists the kids of the records under prefix.
func (s *Service) listKids(ctx context.Context, prefix string) ([]string, error) {
	l, err := s.keys.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return nil, fmt.Errorf("txtoken: list keys: %w", err)
	}
	defer func() { _ = l.Stop() }()
	var kids []string
	for k := range l.Keys() {
		if kid := strings.TrimPrefix(k, prefix); kidRE.MatchString(kid) {
			kids = append(kids, kid)
		}
	}
	return kids, ctx.Err()
}

// loadCurrent loads the signing key named by "current", creating a key
// (and "current") when the bucket has none.
func (s *Service) loadCurrent(ctx context.Context) error {
	e, err := s.keys.Get(ctx, currentKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		kid, kerr := s.newKey(ctx)
		if kerr != nil {
			return kerr
		}
		if _, err := s.keys.Create(ctx, currentKey, []byte(kid)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("txtoken: store current key: %w", err)
		}
		// Another replica may have won: read what is current.
		e, err = s.keys.Get(ctx, currentKey)
	}
	if err != nil {
		return fmt.Errorf("txtoken: read current key: %w", err)
	}
	return s.use(ctx, string(e.Value()))
}

// use makes kid the key this process signs with.
func (s *Service) use(ctx context.Context, kid string) error {
	priv, err := s.privateKey(ctx, kid)
	if err != nil {
		return err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: Algorithm, Key: priv},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return fmt.Errorf("txtoken: signer: %w", err)
	}
	s.mu.Lock()
	s.signer, s.current = signer, kid
	s.pubs[kid] = priv.Public().(ed25519.PublicKey)
	s.mu.Unlock()
	return nil
}

// privateKey reads a key's private half from the bucket and checks that
// it is the key its name says. Only signing (use) and the migration of a
// key of the old shape read it; verification reads the public half.
func (s *Service) privateKey(ctx context.Context, kid string) (ed25519.PrivateKey, error) {
	if !kidRE.MatchString(kid) {
		return nil, fmt.Errorf("txtoken: bad key id %q", kid)
	}
	e, err := s.keys.Get(ctx, privPrefix+kid)
	if err != nil {
		return nil, fmt.Errorf("txtoken: read key %s: %w", kid, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(e.Value())
	if err != nil {
		return nil, fmt.Errorf("txtoken: key %s: %w", kid, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok || KeyID(priv.Public().(ed25519.PublicKey)) != kid {
		return nil, fmt.Errorf("txtoken: key %s is not the Ed25519 key its name says", kid)
	}
	return priv, nil
}

// readPublic reads a key's public half from the bucket and checks that it
// is the key its name says.
func (s *Service) readPublic(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	e, err := s.keys.Get(ctx, pubPrefix+kid)
	if err != nil {
		return nil, fmt.Errorf("txtoken: read public key %s: %w", kid, err)
	}
	k, err := x509.ParsePKIXPublicKey(e.Value())
	if err != nil {
		return nil, fmt.Errorf("txtoken: public key %s: %w", kid, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok || KeyID(pub) != kid {
		return nil, fmt.Errorf("txtoken: public key %s is not the Ed25519 key its name says", kid)
	}
	return pub, nil
}

// publicKey resolves a kid for verification: the keys this process has
// seen, else the key's public half in the bucket (a key another replica
// created). errUnknownKey when neither has it. The private half is read
// only for a key without a public half, which a replica of an older
// version created after this one's migration; its public half is then
// stored.
func (s *Service) publicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	s.mu.RLock()
	pub, ok := s.pubs[kid]
	s.mu.RUnlock()
	if ok {
		return pub, nil
	}
	if !kidRE.MatchString(kid) {
		return nil, errUnknownKey
	}
	pub, err := s.readPublic(ctx, kid)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		priv, perr := s.privateKey(ctx, kid)
		if errors.Is(perr, jetstream.ErrKeyNotFound) {
			return nil, errUnknownKey
		}
		if perr != nil {
			return nil, perr
		}
		pub, err = priv.Public().(ed25519.PublicKey), nil
		if serr := s.storePublic(ctx, kid, pub); serr != nil {
			s.log.WarnContext(ctx, "txtoken: store the public half of a key of the old shape", "kid", kid, "err", serr)
		}
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.pubs[kid] = pub
	s.mu.Unlock()
	return pub, nil
}

var errUnknownKey = errors.New("txtoken: unknown key")

// CurrentKeyID is the kid of the key that signs new tokens.
func (s *Service) CurrentKeyID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.current
}

// Claims are a token's claims. Tool and ParametersHash sit under "mcp", as
// the Zero-Trust MCP Handshake RFC's ephemeral token claims do.
type Claims struct {
	Issuer   string `json:"iss"`
	Subject  string `json:"sub"`
	Audience string `json:"aud"`
	Expiry   int64  `json:"exp"`
	IssuedAt int64  `json:"iat"`
	ID       string `json:"jti"`
	MCP      MCP    `json:"mcp"`
}

// MCP are the MCP-specific claims: the one call the token authorizes.
type MCP struct {
	Tool           string `json:"tool"`
	ParametersHash string `json:"parameters_hash"` // the SEP-2672 action hash, hex
}

// Request asks for a token for one exact call.
type Request struct {
	Principal string          // the sub: the agent that will make the call
	Tool      string          // as Countersign serves it
	Arguments json.RawMessage // exactly as the call will send them
	// IssuedBy says who asked: "agent:<principal>" over MCP, or
	// "admin:<name>" over the admin API.
	IssuedBy      string
	PolicyVersion string
}

// Issued is a token and what it binds.
type Issued struct {
	Token          string    `json:"token"`
	JTI            string    `json:"jti"`
	KeyID          string    `json:"kid"`
	Principal      string    `json:"sub"`
	Tool           string    `json:"tool"`
	ParametersHash string    `json:"parameters_hash"`
	IssuedAt       time.Time `json:"issued_at"`
	ExpiresAt      time.Time `json:"expires_at"`
}

var jtiRE = regexp.MustCompile(`^txt_[0-9a-f]{32}$`)

func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Issue signs a token for r and records its issuance; a token whose
// issuance could not be recorded is not returned. Policy (who may ask for
// which call) is the caller's to check.
func (s *Service) Issue(ctx context.Context, r Request) (Issued, error) {
	if r.Principal == "" || r.Tool == "" || r.IssuedBy == "" {
		return Issued{}, errors.New("txtoken: principal, tool and issuer are required")
	}
	hash, err := canon.Hash(r.Tool, r.Arguments, s.opts.ServerID)
	if errors.Is(err, canon.ErrInexactNumber) {
		return Issued{}, fmt.Errorf("%w: invalid arguments for tool %s: %s", ErrInvalidRequest, r.Tool, strings.TrimPrefix(err.Error(), "canon: "))
	}
	if err != nil {
		return Issued{}, err
	}
	now := s.opts.Now().UTC().Truncate(time.Second)
	exp := now.Add(s.opts.Lifetime)
	c := Claims{
		Issuer: s.opts.ServerID, Subject: r.Principal, Audience: s.opts.ServerID,
		IssuedAt: now.Unix(), Expiry: exp.Unix(), ID: newID("txt_"),
		MCP: MCP{Tool: r.Tool, ParametersHash: hash.String()},
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return Issued{}, err
	}
	// Follow a rotation made on any replica: one read of "current".
	if e, err := s.keys.Get(ctx, currentKey); err != nil {
		return Issued{}, fmt.Errorf("txtoken: read current key: %w", err)
	} else if cur := string(e.Value()); cur != s.CurrentKeyID() {
		if err := s.use(ctx, cur); err != nil {
			return Issued{}, err
		}
	}
	s.mu.RLock()
	signer, kid := s.signer, s.current
	s.mu.RUnlock()
	jws, err := signer.Sign(payload)
	if err != nil {
		return Issued{}, fmt.Errorf("txtoken: sign: %w", err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		return Issued{}, fmt.Errorf("txtoken: serialize: %w", err)
	}
	env, err := audit.NewEnvelope(r.Tool, r.Arguments, hash.String(), r.Principal, "tool:"+r.Tool, s.opts.ServerID, now, s.opts.Audit.Redact())
	if err != nil {
		return Issued{}, err
	}
	if err := s.record(ctx, c.ID, audit.Step{ID: audit.StepTokenIssued, Kind: audit.KindTokenIssued, At: now, Body: audit.TokenIssued{
		JTI: c.ID, KeyID: kid, Envelope: env, IssuedBy: r.IssuedBy, PolicyVersion: r.PolicyVersion,
		IssuedAt: now, ExpiresAt: exp,
	}}); err != nil {
		return Issued{}, fmt.Errorf("txtoken: audit issuance: %w", err)
	}
	s.log.InfoContext(ctx, "txtoken: issued", "jti", c.ID, "principal", r.Principal, "tool", r.Tool, "action_hash", hash.String(), "issued_by", r.IssuedBy)
	return Issued{Token: tok, JTI: c.ID, KeyID: kid, Principal: r.Principal, Tool: r.Tool,
		ParametersHash: hash.String(), IssuedAt: now, ExpiresAt: exp}, nil
}

// ErrInvalidRequest marks a token request that names no known tool or
// whose arguments do not validate, or hold a number the action hash cannot
// bind exactly (canon.ErrInexactNumber); its message is safe to show the
// caller.
var ErrInvalidRequest = errors.New("txtoken: invalid token request")

// Rotation is what [Service.Rotate] did.
type Rotation struct {
	// KeyID is the key that signs from now on.
	KeyID string
	// Retired is the key this rotation replaced and retired; empty when a
	// concurrent rotation won (it made KeyID current and retires the old
	// key itself).
	Retired string
}

// Rotate makes a new signing key current, for every replica (each follows
// "current" when it next issues), and retires the one it replaces: a token
// of a retired key verifies only if it was issued before the retirement, so
// once the last of them has expired (MaxLifetime plus the skew) the old key
// can mint nothing that passes. Concurrent rotations are safe: "current"
// moves by compare-and-set, and the loser's key is retired at once, unused.
//
// A failed compare-and-set is judged by what "current" holds afterwards,
// since a timeout may come after the write landed: the new key current
// means the rotation happened; a revision conflict with another new key
// current means another rotation won; anything else is an error, and no
// key is retired. A key that is current is never retired.
func (s *Service) Rotate(ctx context.Context) (Rotation, error) {
	e, err := s.keys.Get(ctx, currentKey)
	if err != nil {
		return Rotation{}, fmt.Errorf("txtoken: read current key: %w", err)
	}
	old := string(e.Value())
	kid, err := s.newKey(ctx)
	if err != nil {
		return Rotation{}, err
	}
	now := s.opts.Now().UTC()
	out, retire := Rotation{KeyID: kid, Retired: old}, old
	if _, err := s.keys.Update(ctx, currentKey, []byte(kid), e.Revision()); err != nil {
		ce, gerr := s.keys.Get(ctx, currentKey)
		if gerr != nil {
			return Rotation{}, fmt.Errorf("txtoken: make %s current: %w (then reading the current key: %v)", kid, err, gerr)
		}
		switch cur := string(ce.Value()); {
		case cur == kid:
			// The write landed; its answer was lost.
		case !errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			return Rotation{}, fmt.Errorf("txtoken: make %s current: %w", kid, err)
		case cur == old:
			return Rotation{}, fmt.Errorf("txtoken: make %s current: a revision conflict, yet %s is still current: %w", kid, old, err)
		default:
			// Another rotation won: this key never signed anything.
			out, retire = Rotation{KeyID: cur}, kid
		}
	}
	if _, err := s.keys.Create(ctx, retiredPrefix+retire, []byte(now.Format(time.RFC3339Nano))); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return Rotation{}, fmt.Errorf("txtoken: retire key %s: %w (the next purge of retired keys retires it)", retire, err)
	}
	if err := s.use(ctx, out.KeyID); err != nil {
		return Rotation{}, err
	}
	s.log.InfoContext(ctx, "txtoken: signing key rotated", "kid", out.KeyID, "retired", retire)
	return out, nil
}

// retiredAt returns when kid was retired, or the zero time for a key in
// use. It is read for every redemption, so a retirement on any replica
// counts at once everywhere.
func (s *Service) retiredAt(ctx context.Context, kid string) (time.Time, error) {
	e, err := s.keys.Get(ctx, retiredPrefix+kid)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("txtoken: read retirement of %s: %w", kid, err)
	}
	t, err := time.Parse(time.RFC3339Nano, string(e.Value()))
	if err != nil {
		return time.Time{}, fmt.Errorf("txtoken: retirement of %s: %w", kid, err)
	}
	return t, nil
}

// PurgeRetired purges the private half of every key retired at least
// PurgeAfter ago, and returns their kids. By then no token of the key
// passes verification, which needs only the public half (kept, so that
// such a token is still refused as expired or retired, not as unknown).
// A key whose public half cannot be stored keeps its private half, and a
// key that is current is never purged. Open runs it; a server runs it
// periodically, on every replica (a purge is idempotent).
//
// It first retires the keys a rotation left behind unretired (see
// [Service.retireStranded]), so that a rotation that failed halfway does
// not leave a key able to sign for ever.
func (s *Service) PurgeRetired(ctx context.Context) ([]string, error) {
	// The keys that still have a private half: the work does not grow
	// with every retirement ever made.
	kids, err := s.listKids(ctx, privPrefix)
	if err != nil {
		return nil, err
	}
	cur, err := s.keys.Get(ctx, currentKey)
	if err != nil {
		return nil, fmt.Errorf("txtoken: read current key: %w", err)
	}
	now := s.opts.Now()
	var purged []string
	for _, kid := range kids {
		retired, err := s.retiredAt(ctx, kid)
		if err != nil {
			return purged, err
		}
		if retired.IsZero() && kid != string(cur.Value()) {
			if retired, err = s.retireStranded(ctx, kid, cur); err != nil {
				return purged, err
			}
		}
		if retired.IsZero() || now.Before(retired.Add(PurgeAfter)) || kid == string(cur.Value()) {
			continue
		}
		priv, err := s.privateKey(ctx, kid)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // purged meanwhile, by another replica
		}
		if err != nil {
			return purged, err
		}
		if err := s.storePublic(ctx, kid, priv.Public().(ed25519.PublicKey)); err != nil {
			return purged, err
		}
		if err := s.keys.Purge(ctx, privPrefix+kid); err != nil {
			return purged, fmt.Errorf("txtoken: purge the private half of retired key %s: %w", kid, err)
		}
		purged = append(purged, kid)
		s.log.InfoContext(ctx, "txtoken: purged the private half of a retired key", "kid", kid, "retired_at", retired)
	}
	return purged, nil
}

// retireStranded retires kid, a key that is not current and has no
// retirement, if it can never become current: its private half was
// written before "current" last moved (the bucket's revisions are one
// sequence). Such a key is the one a rotation moved "current" away from
// and then failed to retire, or a rotation's new key whose
// compare-and-set failed; either signs nothing more. A key written after
// "current" last moved may be a rotation's in progress and is left alone.
// The retirement is dated when "current" moved, or now if that is later
// by this process's clock. It returns the retirement, or the zero time
// when kid is left alone.
func (s *Service) retireStranded(ctx context.Context, kid string, cur jetstream.KeyValueEntry) (time.Time, error) {
	e, err := s.keys.Get(ctx, privPrefix+kid)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil // purged meanwhile
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("txtoken: read key %s: %w", kid, err)
	}
	if e.Revision() > cur.Revision() {
		return time.Time{}, nil
	}
	at := cur.Created()
	if now := s.opts.Now(); now.Before(at) {
		at = now
	}
	at = at.UTC()
	if _, err := s.keys.Create(ctx, retiredPrefix+kid, []byte(at.Format(time.RFC3339Nano))); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return time.Time{}, fmt.Errorf("txtoken: retire stranded key %s: %w", kid, err)
	}
	s.log.WarnContext(ctx, "txtoken: retired a key a rotation left unretired", "kid", kid, "retired_at", at)
	return s.retiredAt(ctx, kid)
}
