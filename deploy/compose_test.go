package deploy

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// composeEnv is ./.env as the README makes it: the NATS passwords.
var composeEnv = types.Mapping{
	"COUNTERSIGN_NATS_PASSWORD":        testNATSPassword,
	"COUNTERSIGN_NATS_CLIENT_PASSWORD": testNATSClientPassword,
}

// loadCompose loads docker-compose.yml as `docker compose` does (the
// compose-spec loader: schema validation, interpolation with composeEnv
// alone, so every ${VAR:-default} takes its default).
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadComposeWith(composeEnv)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

// TestComposeNeedsNATSPasswords: without ./.env, docker compose stops
// before it starts anything and says what to do.
func TestComposeNeedsNATSPasswords(t *testing.T) {
	for v := range composeEnv {
		env := types.Mapping{}
		for k, val := range composeEnv {
			if k != v {
				env[k] = val
			}
		}
		if _, err := loadComposeWith(env); err == nil || !strings.Contains(err.Error(), "make ./.env first") {
			t.Errorf("without %s: %v", v, err)
		}
	}
	p := loadCompose(t)
	for _, name := range []string{"countersign-server", "countersign-worker"} {
		if u := service(t, p, name).Environment["NATS_URL"]; u == nil || *u != "nats://countersign:"+testNATSPassword+"@nats:4222" {
			t.Errorf("%s: NATS_URL %v, want Countersign's user of deploy/nats/nats.conf", name, u)
		}
	}
}

func loadComposeWith(env types.Mapping) (*types.Project, error) {
	dir, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "docker-compose.yml")}},
		Environment: env,
	}, func(o *loader.Options) { o.SetProjectName("countersign", true) })
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml: no service %s", name)
	}
	return s
}

// semver is a go.mod version without its "v".
func semver(t *testing.T, c *code, module string) string {
	t.Helper()
	v, ok := c.modules[module]
	if !ok {
		t.Fatalf("go.mod does not require %s", module)
	}
	return strings.TrimPrefix(v, "v")
}

func TestComposeImages(t *testing.T) {
	c := readCode(t)
	p := loadCompose(t)
	temporal := semver(t, c, "go.temporal.io/server")
	want := map[string]string{
		// The Temporal server and its schema tools are the release the
		// code is built and tested against.
		"temporal":           "temporalio/server:" + temporal,
		"temporal-schema":    "temporalio/admin-tools:" + temporal,
		"temporal-namespace": "temporalio/admin-tools:" + temporal,
		// NATS: the release the tests embed.
		"nats": "nats:" + semver(t, c, "github.com/nats-io/nats-server/v2") + "-alpine",
	}
	for name, image := range want {
		if got := service(t, p, name).Image; got != image {
			t.Errorf("service %s: image %s, want %s (go.mod)", name, got, image)
		}
	}
	if img := service(t, p, "temporal-ui").Image; !strings.HasPrefix(img, "temporalio/ui:") || strings.HasSuffix(img, ":latest") {
		t.Errorf("temporal-ui: image %s, want a pinned temporalio/ui", img)
	}
	for name, s := range p.Services {
		if strings.Contains(s.Image, "auto-setup") {
			t.Errorf("service %s uses the deprecated auto-setup image", name)
		}
		if s.Image == "" || (!strings.Contains(s.Image, ":") && s.Build == nil) || strings.HasSuffix(s.Image, ":latest") {
			t.Errorf("service %s: image %q is not pinned", name, s.Image)
		}
	}
	// Both Countersign services run the image built from this repo.
	server, worker := service(t, p, "countersign-server"), service(t, p, "countersign-worker")
	if server.Build == nil || server.Image == "" || worker.Image != server.Image {
		t.Errorf("countersign-server builds %q and countersign-worker runs %q: want the worker on the server's built image", server.Image, worker.Image)
	}
}

