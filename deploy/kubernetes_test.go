package deploy

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/countersign/countersign/internal/config"
)

// manifests is one kustomize build, decoded strictly into the Kubernetes
// API types: a field the API does not have fails the build here.
type manifests struct {
	deployments []appsv1.Deployment
	services    []corev1.Service
	configMaps  []corev1.ConfigMap
	namespaces  []corev1.Namespace
	pdbs        []policyv1.PodDisruptionBudget
	policies    []networkingv1.NetworkPolicy
}

func build(t *testing.T, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m := &manifests{}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		where := r.GetKind() + "/" + r.GetName()
		switch r.GetKind() {
		case "Deployment":
			m.deployments = append(m.deployments, strict[appsv1.Deployment](t, where, b))
		case "Service":
			m.services = append(m.services, strict[corev1.Service](t, where, b))
		case "ConfigMap":
			m.configMaps = append(m.configMaps, strict[corev1.ConfigMap](t, where, b))
		case "Namespace":
			m.namespaces = append(m.namespaces, strict[corev1.Namespace](t, where, b))
		case "PodDisruptionBudget":
			m.pdbs = append(m.pdbs, strict[policyv1.PodDisruptionBudget](t, where, b))
		case "NetworkPolicy":
			m.policies = append(m.policies, strict[networkingv1.NetworkPolicy](t, where, b))
		default:
			t.Errorf("%s: a kind this test does not check", where)
		}
	}
	if len(m.deployments) == 0 {
		t.Fatalf("kustomize build %s: no Deployment", dir)
	}
	return m
}

func strict[T any](t *testing.T, where string, b []byte) T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(b, &v); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	return v
}

var kustomizations = []string{
	filepath.Join("kubernetes", "base"),
	filepath.Join("kubernetes", "overlays", "production"),
}

func TestKubernetesManifests(t *testing.T) {
	c := readCode(t)
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			m := build(t, dir)
			for _, d := range m.deployments {
				m.checkDeployment(t, c, d)
			}
			for _, s := range m.services {
				m.checkService(t, s)
			}
		})
	}
}

func (m *manifests) checkDeployment(t *testing.T, c *code, d appsv1.Deployment) {
	t.Helper()
	where := "Deployment " + d.Name
	pod := d.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("%s: its selector does not select its pods", where)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: fewer than 2 replicas", where)
	}
	// Every Deployment is covered by a disruption budget and a network
	// policy that select its pods.
	if !slicesAny(m.pdbs, func(p policyv1.PodDisruptionBudget) bool { return selects(p.Spec.Selector, pod.Labels) }) {
		t.Errorf("%s: no PodDisruptionBudget selects its pods", where)
	}
	if !slicesAny(m.policies, func(p networkingv1.NetworkPolicy) bool { return selects(&p.Spec.PodSelector, pod.Labels) }) {
		t.Errorf("%s: no NetworkPolicy selects its pods", where)
	}
	ps := pod.Spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		t.Errorf("%s: the pod does not require a non-root user", where)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(ps.Containers))
	}
	ctr := ps.Containers[0]
	where += " container " + ctr.Name
	sc := ctr.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: want a read-only root file system and no privilege escalation", where)
	}
	if ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: want cpu and memory requests and a memory limit", where)
	}
	// An overlay (the build with a Namespace) pins its image.
	if len(m.namespaces) > 0 && (strings.HasSuffix(ctr.Image, ":latest") || !strings.Contains(ctr.Image, ":")) {
		t.Errorf("%s: image %s is not pinned", where, ctr.Image)
	}

	// The command line, the environment and the config file are the code's.
	flags := c.requireArgs(t, where, ctr.Args)
	envs := map[string]string{}
	for _, e := range ctr.Env {
		envs[e.Name] = e.Value
	}
	for _, from := range ctr.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Errorf("%s: envFrom other than a ConfigMap", where)
			continue
		}
		cm := m.configMap(from.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("%s: envFrom ConfigMap %s is not in the build", where, from.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			envs[k] = v
		}
	}
	c.requireEnv(t, where, keys(mapOf(envs))...)
	m.checkMounts(t, where, ps, ctr, envs)

	// Probes: on a port the process serves HTTP on, and paths it serves. A
	// server has readiness and liveness probes; a worker serves HTTP only
	// on the operations listener, when one is set.
	listen := listenPorts(ctr.Args[0], flags, envs)
	if ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil {
		t.Errorf("%s: readiness and liveness probes needed", where)
	}
	if len(listen) == 0 {
		t.Errorf("%s: serves no HTTP to probe (--addr, or --metrics-addr for a worker)", where)
	}
	for kind, p := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe, "startup": ctr.StartupProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s: %s probe is not an HTTP GET", where, kind)
			continue
		}
		if !c.endpoints[p.HTTPGet.Path] {
			t.Errorf("%s: %s probe path %s is not served (have %v)", where, kind, p.HTTPGet.Path, keys(c.endpoints))
		}
		if got := containerPort(ctr, p.HTTPGet.Port.String()); !listen[got] {
			t.Errorf("%s: %s probe port %s is %q, but it serves HTTP on %v", where, kind, p.HTTPGet.Port.String(), got, keys(listen))
		}
	}
	if p := ctr.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe on %s, want /readyz", where, p.HTTPGet.Path)
	}
	m.checkMetrics(t, where, pod, ctr, envs)
	m.checkTermination(t, c, where, pod, flags, envs)
}

