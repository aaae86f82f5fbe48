package e2e

import (
	"testing"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
)

// stack is a running `countersign dev` on a temporary data dir (see
// internal/devtest); it carries this package's own helpers.
type stack struct{ *devtest.Stack }

type (
	approver       = devtest.Approver
	challenge      = devtest.Challenge
	decisionResult = devtest.DecisionResult
)

var (
	readFile    = devtest.ReadFile
	disposition = devtest.Disposition
)

// startStack starts countersign dev on dir (a fresh temp dir when empty) and
// port (a free one when 0).
func startStack(t testing.TB, dir string, port int) *stack {
	t.Helper()
	return startStackConfig(t, app.Config{DataDir: dir}, port)
}

// startStackWithPolicy starts a stack that loads the policy in dir.
func startStackWithPolicy(t testing.TB, dir string) *stack {
	t.Helper()
	return startStackConfig(t, app.Config{PolicyDir: dir}, 0)
}

// startStackConfig starts a stack with cfg; the rate and pending limits are
// lifted unless cfg sets them.
func startStackConfig(t testing.TB, cfg app.Config, port int) *stack {
	t.Helper()
	return &stack{devtest.Start(t, devtest.Options{Config: cfg, Port: port})}
}
