package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/countersign/countersign/internal/app"
)

const adminInitUsage = "usage: countersign admin init (--nats-url URL | --config FILE) [--name admin] [--out FILE] [--rotate] [--audit-key-dir DIR]"

// adminInitEnv are the environment variables of admin init's connection
// flags: one set counts as the flag given, over the --config file.
var adminInitEnv = map[string]string{
	"data-dir": "COUNTERSIGN_DATA_DIR", "nats-url": "NATS_URL", "nats-creds": "NATS_CREDS", "nats-nkey": "NATS_NKEY",
	"nats-tls-ca": "NATS_TLS_CA", "nats-tls-cert": "NATS_TLS_CERT", "nats-tls-key": "NATS_TLS_KEY",
	"nats-replicas": "COUNTERSIGN_NATS_REPLICAS", "audit-key-dir": "COUNTERSIGN_AUDIT_KEY_DIR",
}

// runAdminInit is `countersign admin init`: the first admin token of a
// deployment that `dev` did not bootstrap, created on its NATS directly.
func runAdminInit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "init" {
		return usageError{adminInitUsage}
	}
	var cfg app.Config
	def := app.Config{}
	def.Defaults()
	fs := flag.NewFlagSet("admin init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DataDir, "data-dir", envOr("COUNTERSIGN_DATA_DIR", def.DataDir), "data directory (the default audit key directory is DATA_DIR/audit-keys)")
	fs.StringVar(&cfg.NATSURL, "nats-url", envOr("NATS_URL", ""), "NATS URL, the one your servers use (required, here or in --config)")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", envOr("NATS_CREDS", ""), "NATS credentials file")
	fs.StringVar(&cfg.NATSNKey, "nats-nkey", envOr("NATS_NKEY", ""), "NATS nkey seed file (instead of --nats-creds)")
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", envOr("NATS_TLS_CA", ""), "CA bundle (PEM) to verify the NATS server with")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", envOr("NATS_TLS_CERT", ""), "client certificate (PEM) for NATS mutual TLS")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", envOr("NATS_TLS_KEY", ""), "client key (PEM) for NATS mutual TLS")
	fs.IntVar(&cfg.NATSReplicas, "nats-replicas", def.NATSReplicas, "replicas of the token bucket and audit stream if this creates them, 1 to 5")
	fs.StringVar(&cfg.AuditKeyDir, "audit-key-dir", envOr("COUNTERSIGN_AUDIT_KEY_DIR", ""), "directory of the audit signing keys that sign the record of this action (default DATA_DIR/audit-keys)")
	fs.StringVar(&cfg.ConfigFile, "config", envOr("COUNTERSIGN_CONFIG", ""), "the servers' configuration file (YAML): its nats section, data_dir and audit_key_dir apply, under these flags and their environment variables")
	name := fs.String("name", app.AdminFileName, "name of the admin principal")
	out := fs.String("out", "", "write the token to this file (mode 0600) instead of printing it")
	rotate := fs.Bool("rotate", false, "replace NAME's admin token (revoking it) even though an admin token exists")
	if err := fs.Parse(args[1:]); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("admin init: unexpected argument %q; %s", fs.Arg(0), adminInitUsage)}
	}
	if _, err := setFromEnv(fs, map[string]string{"nats-replicas": "COUNTERSIGN_NATS_REPLICAS"}); err != nil {
		return err
	}
	if cfg.ConfigFile != "" {
		// The servers' file: flag > environment > file > default, as
		// for them.
		explicit := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		for flag, env := range adminInitEnv {
			if os.Getenv(env) != "" {
				explicit[flag] = true
			}
		}
		if err := applyConfigFile(&cfg, explicit, stderr); err != nil {
			return err
		}
	}
	// Claim the output file before touching NATS, so a token is never
	// created that cannot be written. Rotation may overwrite it.
	var f *os.File
	if *out != "" {
		flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
		if *rotate {
			flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		}
		var err error
		if f, err = os.OpenFile(*out, flags, 0o600); err != nil {
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("--out %s exists; remove it, or pass --rotate to replace the token it may hold", *out)
			}
			return fmt.Errorf("--out: %w", err)
		}
		if err := f.Chmod(0o600); err != nil {
			f.Close()
			return err
		}
	}
	res, err := app.InitAdmin(ctx, cfg, app.InitAdminOptions{Name: *name, Rotate: *rotate, Logger: newLogger(stderr, "warn")})
	if res.Token == "" {
		if f != nil {
			f.Close()
			os.Remove(*out)
		}
		return err
	}
	if f != nil {
		_, werr := f.WriteString(res.Token + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			// The token exists; losing it would lock the operator out.
			fmt.Fprintf(stdout, "Could not write %s (%v). The admin token, shown once:\n%s\n", *out, werr, res.Token)
			return werr
		}
		abs, _ := filepath.Abs(*out)
		fmt.Fprintf(stdout, "Admin %q token written to %s (mode 0600).\n", res.Change.Name, abs)
	} else {
		fmt.Fprintf(stdout, "Admin %q token (shown once; store it as a secret):\n%s\n", res.Change.Name, res.Token)
	}
	if res.Change.Replaced != "" {
		fmt.Fprintf(stdout, "It replaces token %s…, which is revoked.\n", res.Change.Replaced)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Recorded as %s (countersign audit show %s), signed with a key in %s.\n", res.AuditRecord, res.AuditChain, res.AuditKeyDir)
	fmt.Fprintf(stdout, "Auditors verify with its public keys: countersign audit public-keys --audit-key-dir %s > audit-key.pub\n", res.AuditKeyDir)
	tokenFile := "FILE"
	if *out != "" {
		tokenFile, _ = filepath.Abs(*out)
	}
	fmt.Fprintf(stdout, "Use it with: COUNTERSIGN_ADMIN_TOKEN_FILE=%s countersign agents list --server URL\n", tokenFile)
	return nil
}
