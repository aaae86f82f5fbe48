package main

import (
	"context"
	"fmt"
	"io"
	"strings"
)

const configUsage = "usage: countersign config check FILE [--mode dev|server|worker] [service flags]"

// runConfig is `countersign config check FILE [--mode M] [flags]`: it loads
// FILE as `countersign M --config FILE [flags]` would, with the same
// environment, reports every problem (exit 1) or prints the effective
// configuration, secrets redacted (exit 0). It connects to nothing, but
// loads the policy as the service would.
func runConfig(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return usageError{configUsage}
	}
	args = args[1:]
	// FILE may come first or last; --mode may be anywhere.
	var file, mode string
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--mode" || a == "-mode":
			if i+1 == len(args) {
				return usageError{"config check: --mode needs a value\n" + configUsage}
			}
			mode = args[i+1]
			i++
		case strings.HasPrefix(a, "--mode=") || strings.HasPrefix(a, "-mode="):
			mode = a[strings.Index(a, "=")+1:]
		case i == 0 && !strings.HasPrefix(a, "-"):
			file = a
		case i == len(args)-1 && file == "" && !strings.HasPrefix(a, "-"):
			file = a
		default:
			rest = append(rest, a)
		}
	}
	if file == "" {
		return usageError{"config check: no FILE\n" + configUsage}
	}
	if mode == "" {
		mode = "server"
	}
	m, ok := modes[mode]
	if !ok {
		return usageError{fmt.Sprintf("config check: --mode %q must be dev, server or worker", mode)}
	}
	cfg, err := serviceConfig(mode, append(rest, "--config", file), stderr)
	if err != nil {
		return err
	}
	if err := cfg.Check(ctx, m); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# %s: OK for countersign %s. The effective configuration (flags > environment > file > defaults), secrets redacted:\n", file, mode)
	fmt.Fprint(stdout, cfg.Effective(m).String())
	return nil
}
