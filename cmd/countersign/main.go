// Command countersign is the Countersign binary: `dev` runs everything in
// one process; `server` and `worker` run the production split; the admin
// commands talk to a running server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/countersign/countersign/internal/config"
	"github.com/countersign/countersign/internal/telemetry"
)

const usage = `Countersign: asynchronous passkey approval for MCP tool calls.

Usage:
  countersign dev       [flags]   everything in one process (embedded NATS and Temporal by default)
  countersign server    [flags]   MCP endpoint and approver site (external NATS and Temporal)
  countersign worker    [flags]   approval workflow worker (external NATS and Temporal)
  countersign admin init (--nats-url URL | --config FILE) [--name admin] [--out FILE] [--rotate]   the first admin token of a server deployment
  countersign approvers add NAME --group G [--principal AGENT]... [--server URL] [--data-dir DIR]
  countersign approvers invite APPROVER_ID [--server URL] [--data-dir DIR]
  countersign approvers list|disable|enable|revoke [APPROVER_ID] [--server URL] [--data-dir DIR]
  countersign passkeys disable|enable|revoke APPROVER_ID CREDENTIAL_ID [--server URL] [--data-dir DIR]
  countersign agents add NAME [--server URL] [--data-dir DIR]
  countersign agents list|disable|enable|revoke [NAME] [--server URL] [--data-dir DIR]
  countersign approvals list [--server URL] [--data-dir DIR]
  countersign transaction-tokens issue TOOL --principal AGENT [--arguments JSON] [--server URL] [--data-dir DIR]
  countersign transaction-tokens rotate-key [--server URL] [--data-dir DIR]
  countersign audit show TASK [--server URL] [--data-dir DIR]
  countersign audit export [--since RFC3339] [--server URL] [--data-dir DIR] > audit.jsonl
  countersign audit verify FILE --key PUBKEY [--checkpoint CP]
  countersign audit checkpoint FILE --key PUBKEY > checkpoint.json   the head of every chain, to anchor later exports
  countersign audit rotate-key [--audit-key-dir DIR | --data-dir DIR]   a new audit signing key (running processes switch within 30 s)
  countersign audit public-keys [--audit-key-dir DIR | --data-dir DIR] > audit-key.pub   the public keys, for audit verify --key
  countersign upstreams list [--config FILE] [--policy DIR] [--wait 15s]   each upstream, its state, its tools and their policy decision
  countersign healthcheck [--timeout D] URL   exit 0 when GET URL answers 200 (a container probe: the image has no shell)
  countersign config check FILE [--mode dev|server|worker] [flags]   check a configuration file; print the effective configuration, secrets redacted
  countersign bench [--dev | --server URL] [--baseline] [--concurrency 1,8] [--duration D | --requests N] [--json FILE]
  countersign bench compare A.json B.json
  countersign bench plot REPORT.json -o FILE.svg
  countersign version                                  the build: module version (or VCS revision), Go version, platform

Admin commands read the admin token from COUNTERSIGN_ADMIN_TOKEN, else the file
COUNTERSIGN_ADMIN_TOKEN_FILE names, else DATA_DIR/admin-token (written by dev).
Disable is reversible (enable); revoke is permanent. Every change is audited.
Run "countersign COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer exitOnSecondSignal(stderr)()
	var err error
	switch args[0] {
	case "dev", "server", "worker":
		err = runService(ctx, args[0], args[1:], stdout, stderr)
	case "approvers", "agents", "approvals", "transaction-tokens", "passkeys":
		err = runAdmin(ctx, args, stdout)
	case "admin":
		err = runAdminInit(ctx, args[1:], stdout, stderr)
	case "audit":
		err = runAudit(ctx, args[1:], stdout, stderr)
	case "upstreams":
		err = runUpstreams(ctx, args[1:], stdout, stderr)
	case "healthcheck":
		err = runHealthcheck(ctx, args[1:], stdout, stderr)
	case "config":
		err = runConfig(ctx, args[1:], stdout, stderr)
	case "bench":
		err = runBench(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		version, goVersion := telemetry.BuildVersion()
		fmt.Fprintf(stdout, "countersign %s %s %s/%s\n", version, goVersion, runtime.GOOS, runtime.GOARCH)
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "countersign: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "countersign: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "countersign: %v\n", err)
		return 1
	}
	return 0
}

// exitOnSecondSignal makes a second SIGTERM or SIGINT exit the process at
// once, status 1: the first one ends run's context and starts a graceful
// stop (a shutdown delay, then up to app.ShutdownTimeout), which an
// operator may not want to wait for. The returned func stops watching.
func exitOnSecondSignal(stderr io.Writer) (stop func()) {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			select {
			case s := <-sig:
				if n == 0 {
					continue // the first: run's context ends
				}
				fmt.Fprintf(stderr, "countersign: %v again: exiting without finishing the shutdown\n", s)
				os.Exit(1)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}

type usageError struct{ msg string }

// parseError turns a flag parsing failure into a usage error (exit 2); -h
// stays flag.ErrHelp (exit 0).
func parseError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err.Error()}
}

func (e usageError) Error() string { return e.msg }

// newLogger is a text logger at level (an unknown level is info).
func newLogger(w io.Writer, level string) *slog.Logger {
	l, _ := newFormatLogger(w, level, telemetry.LogText)
	return l
}

// newFormatLogger is the service's logger: format text or json, with trace
// and task IDs (telemetry.NewLogger).
func newFormatLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	return telemetry.NewLogger(w, format, config.SlogLevel(level))
}
