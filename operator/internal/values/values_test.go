package values

import (
	"reflect"
	"strings"
	"testing"

	configv1 "github.com/openshift/api/config/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"

	"github.com/das-project/das/operator/api/v1alpha1"
	"github.com/das-project/das/operator/internal/tlsprofile"
)

// chartDir is the chart the operator embeds, read in place.
const chartDir = "../../../deploy/helm/das"

// object is one rendered manifest, as plain maps.
type object map[string]any

// render renders the chart offline with the values a spec maps to, through the chart's own
// values.schema.json: a value the mapping writes that the chart does not know fails here.
func render(t *testing.T, spec v1alpha1.DASOperatorSpec, s Settings) map[string]object {
	t.Helper()
	vals, err := Map(spec, s)
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	return renderValues(t, vals)
}

var loaded *chart.Chart

func renderValues(t *testing.T, vals map[string]any) map[string]object {
	t.Helper()
	if loaded == nil {
		c, err := loader.Load(chartDir)
		if err != nil {
			t.Fatal(err)
		}
		loaded = c
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.35.0", Major: "1", Minor: "35"}
	rv, err := chartutil.ToRenderValues(loaded, vals,
		chartutil.ReleaseOptions{Name: "das", Namespace: "das-system", IsInstall: true}, caps)
	if err != nil {
		t.Fatalf("values rejected by the chart: %v", err)
	}
	files, err := engine.Render(loaded, rv)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	out := map[string]object{}
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(text, "\n---") {
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if o == nil {
				continue
			}
			meta := o["metadata"].(map[string]any)
			out[o["kind"].(string)+"/"+meta["name"].(string)] = o
		}
	}
	return out
}

// get walks a path of map keys and list indexes ("0") into an object.
func get(o any, path ...string) any {
	if obj, ok := o.(object); ok {
		o = map[string]any(obj)
	}
	for _, p := range path {
		switch x := o.(type) {
		case map[string]any:
			o = x[p]
		case []any:
			i := 0
			for _, c := range p {
				i = i*10 + int(c-'0')
			}
			if i >= len(x) {
				return nil
			}
			o = x[i]
		default:
			return nil
		}
	}
	return o
}

// env returns a container's environment variable, "" when absent.
func env(t *testing.T, objs map[string]object, key, name string) string {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("%s not rendered", key)
	}
	for _, e := range get(o, "spec", "template", "spec", "containers", "0", "env").([]any) {
		if get(e, "name") == name {
			v, _ := get(e, "value").(string)
			return v
		}
	}
	return ""
}

const plugin = "DaemonSet/das-kubelet-plugin"

func TestLogLevelsRollEveryComponentWithTheirFilter(t *testing.T) {
	for level, want := range map[v1alpha1.LogLevel]string{
		"":                "info",
		v1alpha1.LogDebug: "info,das_driver=debug,das_controller=debug,das_webhook=debug,das_api=debug",
		v1alpha1.LogTrace: "info,das_driver=trace,das_controller=trace,das_webhook=trace,das_api=trace",
	} {
		objs := render(t, v1alpha1.DASOperatorSpec{LogLevel: level}, Settings{})
		for _, key := range []string{plugin, "Deployment/das-controller", "Deployment/das-webhook"} {
			if got := env(t, objs, key, "DAS_LOG_LEVEL"); got != want {
				t.Errorf("logLevel %q: %s has DAS_LOG_LEVEL %q, want %q", level, key, got, want)
			}
		}
	}
	if _, err := Map(v1alpha1.DASOperatorSpec{LogLevel: "Loud"}, Settings{}); err == nil {
		t.Error("logLevel Loud was accepted")
	}
}

