package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/web"
)

// AdminFileName is the admin principal whose token --admin-token-file
// holds.
const AdminFileName = "admin"

// Who acted, in the admin records of the bootstrap.
const (
	byAdminInit = "cli:admin-init"
	byAdminFile = "server:admin-token-file"
)

// readAdminTokenFile reads a token file: the token, surrounding space
// trimmed.
func readAdminTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 32 || len(tok) > 256 || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("--admin-token-file %s: must hold one token of 32 to 256 characters without spaces (generate one with `openssl rand -base64 32`)", path)
	}
	return tok, nil
}

// registerAdminFile registers the admin token of --admin-token-file, at
// start: every replica does, with the same secret, and only the first
// changes anything. A new secret replaces and revokes the old one; a token
// revoked earlier stops the start. The change is recorded in the admin's
// audit chain when this process can sign.
func (a *App) registerAdminFile(ctx context.Context) error {
	tok, err := readAdminTokenFile(a.cfg.AdminTokenFile)
	if err != nil {
		return err
	}
	ch, err := a.Tokens.RegisterAdmin(ctx, tok, AdminFileName)
	if errors.Is(err, authn.ErrTokenRevoked) {
		return fmt.Errorf("--admin-token-file %s holds an admin token that was revoked (replaced by a newer one); give this replica the current secret", a.cfg.AdminTokenFile)
	}
	if err != nil {
		return fmt.Errorf("--admin-token-file: %w", err)
	}
	if !ch.Changed {
		return nil
	}
	a.log.Info("admin token registered from --admin-token-file", "admin", ch.Name, "token", ch.Fingerprint, "replaced", ch.Replaced)
	if !a.Audit.CanSign() {
		a.log.Error("admin token change NOT recorded in the audit log: this server has no audit signing keys (--audit-key-dir)", "admin", ch.Name, "token", ch.Fingerprint)
		return nil
	}
	if _, _, err := a.Audit.RecordAdmin(ctx, adminTokenAction(ch, byAdminFile), ch.Revision); err != nil {
		return fmt.Errorf("--admin-token-file: record in the audit log: %w", err)
	}
	return nil
}

func adminTokenAction(ch authn.AdminChange, by string) audit.AdminAction {
	action := audit.AdminTokenCreate
	if ch.Replaced != "" {
		action = audit.AdminTokenRotate
	}
	return audit.AdminAction{Action: action, Target: audit.AdminTarget{Type: audit.TargetAdmin, ID: ch.Name},
		Status: authn.StatusActive, By: by, Token: ch.Fingerprint, Replaced: ch.Replaced, At: ch.At}
}

// InitAdminOptions configures [InitAdmin].
type InitAdminOptions struct {
	// Name is the admin principal; empty means AdminFileName.
	Name string
	// Rotate replaces Name's token if there is one (and revokes it)
	// instead of refusing because an admin token exists.
	Rotate bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// InitAdminResult is what InitAdmin did.
type InitAdminResult struct {
	// Token is the new admin token, to show once. It is set whenever the
	// token was registered, even if recording it in the audit log failed
	// afterwards (InitAdmin's error then says so).
	Token       string
	Change      authn.AdminChange
	AuditChain  string
	AuditRecord string
	// AuditKeyDir is the directory of the key that signed the record.
	AuditKeyDir string
}

// InitAdmin creates the first admin token on the NATS cfg names, as
// `countersign admin init` does for a server that `dev` did not bootstrap.
// It connects as a server does (--nats-url, --nats-creds, TLS), refuses
// when an admin token exists unless opts.Rotate, and records the creation
// or rotation in the admin's audit chain, signed with the keys in
// cfg.AuditKeyDir (default DataDir/audit-keys, created if absent).
func InitAdmin(ctx context.Context, cfg Config, opts InitAdminOptions) (InitAdminResult, error) {
	cfg.Defaults()
	if cfg.NATSURL == "" {
		return InitAdminResult{}, errors.New("admin init needs --nats-url (NATS_URL), or --config with nats.url: the NATS your servers use")
	}
	if cfg.NATSReplicas < 1 || cfg.NATSReplicas > 5 {
		return InitAdminResult{}, fmt.Errorf("--nats-replicas must be 1 to 5, not %d", cfg.NATSReplicas)
	}
	name := opts.Name
	if name == "" {
		name = AdminFileName
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := cfg.AuditKeyDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, AuditKeyDir)
	}
	keys, err := audit.OpenKeyring(dir)
	if err != nil {
		return InitAdminResult{}, fmt.Errorf("admin init records the new token in the audit log and needs signing keys: %w", err)
	}
	a := &App{cfg: cfg, mode: ModeServer, log: log}
	if err := a.startNATS(ctx); err != nil {
		return InitAdminResult{}, err
	}
	defer func() {
		if err := a.nc.Drain(); err != nil {
			a.nc.Close()
		}
	}()
	js, err := jetstream.New(a.nc)
	if err != nil {
		return InitAdminResult{}, fmt.Errorf("jetstream: %w", err)
	}
	tokens, err := authn.Open(ctx, js, authn.Options{Replicas: cfg.NATSReplicas})
	if err != nil {
		return InitAdminResult{}, err
	}
	l, err := audit.Open(ctx, js, audit.Options{Keys: keys, Replicas: cfg.NATSReplicas, Logger: log})
	if err != nil {
		return InitAdminResult{}, err
	}
	tok, ch, err := tokens.InitAdmin(ctx, name, opts.Rotate)
	if errors.Is(err, authn.ErrAdminExists) {
		return InitAdminResult{}, fmt.Errorf("%w: admin init makes the first one; --rotate replaces %q's token (--name) and revokes the old one", err, name)
	}
	if err != nil {
		return InitAdminResult{}, err
	}
	res := InitAdminResult{Token: tok, Change: ch, AuditKeyDir: dir}
	chain, rec, err := l.RecordAdmin(ctx, adminTokenAction(ch, byAdminInit), ch.Revision)
	if err != nil {
		return res, fmt.Errorf("the admin token was created but not recorded in the audit log: %w", err)
	}
	res.AuditChain, res.AuditRecord = chain, rec.RecordRef
	return res, nil
}

// recordPasskeyEvent is the passkey services' Options.Record: the audit
// log is opened after them.
func (a *App) recordPasskeyEvent(ctx context.Context, e passkey.Event) error {
	return web.RecordPasskeyEvent(ctx, a.Audit, e)
}
