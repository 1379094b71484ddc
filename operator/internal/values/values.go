// Package values turns a DASOperator's spec into values of the DAS Helm chart
// (deploy/helm/das/values.yaml). It is the whole contract between the custom resource and the
// chart: every spec field is mapped here and nowhere else, and values_test.go renders the chart
// with the result to check that each field reaches the objects it is meant to change.
package values

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/das-project/das/operator/api/v1alpha1"
	"github.com/das-project/das/operator/internal/tlsprofile"
)

// DefaultEmulatedGPUs is what every node emulates when emulatedMode is on and emulatedGpus is
// empty: the GPUs of the chart's ci/emulated-values.yaml.
const DefaultEmulatedGPUs = "A100-SXM4-40GB:2"

// gpuPresentLabel is the chart's default node selector of the plugin (GPU Feature Discovery).
const gpuPresentLabel = "nvidia.com/gpu.present"

// logFilters maps the removed operator's log levels onto tracing filters: the DAS crates at the
// level asked for, their libraries (kube, hyper, tonic) at info so that Trace stays readable.
var logFilters = map[v1alpha1.LogLevel]string{
	v1alpha1.LogNormal: "info",
	v1alpha1.LogDebug:  "info,das_driver=debug,das_controller=debug,das_webhook=debug,das_api=debug",
	v1alpha1.LogTrace:  "info,das_driver=trace,das_controller=trace,das_webhook=trace,das_api=trace",
}

// LogFilter returns the chart's logging.level for a level ("" means Normal).
func LogFilter(level v1alpha1.LogLevel) (string, error) {
	if level == "" {
		level = v1alpha1.LogNormal
	}
	f, ok := logFilters[level]
	if !ok {
		return "", fmt.Errorf("logLevel %q: want Normal, Debug or Trace", level)
	}
	return f, nil
}

// Settings are what the operator itself brings to every release, besides the CR: they depend on
// how and where the operator runs, not on what the admin asks for.
type Settings struct {
	// DefaultImage is the DAS image when the CR names none: the operator's RELATED_IMAGE_DAS
	// (the bundle pins it by digest). Empty: the chart's default.
	DefaultImage string
	// InstallCRDs lets the chart install the AllocationClaim CRD. Off under OLM, which owns
	// the CRD through the bundle (Helm would refuse to take over an object it did not create).
	InstallCRDs bool
	// OpenShift turns on the chart's SCC bindings (openshift.scc.enabled).
	OpenShift bool
	// ClusterTLS is the cluster's TLS security profile (OpenShift's APIServer), applied to the
	// webhook unless the spec sets webhook.tlsMinVersion or webhook.tlsCipherSuites; nil: none
	// (not OpenShift), the chart's defaults.
	ClusterTLS *tlsprofile.Profile
}

// FromSpec decodes a DASOperator's spec (as the unstructured object carries it) and maps it.
func FromSpec(spec map[string]any, s Settings) (map[string]any, error) {
	typed, err := Decode(spec)
	if err != nil {
		return nil, err
	}
	return Map(typed, s)
}

// Decode decodes a DASOperator's spec as the unstructured object carries it.
func Decode(spec map[string]any) (v1alpha1.DASOperatorSpec, error) {
	var typed v1alpha1.DASOperatorSpec
	raw, err := json.Marshal(spec)
	if err != nil {
		return typed, err
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	// The CRD's schema already rejects unknown fields; this catches a CRD that drifted from
	// the types rather than silently ignoring what the admin set.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&typed); err != nil {
		return typed, fmt.Errorf("spec: %w", err)
	}
	return typed, nil
}