func TestEmulatedModeEmulatesGPUsOnEveryNode(t *testing.T) {
	objs := render(t, v1alpha1.DASOperatorSpec{EmulatedMode: true}, Settings{})
	if got := env(t, objs, plugin, "DAS_EMULATED_GPUS"); got != DefaultEmulatedGPUs {
		t.Errorf("DAS_EMULATED_GPUS %q, want the default %q", got, DefaultEmulatedGPUs)
	}
	// No GPU Feature Discovery runs without GPUs: the default node selector goes.
	if sel := get(objs[plugin], "spec", "template", "spec", "nodeSelector"); sel != nil {
		t.Errorf("emulated plugin keeps node selector %v", sel)
	}
	objs = render(t, v1alpha1.DASOperatorSpec{EmulatedMode: true, EmulatedGPUs: "H100-80GB:1"}, Settings{})
	if got := env(t, objs, plugin, "DAS_EMULATED_GPUS"); got != "H100-80GB:1" {
		t.Errorf("DAS_EMULATED_GPUS %q", got)
	}
	// Real GPUs: no emulation, the GFD label selects the nodes.
	objs = render(t, v1alpha1.DASOperatorSpec{}, Settings{})
	if got := env(t, objs, plugin, "DAS_EMULATED_GPUS"); got != "" {
		t.Errorf("real-GPU install emulates %q", got)
	}
	if _, err := Map(v1alpha1.DASOperatorSpec{EmulatedGPUs: "A100-SXM4-40GB:1"}, Settings{}); err == nil {
		t.Error("emulatedGpus without emulatedMode was accepted")
	}
}

func TestNodeSelectorReplacesTheDefault(t *testing.T) {
	sel := map[string]string{"node-role.kubernetes.io/gpu": ""}
	objs := render(t, v1alpha1.DASOperatorSpec{NodeSelector: sel}, Settings{})
	got := get(objs[plugin], "spec", "template", "spec", "nodeSelector")
	if !reflect.DeepEqual(got, map[string]any{"node-role.kubernetes.io/gpu": ""}) {
		t.Errorf("nodeSelector %v, want only the spec's", got)
	}
	// Naming the default label keeps it.
	objs = render(t, v1alpha1.DASOperatorSpec{NodeSelector: map[string]string{gpuPresentLabel: "true", "zone": "a"}}, Settings{})
	got = get(objs[plugin], "spec", "template", "spec", "nodeSelector")
	if !reflect.DeepEqual(got, map[string]any{gpuPresentLabel: "true", "zone": "a"}) {
		t.Errorf("nodeSelector %v", got)
	}
}

func TestImageOverridesByTagAndByDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, c := range []struct {
		spec     *v1alpha1.ImageSpec
		settings Settings
		want     string
	}{
		{nil, Settings{}, "ghcr.io/das-project/das:0.1.0"},
		{nil, Settings{DefaultImage: "registry.example.com/das@" + digest}, "registry.example.com/das@" + digest},
		{&v1alpha1.ImageSpec{Reference: "localhost:5000/das:dev"}, Settings{DefaultImage: "x/das:1"}, "localhost:5000/das:dev"},
	} {
		objs := render(t, v1alpha1.DASOperatorSpec{Image: c.spec}, c.settings)
		for _, key := range []string{plugin, "Deployment/das-controller", "Deployment/das-webhook"} {
			if got := get(objs[key], "spec", "template", "spec", "containers", "0", "image"); got != c.want {
				t.Errorf("%s image %v, want %s", key, got, c.want)
			}
		}
	}
	objs := render(t, v1alpha1.DASOperatorSpec{Image: &v1alpha1.ImageSpec{PullPolicy: "Always", PullSecret: []string{"pull"}}}, Settings{})
	if got := get(objs[plugin], "spec", "template", "spec", "imagePullSecrets", "0", "name"); got != "pull" {
		t.Errorf("imagePullSecrets %v", got)
	}
}

func TestSplitImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0", 64)
	for ref, want := range map[string][3]string{
		"ghcr.io/das-project/das:0.2.0": {"ghcr.io/das-project/das", "0.2.0", ""},
		"localhost:5000/das:dev":        {"localhost:5000/das", "dev", ""},
		"quay.io/das/das@" + digest:     {"quay.io/das/das", "", digest},
		"quay.io/das/das:1.0@" + digest: {"quay.io/das/das", "", digest},
		"localhost:5000/das@" + digest:  {"localhost:5000/das", "", digest},
	} {
		repo, tag, dig, err := SplitImage(ref)
		if err != nil || [3]string{repo, tag, dig} != want {
			t.Errorf("SplitImage(%q) = %q %q %q %v, want %q", ref, repo, tag, dig, err, want)
		}
	}
	for _, bad := range []string{"das", "localhost:5000/das", "das@md5:00"} {
		if _, _, _, err := SplitImage(bad); err == nil {
			t.Errorf("SplitImage(%q) accepted", bad)
		}
	}
}

