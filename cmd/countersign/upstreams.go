package main

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/countersign/countersign/internal/app"
)

// runUpstreams is `countersign upstreams list [--config FILE] [--policy DIR]`.
func runUpstreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "list" {
		return usageError{"usage: countersign upstreams list [--config FILE] [--policy DIR] [--wait DURATION]"}
	}
	fs := flag.NewFlagSet("upstreams list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", envOr("COUNTERSIGN_CONFIG", ""), "YAML configuration file with the upstreams")
	policyDir := fs.String("policy", envOr("COUNTERSIGN_POLICY", ""), "directory of Rego policy to use instead of the embedded default")
	wait := fs.Duration("wait", 15*time.Second, "how long to wait for each upstream to answer")
	if err := fs.Parse(args[1:]); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{"upstreams list takes no arguments"}
	}
	return app.ListUpstreams(ctx, *configFile, *policyDir, *wait, stdout)
}
