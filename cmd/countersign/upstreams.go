package main

import (
	"context"
	"flag"
	"io"
	"os"
	"time"

	"github.com/countersign/countersign/internal/app"
)

// runUpstreams is `countersign upstreams list [--config FILE] [--policy DIR]`.
// The policy is the one `countersign dev --config FILE` would load: --policy,
// else COUNTERSIGN_POLICY, else the file's policy, else the embedded default.
func runUpstreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "list" {
		return usageError{"usage: countersign upstreams list [--config FILE] [--policy DIR] [--wait DURATION]"}
	}
	fs := flag.NewFlagSet("upstreams list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg app.Config
	fs.StringVar(&cfg.ConfigFile, "config", envOr("COUNTERSIGN_CONFIG", ""), "YAML configuration file with the upstreams")
	fs.StringVar(&cfg.PolicyDir, "policy", envOr("COUNTERSIGN_POLICY", ""), "directory of Rego policy to use instead of the configuration file's or the embedded default")
	wait := fs.Duration("wait", 15*time.Second, "how long to wait for each upstream to answer")
	if err := fs.Parse(args[1:]); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{"upstreams list takes no arguments"}
	}
	explicit := map[string]bool{"policy": os.Getenv("COUNTERSIGN_POLICY") != ""}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if err := applyConfigFile(&cfg, explicit, stderr); err != nil {
		return err
	}
	return app.ListUpstreams(ctx, cfg, *wait, stdout)
}
