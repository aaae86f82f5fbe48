package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What the deployment files may name, read from the code itself (Go
// source, parsed), so that a renamed flag, variable, command or endpoint
// fails here instead of in someone's cluster.
type code struct {
	envs        map[string]bool // environment variables cmd/countersign reads
	flags       map[string]bool // flag names of its commands
	subcommands map[string]bool // the first argument `countersign` takes
	endpoints   map[string]bool // HTTP paths internal/app serves itself
	modules     map[string]string
	// shutdownTimeout is app.ShutdownTimeout: how long a stopping process's
	// graceful shutdown may take, after its shutdown delay.
	shutdownTimeout time.Duration
}

func readCode(t *testing.T) *code {
	t.Helper()
	c := &code{envs: map[string]bool{}, flags: map[string]bool{}, subcommands: map[string]bool{}, endpoints: map[string]bool{}}
	for _, f := range parseDir(t, filepath.Join("..", "cmd", "countersign")) {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				c.call(n)
			case *ast.FuncDecl:
				if n.Name.Name == "run" && n.Recv == nil {
					c.commands(n)
				}
			}
			return true
		})
	}
	for _, f := range parseDir(t, filepath.Join("..", "internal", "app")) {
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Names) == 1 && vs.Names[0].Name == "ShutdownTimeout" && len(vs.Values) == 1 {
				c.shutdownTimeout = durationExpr(vs.Values[0])
			}
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "HandleFunc" || sel.Sel.Name == "Handle") {
				if p, ok := stringLit(call.Args[0]); ok {
					if _, path, found := strings.Cut(p, " "); found {
						p = path
					}
					c.endpoints[p] = true
				}
			}
			return true
		})
	}
	c.modules = readGoMod(t)
	if c.shutdownTimeout <= 0 {
		t.Fatal("no const ShutdownTimeout = N * time.Second in internal/app: has the code moved?")
	}
	for what, m := range map[string]map[string]bool{"environment variables": c.envs, "flags": c.flags, "subcommands": c.subcommands, "endpoints": c.endpoints} {
		if len(m) < 3 {
			t.Fatalf("found only %d %s in the code (%v): has the code moved?", len(m), what, m)
		}
	}
	return c
}

// call records an environment variable read (os.Getenv, os.LookupEnv and
// the env* helpers of cmd/countersign) or a flag definition (fs.XxxVar,
// fs.Xxx, fs.Func).
func (c *code) call(n *ast.CallExpr) {
	switch fun := n.Fun.(type) {
	case *ast.Ident:
		// A helper that reads or registers a variable (envOr("NAME", …),
		// e("flag", "NAME", usage)): its upper-case snake_case argument.
		for _, a := range n.Args {
			if s, ok := stringLit(a); ok && envName.MatchString(s) {
				c.envs[s] = true
			}
		}
	case *ast.SelectorExpr:
		x, _ := fun.X.(*ast.Ident)
		if x == nil {
			return
		}
		name := fun.Sel.Name
		switch {
		case x.Name == "os" && (name == "Getenv" || name == "LookupEnv") && len(n.Args) == 1:
			if s, ok := stringLit(n.Args[0]); ok {
				c.envs[s] = true
			}
		case x.Name == "fs" && strings.HasSuffix(name, "Var") && len(n.Args) >= 2:
			if s, ok := stringLit(n.Args[1]); ok {
				c.flags[s] = true
			}
		case x.Name == "fs" && name != "Parse" && name != "Lookup" && name != "SetOutput" && len(n.Args) >= 2:
			if s, ok := stringLit(n.Args[0]); ok {
				c.flags[s] = true
			}
		}
	}
}