// checkTermination: a stopping pod gets its shutdown delay and its graceful
// shutdown (app.ShutdownTimeout) before Kubernetes kills it, and a pod that
// a Service routes to has a delay, so that it keeps serving, not ready,
// while the endpoints drop it, instead of refusing the requests routed to
// it meanwhile.
func (m *manifests) checkTermination(t *testing.T, c *code, where string, pod corev1.PodTemplateSpec, flags, envs map[string]string) {
	t.Helper()
	s := flags["shutdown-delay"]
	if s == "" {
		s = envs["COUNTERSIGN_SHUTDOWN_DELAY"]
	}
	var delay time.Duration
	if s != "" {
		var err error
		if delay, err = time.ParseDuration(s); err != nil {
			t.Errorf("%s: shutdown delay %q: %v", where, s, err)
		}
	}
	grace := 30 * time.Second // the Kubernetes default
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if delay+c.shutdownTimeout >= grace {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not exceed the shutdown delay %v plus the shutdown's %v", where, grace, delay, c.shutdownTimeout)
	}
	routed := slicesAny(m.services, func(svc corev1.Service) bool {
		return selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod.Labels)
	})
	if routed && delay <= 0 {
		t.Errorf("%s: a Service routes to its pods but it has no shutdown delay (COUNTERSIGN_SHUTDOWN_DELAY): a stopping pod would refuse the requests sent before the endpoints drop it", where)
	}
}

// checkMetrics: every process serves /metrics only on its operations
// listener (--metrics-addr), never on --addr, so each Deployment opens one
// on a named container port that a NetworkPolicy selecting its pods admits:
// else Prometheus cannot scrape what that role counts (a server's gated
// calls, decisions and verification failures; a worker's executions).
func (m *manifests) checkMetrics(t *testing.T, where string, pod corev1.PodTemplateSpec, ctr corev1.Container, envs map[string]string) {
	t.Helper()
	_, port, err := net.SplitHostPort(envs["COUNTERSIGN_METRICS_ADDR"])
	if err != nil || port == "" {
		t.Errorf("%s: no operations listener (COUNTERSIGN_METRICS_ADDR): its /metrics cannot be scraped", where)
		return
	}
	var name string
	for _, p := range ctr.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == port {
			name = p.Name
		}
	}
	if name == "" {
		t.Errorf("%s: the operations port %s is not a named container port", where, port)
		return
	}
	admitted := slicesAny(m.policies, func(p networkingv1.NetworkPolicy) bool {
		return selects(&p.Spec.PodSelector, pod.Labels) && slicesAny(p.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
			return slicesAny(r.Ports, func(np networkingv1.NetworkPolicyPort) bool {
				return np.Port != nil && (np.Port.String() == name || np.Port.String() == port)
			})
		})
	})
	if !admitted {
		t.Errorf("%s: no NetworkPolicy admits ingress to the operations port %s (%s)", where, name, port)
	}
}