// WebhookTLS is the webhook's TLS minimum version and cipher suites: each of
// spec.webhook.tlsMinVersion and .tlsCipherSuites when set, else the cluster's profile
// (Settings.ClusterTLS), fitted to das-webhook (tlsprofile.ForWebhook). Empty without either.
func WebhookTLS(spec v1alpha1.DASOperatorSpec, s Settings) (tlsprofile.Webhook, error) {
	var minVersion, source string
	var ciphers []string
	var from []string
	if c := s.ClusterTLS; c != nil {
		minVersion, ciphers = c.MinTLSVersion, c.Ciphers
		source = "the cluster's " + c.Name + " TLS profile"
	}
	if w := spec.Webhook; w != nil {
		if w.TLSMinVersion != "" {
			minVersion = w.TLSMinVersion
			from = append(from, "spec.webhook.tlsMinVersion")
		}
		if len(w.TLSCipherSuites) > 0 {
			ciphers = w.TLSCipherSuites
			from = append(from, "spec.webhook.tlsCipherSuites")
		}
	}
	switch {
	case len(from) > 0 && source != "":
		source = strings.Join(from, " and ") + " (over " + source + ")"
	case len(from) > 0:
		source = strings.Join(from, " and ")
	case source == "":
		return tlsprofile.Webhook{Source: "the chart's defaults"}, nil
	}
	tls, err := tlsprofile.ForWebhook(minVersion, ciphers, source)
	if err != nil && s.ClusterTLS != nil && (spec.Webhook == nil || len(spec.Webhook.TLSCipherSuites) == 0) {
		return tls, fmt.Errorf("%w: set spec.webhook.tlsCipherSuites of the DASOperator to override the cluster's", err)
	}
	return tls, err
}

// Map returns the chart values for a spec. Only what the spec (or Settings) sets is written;
// everything else keeps the chart's default, so a chart upgrade brings its new defaults along.
func Map(spec v1alpha1.DASOperatorSpec, s Settings) (map[string]any, error) {
	v := map[string]any{}
	level, err := LogFilter(spec.LogLevel)
	if err != nil {
		return nil, err
	}
	logging := map[string]any{"level": level}
	if spec.LogFormat != "" {
		logging["format"] = spec.LogFormat
	}
	v["logging"] = logging
	v["crds"] = map[string]any{"install": s.InstallCRDs}
	if s.OpenShift {
		v["openshift"] = map[string]any{"scc": map[string]any{"enabled": true}}
	}

	plugin := map[string]any{}
	if spec.EmulatedMode {
		gpus := spec.EmulatedGPUs
		if gpus == "" {
			gpus = DefaultEmulatedGPUs
		}
		plugin["emulatedGpus"] = gpus
	} else if spec.EmulatedGPUs != "" {
		return nil, fmt.Errorf("emulatedGpus is set but emulatedMode is off: set emulatedMode: true to emulate GPUs")
	}
	if spec.NodeSelector != nil {
		// Helm merges maps with the chart's defaults: a null drops the default GPU label
		// unless the admin's selector names it.
		sel := map[string]any{gpuPresentLabel: nil}
		for k, val := range spec.NodeSelector {
			sel[k] = val
		}
		plugin["nodeSelector"] = sel
	}
	if spec.Tolerations != nil {
		tol, err := toValues(spec.Tolerations)
		if err != nil {
			return nil, err
		}
		plugin["tolerations"] = tol
	}
	if spec.DriverRoot != nil {
		plugin["driverRoot"] = *spec.DriverRoot
	}
	if len(plugin) > 0 {
		v["kubeletPlugin"] = plugin
	}

	if w := spec.WholeGPUs; w != nil {
		if w.SwitchMigMode && !w.Enabled {
			return nil, fmt.Errorf("wholeGpus.switchMigMode needs wholeGpus.enabled")
		}
		v["wholeGpus"] = map[string]any{"enabled": w.Enabled, "switchMigMode": w.SwitchMigMode}
	}
	if h := spec.Health; h != nil {
		health := map[string]any{"evictOnFatal": h.EvictOnFatal}
		if h.QuietPeriodSeconds != nil {
			health["quietPeriodSeconds"] = *h.QuietPeriodSeconds
		}
		if h.IgnoredXids != nil {
			xids := make([]any, len(h.IgnoredXids))
			for i, x := range h.IgnoredXids {
				xids[i] = x
			}
			health["ignoredXids"] = xids
		}
		v["health"] = health
	}
	tls, err := WebhookTLS(spec, s)
	if err != nil {
		return nil, err
	}
	if w := spec.Webhook; w != nil || tls.MinVersion != "" || len(tls.CipherSuites) > 0 {
		hook, err := webhookValues(w, tls)
		if err != nil {
			return nil, err
		}
		v["webhook"] = hook
	}
	if m := spec.Metrics; m != nil {
		v["metrics"] = map[string]any{
			"authentication": m.Authentication,
			"serviceMonitor": map[string]any{"enabled": m.ServiceMonitor},
		}
	}
	if n := spec.NetworkPolicy; n != nil {
		ns := make([]any, len(n.MetricsNamespaces))
		for i, name := range n.MetricsNamespaces {
			ns[i] = name
		}
		v["networkPolicy"] = map[string]any{"enabled": n.Enabled, "metricsNamespaces": ns}
	}

	ref := s.DefaultImage
	image := map[string]any{}
	if spec.Image != nil {
		if spec.Image.Reference != "" {
			ref = spec.Image.Reference
		}
		if spec.Image.PullPolicy != "" {
			image["pullPolicy"] = spec.Image.PullPolicy
		}
		if len(spec.Image.PullSecret) > 0 {
			secrets := make([]any, len(spec.Image.PullSecret))
			for i, name := range spec.Image.PullSecret {
				secrets[i] = map[string]any{"name": name}
			}
			v["imagePullSecrets"] = secrets
		}
	}
	if ref != "" {
		repo, tag, digest, err := SplitImage(ref)
		if err != nil {
			return nil, err
		}
		image["repository"] = repo
		image["tag"] = tag
		image["digest"] = digest
	}
	if len(image) > 0 {
		v["image"] = image
	}
	return v, nil
}

