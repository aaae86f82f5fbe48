// Package deps pins the project's direct dependencies in go.mod while the
// packages that use them are being written. Removed once every one is
// imported by real code.
package deps

import (
	_ "github.com/descope/virtualwebauthn"
	_ "github.com/go-webauthn/webauthn/webauthn"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/mark3labs/mcp-go/client"
	_ "github.com/modelcontextprotocol/go-sdk/mcp"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/open-policy-agent/opa/v1/rego"
	_ "github.com/open-policy-agent/opa/v1/tester"
	_ "github.com/slack-go/slack"
	_ "github.com/stretchr/testify/mock"
	_ "go.temporal.io/sdk/client"
	_ "go.temporal.io/sdk/testsuite"
	_ "go.temporal.io/sdk/workflow"
	_ "go.temporal.io/server/temporal"
	_ "go.temporal.io/server/temporaltest"
)
