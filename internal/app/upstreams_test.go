package app

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/gateway/upstream"
	"github.com/countersign/countersign/internal/config"
)

// An upstream whose prefix puts Countersign's own tool in its namespace is
// refused at startup, with the file, line and field; the shipped own tools
// leave every prefix free.
func TestCheckNamespaces(t *testing.T) {
	own := append(gateway.DemoTools(nil), conformance.New().Tools()...)
	ups := []config.Upstream{{Name: "fs", Prefix: "fs", Line: 2}, {Name: "transfer", Prefix: "transfer", Line: 5}, {Name: "greet", Prefix: "greet", Line: 8}}
	if err := checkNamespaces("c.yaml", own, ups); err != nil {
		t.Fatalf("the demo tools and fixtures against ordinary prefixes: %v", err)
	}
	own = append(own, gateway.Tool{Name: "fs__read"})
	err := checkNamespaces("c.yaml", own, ups)
	if err == nil {
		t.Fatal("an own tool inside an upstream's namespace was accepted")
	}
	for _, want := range []string{`c.yaml:2: upstreams[0].prefix: "fs"`, `own tool "fs__read"`, "choose another prefix"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// Two upstreams whose tools would share names stop startup, before anything
// starts, with the file, line and field.
func TestDuplicatePrefixStopsStartup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "countersign.yaml")
	cfg := "upstreams:\n  - name: a\n    url: http://127.0.0.1:1/mcp\n    prefix: p\n  - name: b\n    command: [x]\n    prefix: p\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(context.Background(), Config{DataDir: filepath.Join(dir, "data"), Addr: freeAddr(t), ConfigFile: path}, ModeDev, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `countersign.yaml:7: upstreams[1].prefix: duplicate prefix "p"`) {
		t.Fatalf("New: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("the data dir was created before the configuration was checked (%v)", err)
	}
}

// An upstream that is down is named in /readyz's body but fails readiness
// only when it is required; NATS or Temporal down always fails it.
func TestReadiness(t *testing.T) {
	up := upstream.State{Up: true}
	down := upstream.State{Err: "connection refused"}
	tests := []struct {
		name      string
		down      []string
		ups       []upstreamReadiness
		wantReady bool
		wantLines []string
	}{{
		name:      "all up",
		ups:       []upstreamReadiness{{name: "fs", state: up}, {name: "web", required: true, state: up}},
		wantReady: true,
	}, {
		name:      "an upstream down",
		ups:       []upstreamReadiness{{name: "web", state: down}, {name: "fs", state: up}},
		wantReady: true,
		wantLines: []string{"upstream web: down (connection refused)"},
	}, {
		name:      "a required upstream down",
		ups:       []upstreamReadiness{{name: "web", state: down}, {name: "fs", required: true, state: upstream.State{}}},
		wantReady: false,
		wantLines: []string{"upstream fs: down (not connected yet)", "upstream web: down (connection refused)"},
	}, {
		name:      "nats down",
		down:      []string{"nats: not connected"},
		ups:       []upstreamReadiness{{name: "fs", state: down}},
		wantReady: false,
		wantLines: []string{"nats: not connected", "upstream fs: down (connection refused)"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready, lines := readiness(tt.down, tt.ups)
			if ready != tt.wantReady {
				t.Errorf("ready = %v, want %v", ready, tt.wantReady)
			}
			if diff := cmp.Diff(tt.wantLines, lines, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

// Config check refuses an upstream prefix whose namespace holds one of
// Countersign's own tools, with the error startup gives (it runs the same
// checkNamespaces over the same own tools, ownTools); the shipped tools
// leave every prefix free, so the collision is made with an extra tool.
func TestConfigCheckNamespaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: fs\n    url: http://127.0.0.1:1/mcp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{ConfigFile: path}
	cfg.Defaults()
	if err := cfg.Check(context.Background(), ModeDev); err != nil {
		t.Fatalf("Check with the shipped own tools: %v", err)
	}
	own, fixtures := ownTools(&cfg, ModeDev, nil)
	if len(own) != len(gateway.DemoTools(nil)) || fixtures != nil {
		t.Errorf("own tools in dev: %d tools, fixtures %v; want the demo tools only", len(own), fixtures)
	}
	err := cfg.check(context.Background(), ModeDev, append(own, gateway.Tool{Name: "fs__read"}))
	want := checkNamespaces(path, []gateway.Tool{{Name: "fs__read"}}, cfg.File.Upstreams)
	if err == nil || want == nil || !strings.Contains(err.Error(), want.Error()) {
		t.Fatalf("Check with an own tool fs__read: %v, want it to hold startup's error %v", err, want)
	}
}