// webhookValues maps the webhook section (w may be nil when only the cluster's TLS profile sets
// something) and the TLS version and suites; the TLS mode's companions are checked here because
// the chart's own message (a `required` failure deep in a template) would reach the admin only
// as a failed release.
func webhookValues(w *v1alpha1.WebhookSpec, t tlsprofile.Webhook) (map[string]any, error) {
	hook := map[string]any{}
	tls := map[string]any{}
	if t.MinVersion != "" {
		tls["minVersion"] = t.MinVersion
	}
	if len(t.CipherSuites) > 0 {
		suites := make([]any, len(t.CipherSuites))
		for i, name := range t.CipherSuites {
			suites[i] = name
		}
		tls["cipherSuites"] = suites
	}
	if len(tls) > 0 {
		hook["tls"] = tls // the same map: tlsMode below adds to it
	}
	if w == nil {
		return hook, nil
	}
	hook["translateWholeGpus"] = w.TranslateWholeGPUs
	if w.Enabled != nil {
		hook["enabled"] = *w.Enabled
	}
	if w.Replicas != nil {
		hook["replicas"] = *w.Replicas
	}
	if w.FailurePolicy != "" {
		hook["failurePolicy"] = w.FailurePolicy
	}
	if w.TimeoutSeconds != nil {
		hook["timeoutSeconds"] = *w.TimeoutSeconds
	}
	if w.TLSMode != "" {
		tls["mode"] = w.TLSMode
		if w.TLSMode == "secret" {
			if w.SecretName == "" || w.CABundle == "" {
				return nil, fmt.Errorf("webhook.tlsMode secret needs webhook.secretName and webhook.caBundle")
			}
			tls["secretName"] = w.SecretName
			tls["caBundle"] = w.CABundle
		}
		hook["tls"] = tls
	}
	return hook, nil
}

// SplitImage splits an image reference into the chart's repository, tag and digest:
// `reg:5000/das:0.2` gives ("reg:5000/das", "0.2", ""), `reg/das@sha256:…` gives
// ("reg/das", "", "sha256:…"). A reference without tag or digest is refused: the chart would
// pull its own appVersion, which is rarely what an override means.
func SplitImage(ref string) (repo, tag, digest string, err error) {
	if at := strings.Index(ref, "@"); at >= 0 {
		repo, digest = ref[:at], ref[at+1:]
		if name, _, ok := cutTag(repo); ok {
			repo = name // a tag beside a digest is ignored, as container runtimes do
		}
		if repo == "" || !strings.HasPrefix(digest, "sha256:") {
			return "", "", "", fmt.Errorf("image %q: want REPOSITORY@sha256:<hex>", ref)
		}
		return repo, "", digest, nil
	}
	name, t, ok := cutTag(ref)
	if !ok || name == "" || t == "" {
		return "", "", "", fmt.Errorf("image %q: want REPOSITORY:TAG or REPOSITORY@sha256:<hex>", ref)
	}
	return name, t, "", nil
}

// cutTag splits `name:tag`, where a colon before the last slash belongs to a registry port.
func cutTag(ref string) (name, tag string, ok bool) {
	colon := strings.LastIndex(ref, ":")
	if colon < 0 || colon < strings.LastIndex(ref, "/") {
		return ref, "", false
	}
	return ref[:colon], ref[colon+1:], true
}

// toValues turns a typed value into the plain maps and slices Helm values are made of.
func toValues(x any) (any, error) {
	raw, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(raw, &out)
}
