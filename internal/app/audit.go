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
// signing keys. An HTTP-only server signs admin and transaction-token
// records (it is the process that takes admin changes and issues and
// consumes tokens): it opens its key directory when it can, and without one
// it serves no transaction tokens (token-mode calls are denied), refuses
// admin changes and reads the log read-only.
func (a *App) startAudit(ctx context.Context, js jetstream.JetStream) error {
	opts := audit.Options{Redact: a.cfg.AuditRedact, Replicas: a.cfg.NATSReplicas, Logger: a.log}
	dir := a.cfg.AuditKeyDir
	if dir == "" {
		dir = filepath.Join(a.cfg.DataDir, AuditKeyDir)
	}
	if a.mode == ModeServer {
		if keys, err := audit.OpenKeyring(dir); err != nil {
			a.log.Warn("audit: no signing keys; transaction tokens are off on this server", "dir", dir, "err", err)
		} else {
			opts.Keys = keys
		}
	} else {
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
