package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
)

// Audit files and directories.
const (
	// AuditKeyDir is the default directory of the audit signing keys,
	// under the data dir.
	AuditKeyDir = "audit-keys"
	// AuditPubKeyFile is where `countersign dev` writes the audit public
	// keys (PEM) for `countersign audit verify --key`.
	AuditPubKeyFile = "audit-key.pub"
)

// startAudit opens the audit log. Processes that run the worker hold the
// signing keys; an HTTP-only server reads the log without them.
func (a *App) startAudit(ctx context.Context, js jetstream.JetStream) error {
	opts := audit.Options{Redact: a.cfg.AuditRedact, Replicas: a.cfg.NATSReplicas, Logger: a.log}
	if a.mode != ModeServer {
		dir := a.cfg.AuditKeyDir
		if dir == "" {
			dir = filepath.Join(a.cfg.DataDir, AuditKeyDir)
		}
		keys, err := audit.OpenKeyring(dir)
		if err != nil {
			return err
		}
		opts.Keys = keys
		if a.mode == ModeDev {
			p := filepath.Join(a.cfg.DataDir, AuditPubKeyFile)
			if err := os.WriteFile(p, keys.PublicKeysPEM(), 0o644); err != nil {
				return fmt.Errorf("audit: write public key: %w", err)
			}
		}
	}
	l, err := audit.Open(ctx, js, opts)
	if err != nil {
		return err
	}
	a.Audit = l
	return nil
}