func TestComposeSchemaSetup(t *testing.T) {
	p := loadCompose(t)
	schema := service(t, p, "temporal-schema")
	script := strings.Join(append(append([]string{}, schema.Entrypoint...), schema.Command...), " ")
	for _, want := range []string{
		"temporal-sql-tool", "create-database", "setup-schema",
		"update-schema --schema-name postgresql/v12/temporal",
		"update-schema --schema-name postgresql/v12/visibility",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("temporal-schema does not run %q: %s", want, script)
		}
	}
	// The server's database settings are the schema tool's.
	temporal := service(t, p, "temporal")
	for tool, server := range map[string]string{"SQL_HOST": "POSTGRES_SEEDS", "SQL_USER": "POSTGRES_USER", "SQL_PASSWORD": "POSTGRES_PWD", "SQL_PORT": "DB_PORT"} {
		if a, b := env(schema, tool), env(temporal, server); a == "" || a != b {
			t.Errorf("temporal-schema %s=%q but temporal %s=%q", tool, a, server, b)
		}
	}
	if env(schema, "SQL_PLUGIN") != env(temporal, "DB") {
		t.Errorf("schema plugin %q, server DB %q", env(schema, "SQL_PLUGIN"), env(temporal, "DB"))
	}
	if env(temporal, "POSTGRES_SEEDS") != "postgres" {
		t.Errorf("temporal's database is %q, not the postgres service", env(temporal, "POSTGRES_SEEDS"))
	}
}

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

func TestComposeDependencies(t *testing.T) {
	p := loadCompose(t)
	want := map[string]map[string]string{
		"temporal-schema":    {"postgres": types.ServiceConditionHealthy},
		"temporal":           {"temporal-schema": types.ServiceConditionCompletedSuccessfully},
		"temporal-namespace": {"temporal": types.ServiceConditionHealthy},
		"temporal-ui":        {"temporal": types.ServiceConditionHealthy},
		"countersign-server": {"temporal-namespace": types.ServiceConditionCompletedSuccessfully, "nats": types.ServiceConditionHealthy},
		"countersign-worker": {"temporal-namespace": types.ServiceConditionCompletedSuccessfully, "nats": types.ServiceConditionHealthy, "countersign-server": types.ServiceConditionHealthy},
	}
	for name, deps := range want {
		s := service(t, p, name)
		for dep, cond := range deps {
			if got, ok := s.DependsOn[dep]; !ok || got.Condition != cond {
				t.Errorf("service %s: depends_on %s %q, want %q", name, dep, got.Condition, cond)
			}
		}
	}
	// Whatever a service waits to be healthy has a healthcheck.
	for name, s := range p.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == types.ServiceConditionHealthy && service(t, p, dep).HealthCheck == nil {
				t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
	}
}

