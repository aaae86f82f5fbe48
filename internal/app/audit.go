package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
		if err := a.writeAuditPublicKeys(keys.PublicKeysPEM()); err != nil {
			return err
		}
	}
	if opts.Keys != nil {
		a.logAuditKey(dir, opts.Keys)
	}
	l, err := audit.Open(ctx, js, opts)
	if err != nil {
		return err
	}
	a.Audit = l
	a.auditKeys = opts.Keys
	return nil
}

// logAuditKey says which key the process signs with. A server or worker
// that made that key itself, its directory holding none, warns: every
// server and worker of a deployment must share one key directory, and
// records signed with a key that only this process holds fail `audit
// verify` with the deployment's public keys.
func (a *App) logAuditKey(dir string, keys *audit.Keyring) {
	if keys.Created() && a.mode != ModeDev {
		a.log.Warn("audit: the key directory held no signing key, so this process made one: "+
			"if other servers and workers run, give every one the same --audit-key-dir (COUNTERSIGN_AUDIT_KEY_DIR), "+
			"or their records and this process's fail audit verify with each other's public keys",
			"dir", dir, "key", keys.CurrentID())
		return
	}
	a.log.Info("audit: signing key", "dir", dir, "key", keys.CurrentID(), "created", keys.Created())
}

// writeAuditPublicKeys writes pem, every public key of the keyring, to
// DATA_DIR/audit-key.pub, in dev (where the keys live in the data dir).
func (a *App) writeAuditPublicKeys(pem []byte) error {
	if a.mode != ModeDev {
		return nil
	}
	// Written whole, then renamed: an auditor never reads half a file.
	p := filepath.Join(a.cfg.DataDir, AuditPubKeyFile)
	if err := os.WriteFile(p+".tmp", pem, 0o644); err != nil {
		return fmt.Errorf("audit: write public key: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("audit: write public key: %w", err)
	}
	return nil
}

// auditKeyPoll is how often a process reads its audit key directory again,
// so that a rotation (`countersign audit rotate-key` on the directory, or a
// new copy of a mounted secret) takes effect without a restart.
var auditKeyPoll = 30 * time.Second

// startAuditKeyWatch follows rotations of the audit signing key: every
// auditKeyPoll the keyring reads its directory again and signs from then on
// with the key its current file names. A directory that cannot be read, or
// names a key it does not hold, changes nothing: the process signs on with
// the key it has, and says so once until the directory reads again. In
// dev, audit-key.pub follows the keys the directory holds: a key added
// ahead of its switch is in it before it signs anything.
func (a *App) startAuditKeyWatch(ctx context.Context) {
	if a.auditKeys == nil {
		return
	}
	a.bg.Go(func() {
		failing := false
		published := a.auditKeys.PublicKeysPEM()
		for sleep(ctx, auditKeyPoll) {
			id, changed, err := a.auditKeys.Refresh()
			if err != nil {
				if !failing {
					a.log.Warn("audit: cannot read the key directory again; signing on with the current key", "key", id, "err", err)
				}
				failing = true
				continue
			}
			if failing {
				a.log.Info("audit: the key directory reads again", "key", id)
			}
			failing = false
			if changed {
				a.log.Info("audit: signing with a new key (rotated)", "key", id)
			}
			if pem := a.auditKeys.PublicKeysPEM(); !bytes.Equal(pem, published) {
				if err := a.writeAuditPublicKeys(pem); err != nil {
					a.log.Warn("audit: public keys", "err", err)
					continue
				}
				published = pem
			}
		}
	})
}