func TestWebhookHealthAndMetricsOptions(t *testing.T) {
	off, two, quiet, timeout := false, int64(3), int64(60), int64(5)
	objs := render(t, v1alpha1.DASOperatorSpec{Webhook: &v1alpha1.WebhookSpec{Enabled: &off}}, Settings{})
	if _, ok := objs["Deployment/das-webhook"]; ok {
		t.Error("webhook.enabled false still renders the webhook")
	}
	objs = render(t, v1alpha1.DASOperatorSpec{
		Webhook: &v1alpha1.WebhookSpec{Replicas: &two, FailurePolicy: "Ignore", TimeoutSeconds: &timeout},
		Health:  &v1alpha1.HealthSpec{EvictOnFatal: true, QuietPeriodSeconds: &quiet, IgnoredXids: []int{109}},
		Metrics: &v1alpha1.MetricsSpec{Authentication: true},
	}, Settings{})
	if got := get(objs["Deployment/das-webhook"], "spec", "replicas"); got != float64(3) {
		t.Errorf("webhook replicas %v", got)
	}
	if got := get(objs["MutatingWebhookConfiguration/das-webhook"], "webhooks", "0", "failurePolicy"); got != "Ignore" {
		t.Errorf("failurePolicy %v", got)
	}
	for name, want := range map[string]string{
		"DAS_HEALTH_EVICT_ON_FATAL": "true", "DAS_HEALTH_QUIET_PERIOD_SECONDS": "60",
		"DAS_HEALTH_IGNORED_XIDS": "109", "DAS_METRICS_AUTH": "tokenreview",
	} {
		if got := env(t, objs, plugin, name); got != want {
			t.Errorf("%s %q, want %q", name, got, want)
		}
	}
	if _, err := Map(v1alpha1.DASOperatorSpec{Webhook: &v1alpha1.WebhookSpec{TLSMode: "secret"}}, Settings{}); err == nil {
		t.Error("tlsMode secret without its Secret was accepted")
	}
}