// TestComposeCountersign: the server and worker are configured only with
// variables the binary reads, run real commands, and the server's
// healthcheck probes an endpoint it serves, on the port it listens on, with
// a command the image has.
func TestComposeCountersign(t *testing.T) {
	c := readCode(t)
	p := loadCompose(t)
	for _, name := range []string{"countersign-server", "countersign-worker"} {
		s := service(t, p, name)
		c.requireEnv(t, name, keys(mapKeys(s.Environment))...)
		c.requireArgs(t, name, s.Command)
	}
	server := service(t, p, "countersign-server")
	for _, name := range []string{"countersign-server", "countersign-worker"} {
		s := service(t, p, name)
		if s.HealthCheck == nil {
			t.Errorf("%s: no healthcheck", name)
		}
		// docker stop kills after stop_grace_period (10s by default): a
		// stopping process needs its shutdown delay and app.ShutdownTimeout.
		var delay time.Duration
		if d := env(s, "COUNTERSIGN_SHUTDOWN_DELAY"); d != "" {
			var err error
			if delay, err = time.ParseDuration(d); err != nil {
				t.Errorf("%s: COUNTERSIGN_SHUTDOWN_DELAY %q: %v", name, d, err)
			}
		}
		grace := 10 * time.Second
		if s.StopGracePeriod != nil {
			grace = time.Duration(*s.StopGracePeriod)
		}
		if delay+c.shutdownTimeout >= grace {
			t.Errorf("%s: stop_grace_period %v does not exceed the shutdown delay %v plus the shutdown's %v", name, grace, delay, c.shutdownTimeout)
		}
	}
	// The first admin token comes from a secret the server reads.
	if f := env(server, "COUNTERSIGN_ADMIN_TOKEN_FILE"); len(server.Secrets) != 1 || f != "/run/secrets/"+server.Secrets[0].Source {
		t.Errorf("countersign-server: COUNTERSIGN_ADMIN_TOKEN_FILE=%q, secrets %v: want the file of its one secret", f, server.Secrets)
	} else if _, ok := p.Secrets[server.Secrets[0].Source]; !ok {
		t.Errorf("countersign-server: secret %s is not defined", server.Secrets[0].Source)
	}
	if server.Command[0] != "server" {
		t.Fatalf("countersign-server runs %q", server.Command)
	}
	_, port, err := net.SplitHostPort(env(server, "COUNTERSIGN_ADDR"))
	if err != nil {
		t.Fatalf("countersign-server: COUNTERSIGN_ADDR %q: %v", env(server, "COUNTERSIGN_ADDR"), err)
	}
	if !slices.ContainsFunc(server.Ports, func(pc types.ServicePortConfig) bool { return strconv.Itoa(int(pc.Target)) == port }) {
		t.Errorf("countersign-server listens on %s but publishes %v", port, server.Ports)
	}
	// Every role opens its operations listener, for /metrics; no port of
	// any service is published beyond the host's loopback (the
	// operations port's metrics name tools and upstreams).
	for _, name := range []string{"countersign-server", "countersign-worker"} {
		if env(service(t, p, name), "COUNTERSIGN_METRICS_ADDR") == "" {
			t.Errorf("%s: no COUNTERSIGN_METRICS_ADDR: its /metrics cannot be scraped", name)
		}
	}
	for name, s := range p.Services {
		for _, pc := range s.Ports {
			if pc.Published != "" && pc.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %s published on %q, want 127.0.0.1 only", name, pc.Published, pc.HostIP)
			}
		}
	}
	for _, name := range []string{"countersign-server", "countersign-worker"} {
		s := service(t, p, name)
		if s.HealthCheck == nil || len(s.HealthCheck.Test) < 2 {
			continue
		}
		probe := s.HealthCheck.Test
		// The image is distroless: no shell, so the test is CMD with the
		// binary's own healthcheck command.
		if probe[0] != "CMD" || probe[1] != "/usr/local/bin/countersign" {
			t.Errorf("%s: healthcheck %q: want [CMD /usr/local/bin/countersign healthcheck URL] (the image has no shell)", name, probe)
			continue
		}
		c.requireArgs(t, name+" healthcheck", probe[2:])
		u, err := url.Parse(probe[len(probe)-1])
		if err != nil {
			t.Errorf("%s: healthcheck URL: %v", name, err)
			continue
		}
		if !c.endpoints[u.Path] {
			t.Errorf("%s: healthcheck path %s is not served (have %v)", name, u.Path, keys(c.endpoints))
		}
		envs := map[string]string{}
		for k := range s.Environment {
			envs[k] = env(s, k)
		}
		listen := listenPorts(s.Command[0], c.requireArgs(t, name, s.Command), envs)
		if !listen[u.Port()] {
			t.Errorf("%s: healthcheck port %s, but it serves HTTP on %v", name, u.Port(), keys(listen))
		}
	}
}

func mapKeys(m types.MappingWithEquals) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// TestDockerfile: the image has the binary where the healthchecks and the
// entrypoint call it, runs as a non-root user, and sets only variables the
// binary reads.
func TestDockerfile(t *testing.T) {
	c := readCode(t)
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var final []string // the lines of the last stage
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "FROM ") {
			final = nil
		}
		final = append(final, line)
	}
	const bin = "/usr/local/bin/countersign"
	var copied, entry, user bool
	for _, line := range final {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "COPY" && f[len(f)-1] == bin:
			copied = true
		case f[0] == "ENTRYPOINT" && strings.Contains(line, `"`+bin+`"`):
			entry = true
		case f[0] == "USER" && len(f) == 2 && f[1] != "root" && f[1] != "0":
			user = true
		case f[0] == "ENV" && len(f) >= 2:
			name, _, _ := strings.Cut(f[1], "=")
			c.requireEnv(t, "Dockerfile", name)
		}
	}
	if !copied || !entry || !user {
		t.Errorf("Dockerfile's image: binary copied to %s %v, entrypoint %v, non-root user %v", bin, copied, entry, user)
	}
	p := loadCompose(t)
	for name, s := range p.Services {
		if s.HealthCheck != nil && len(s.HealthCheck.Test) > 1 && strings.Contains(s.HealthCheck.Test[1], "countersign") && s.HealthCheck.Test[1] != bin {
			t.Errorf("%s: healthcheck runs %s, the image has %s", name, s.HealthCheck.Test[1], bin)
		}
	}
}