// durationExpr is the value of a constant expression N * time.Unit, 0 for
// any other expression.
func durationExpr(e ast.Expr) time.Duration {
	b, ok := e.(*ast.BinaryExpr)
	if !ok || b.Op != token.MUL {
		return 0
	}
	lit, ok := b.X.(*ast.BasicLit)
	sel, ok2 := b.Y.(*ast.SelectorExpr)
	if !ok || !ok2 || lit.Kind != token.INT {
		return 0
	}
	n, err := strconv.Atoi(lit.Value)
	if err != nil {
		return 0
	}
	unit := map[string]time.Duration{"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute}[sel.Sel.Name]
	return time.Duration(n) * unit
}

var envName = regexp.MustCompile(`^[A-Z][A-Z0-9]*_[A-Z0-9_]+$`)

// commands records the case labels of run's command switch.
func (c *code) commands(fn *ast.FuncDecl) {
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		cc, ok := n.(*ast.CaseClause)
		if !ok {
			return true
		}
		for _, e := range cc.List {
			if s, ok := stringLit(e); ok && !strings.HasPrefix(s, "-") && s != "help" {
				c.subcommands[s] = true
			}
		}
		return true
	})
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return files
}

// readGoMod returns the required modules' versions.
func readGoMod(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:require\s+)?([a-z0-9.\-/]+)\s+(v[^\s]+)`).FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// requireEnv fails for each name the code does not read.
func (c *code) requireEnv(t *testing.T, where string, names ...string) {
	t.Helper()
	for _, n := range names {
		if !c.envs[n] {
			t.Errorf("%s: %s is not an environment variable countersign reads", where, n)
		}
	}
}

// requireArgs checks a countersign command line: a real subcommand and
// real flags. It returns the flags' values.
func (c *code) requireArgs(t *testing.T, where string, args []string) map[string]string {
	t.Helper()
	flags := map[string]string{}
	if len(args) == 0 || !c.subcommands[args[0]] {
		t.Errorf("%s: %q is not a countersign command (have %v)", where, args, keys(c.subcommands))
		return flags
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !c.flags[name] {
			t.Errorf("%s: --%s is not a flag of countersign", where, name)
		}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			value = args[i+1]
			i++
		}
		flags[name] = value
	}
	return flags
}

// listenPorts are the ports a `countersign cmd` serves HTTP on, from its
// flags and environment: --addr (not the worker's: it serves no MCP or
// approver site) and the operations listener --metrics-addr, when the code
// has one.
func listenPorts(cmd string, flags, envs map[string]string) map[string]bool {
	ports := map[string]bool{}
	add := func(flag, env string) {
		addr := flags[flag]
		if addr == "" {
			addr = envs[env]
		}
		if _, port, err := net.SplitHostPort(addr); err == nil && port != "" {
			ports[port] = true
		}
	}
	if cmd != "worker" {
		add("addr", "COUNTERSIGN_ADDR")
	}
	add("metrics-addr", "COUNTERSIGN_METRICS_ADDR")
	return ports
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCodeReader: the reader finds what it must, so that the checks built
// on it can fail.
func TestCodeReader(t *testing.T) {
	c := readCode(t)
	for _, env := range []string{"COUNTERSIGN_ADDR", "TEMPORAL_ADDRESS", "NATS_URL", "COUNTERSIGN_CONFIG"} {
		if !c.envs[env] {
			t.Errorf("environment variable %s not found in cmd/countersign", env)
		}
	}
	for _, f := range []string{"addr", "config", "temporal-address"} {
		if !c.flags[f] {
			t.Errorf("flag --%s not found in cmd/countersign", f)
		}
	}
	for _, cmd := range []string{"server", "worker", "healthcheck"} {
		if !c.subcommands[cmd] {
			t.Errorf("command %s not found in cmd/countersign", cmd)
		}
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if !c.endpoints[p] {
			t.Errorf("endpoint %s not found in internal/app", p)
		}
	}
	if c.envs["NOT_A_COUNTERSIGN_VARIABLE"] || c.flags["not-a-flag"] {
		t.Error("the reader accepts anything")
	}
	if c.modules["go.temporal.io/server"] == "" {
		t.Error("go.mod: no go.temporal.io/server")
	}
}