func TestNetworkPoliciesAndOpenShiftSCCs(t *testing.T) {
	objs := render(t, v1alpha1.DASOperatorSpec{}, Settings{})
	for key := range objs {
		if strings.HasPrefix(key, "NetworkPolicy/") || strings.Contains(key, "das-scc") {
			t.Errorf("%s rendered by default", key)
		}
	}
	objs = render(t, v1alpha1.DASOperatorSpec{NetworkPolicy: &v1alpha1.NetworkPolicySpec{
		Enabled: true, MetricsNamespaces: []string{"openshift-monitoring"}}}, Settings{OpenShift: true})
	for _, key := range []string{"NetworkPolicy/das-webhook", "NetworkPolicy/das-controller-metrics",
		"NetworkPolicy/das-kubelet-plugin-metrics", "ClusterRole/das-scc-plugin", "RoleBinding/das-scc-components"} {
		if _, ok := objs[key]; !ok {
			t.Errorf("%s not rendered", key)
		}
	}
	from := get(objs["NetworkPolicy/das-controller-metrics"], "spec", "ingress", "0", "from", "0",
		"namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
	if from != "openshift-monitoring" {
		t.Errorf("metrics ingress from %v", from)
	}
	if got := get(objs["ClusterRole/das-scc-plugin"], "rules", "0", "resourceNames", "0"); got != "privileged" {
		t.Errorf("plugin SCC %v", got)
	}
}

func TestCRDsFollowSettings(t *testing.T) {
	if _, ok := render(t, v1alpha1.DASOperatorSpec{}, Settings{InstallCRDs: true})["CustomResourceDefinition/allocationclaims.inference.redhat.com"]; !ok {
		t.Error("InstallCRDs does not install the AllocationClaim CRD")
	}
	if _, ok := render(t, v1alpha1.DASOperatorSpec{}, Settings{})["CustomResourceDefinition/allocationclaims.inference.redhat.com"]; ok {
		t.Error("the CRD is installed under OLM (InstallCRDs false)")
	}
}

func TestFromSpecRefusesUnknownFields(t *testing.T) {
	if _, err := FromSpec(map[string]any{"logLevel": "Debug", "emulated": true}, Settings{}); err == nil ||
		!strings.Contains(err.Error(), "emulated") {
		t.Errorf("unknown field: %v", err)
	}
	vals, err := FromSpec(map[string]any{"logLevel": "Debug", "wholeGpus": map[string]any{"enabled": true}}, Settings{})
	if err != nil || get(vals, "wholeGpus", "enabled") != true {
		t.Errorf("FromSpec: %v %v", vals, err)
	}
}

func TestClusterTLSProfileReachesTheWebhook(t *testing.T) {
	const hook = "Deployment/das-webhook"
	modern := tlsprofile.FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileModernType})
	objs := render(t, v1alpha1.DASOperatorSpec{}, Settings{ClusterTLS: &modern})
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_MIN_VERSION"); got != "VersionTLS13" {
		t.Errorf("Modern: DAS_WEBHOOK_TLS_MIN_VERSION %q", got)
	}
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_CIPHER_SUITES"); got != "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256" {
		t.Errorf("Modern: DAS_WEBHOOK_TLS_CIPHER_SUITES %q", got)
	}
	// Old asks for TLS 1.0: das-webhook gets 1.2, and Old's list.
	old := tlsprofile.FromAPIServer(&configv1.TLSSecurityProfile{Type: configv1.TLSProfileOldType})
	objs = render(t, v1alpha1.DASOperatorSpec{}, Settings{ClusterTLS: &old})
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_MIN_VERSION"); got != "VersionTLS12" {
		t.Errorf("Old: DAS_WEBHOOK_TLS_MIN_VERSION %q", got)
	}
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_CIPHER_SUITES"); got != strings.Join(old.Ciphers, ",") {
		t.Errorf("Old: DAS_WEBHOOK_TLS_CIPHER_SUITES %q", got)
	}
	// Not OpenShift: the chart's defaults.
	objs = render(t, v1alpha1.DASOperatorSpec{}, Settings{})
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_MIN_VERSION"); got != "VersionTLS12" {
		t.Errorf("no profile: DAS_WEBHOOK_TLS_MIN_VERSION %q", got)
	}
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_CIPHER_SUITES"); got != "" {
		t.Errorf("no profile: DAS_WEBHOOK_TLS_CIPHER_SUITES %q", got)
	}
	// The spec wins, field by field; the TLS mode beside it is kept.
	objs = render(t, v1alpha1.DASOperatorSpec{Webhook: &v1alpha1.WebhookSpec{
		TLSMinVersion: "VersionTLS13", TLSMode: "secret", SecretName: "hook-tls", CABundle: "Q0E="}},
		Settings{ClusterTLS: &old})
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_MIN_VERSION"); got != "VersionTLS13" {
		t.Errorf("override: DAS_WEBHOOK_TLS_MIN_VERSION %q", got)
	}
	if got := env(t, objs, hook, "DAS_WEBHOOK_TLS_CIPHER_SUITES"); got != strings.Join(old.Ciphers, ",") {
		t.Errorf("override of the version only: DAS_WEBHOOK_TLS_CIPHER_SUITES %q", got)
	}
	if got := get(objs["MutatingWebhookConfiguration/das-webhook"], "webhooks", "0", "clientConfig", "caBundle"); got != "UTBFPQ==" {
		t.Errorf("tlsMode secret lost beside the TLS profile: caBundle %v", got)
	}
	tls, err := WebhookTLS(v1alpha1.DASOperatorSpec{Webhook: &v1alpha1.WebhookSpec{
		TLSCipherSuites: []string{"TLS_AES_256_GCM_SHA384"}}}, Settings{ClusterTLS: &modern})
	if err != nil || tls.MinVersion != "VersionTLS13" || !reflect.DeepEqual(tls.CipherSuites, []string{"TLS_AES_256_GCM_SHA384"}) ||
		!strings.Contains(tls.Source, "spec.webhook.tlsCipherSuites (over the cluster's Modern TLS profile)") {
		t.Errorf("cipher override over Modern: %+v %v", tls, err)
	}
	// A cluster profile das-webhook cannot serve is refused, naming the override.
	cbc := tlsprofile.Profile{Name: "Custom", MinTLSVersion: "VersionTLS12", Ciphers: []string{"AES128-SHA"}}
	if _, err := Map(v1alpha1.DASOperatorSpec{}, Settings{ClusterTLS: &cbc}); err == nil ||
		!strings.Contains(err.Error(), "spec.webhook.tlsCipherSuites") {
		t.Errorf("a CBC-only profile: %v", err)
	}
	if _, err := Map(v1alpha1.DASOperatorSpec{Webhook: &v1alpha1.WebhookSpec{
		TLSCipherSuites: []string{"TLS_AES_128_GCM_SHA256"}}}, Settings{ClusterTLS: &cbc}); err != nil {
		t.Errorf("the spec's suites over a CBC-only profile: %v", err)
	}
}