// checkMounts: every mount has a volume, every volume's source is in the
// build (ConfigMaps) or named (Secrets, made by hand), and the config file
// the process is told to read is in a mounted ConfigMap and parses.
func (m *manifests) checkMounts(t *testing.T, where string, ps corev1.PodSpec, ctr corev1.Container, envs map[string]string) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = v
	}
	mountOf := map[string]corev1.VolumeMount{}
	for _, vm := range ctr.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			t.Errorf("%s: mount %s has no volume", where, vm.Name)
			continue
		}
		mountOf[vm.MountPath] = vm
		if v.ConfigMap != nil && m.configMap(v.ConfigMap.Name) == nil {
			t.Errorf("%s: volume %s: ConfigMap %s is not in the build", where, v.Name, v.ConfigMap.Name)
		}
	}
	for _, env := range []string{"COUNTERSIGN_CONFIG", "NATS_CREDS", "COUNTERSIGN_AUDIT_KEY_DIR", "COUNTERSIGN_ADMIN_TOKEN_FILE"} {
		p := envs[env]
		if p == "" {
			continue
		}
		dir := p
		if env != "COUNTERSIGN_AUDIT_KEY_DIR" {
			dir = filepath.Dir(p)
		}
		vm, ok := mountOf[dir]
		if !ok {
			t.Errorf("%s: %s=%s, but nothing is mounted at %s", where, env, p, dir)
			continue
		}
		if env != "COUNTERSIGN_CONFIG" {
			continue
		}
		v := volumes[vm.Name]
		if v.ConfigMap == nil {
			t.Errorf("%s: the config file is not from a ConfigMap", where)
			continue
		}
		cm := m.configMap(v.ConfigMap.Name)
		if cm == nil {
			continue
		}
		data, ok := cm.Data[filepath.Base(p)]
		if !ok {
			t.Errorf("%s: ConfigMap %s has no %s", where, cm.Name, filepath.Base(p))
			continue
		}
		if _, err := config.Parse(p, []byte(data), func(string) (string, bool) { return "", false }); err != nil {
			t.Errorf("%s: the config file does not load: %v", where, err)
		}
	}
}

func (m *manifests) checkService(t *testing.T, s corev1.Service) {
	t.Helper()
	var target *appsv1.Deployment
	for i, d := range m.deployments {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			target = &m.deployments[i]
		}
	}
	if target == nil {
		t.Errorf("Service %s selects no Deployment's pods", s.Name)
		return
	}
	for _, p := range s.Spec.Ports {
		if containerPort(target.Spec.Template.Spec.Containers[0], p.TargetPort.String()) == "" {
			t.Errorf("Service %s: target port %s is not a port of %s", s.Name, p.TargetPort.String(), target.Name)
		}
	}
}

func (m *manifests) configMap(name string) *corev1.ConfigMap {
	for i, cm := range m.configMaps {
		if cm.Name == name {
			return &m.configMaps[i]
		}
	}
	return nil
}

// containerPort resolves a probe's or service's port (a number or a port
// name) to the container's port number; "" when it has none.
func containerPort(ctr corev1.Container, port string) string {
	for _, p := range ctr.Ports {
		if n := strconv.Itoa(int(p.ContainerPort)); p.Name == port || n == port {
			return n
		}
	}
	return ""
}

func selects(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	return err == nil && !sel.Empty() && sel.Matches(labels.Set(l))
}

func slicesAny[T any](s []T, f func(T) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

func mapOf(m map[string]string) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}
