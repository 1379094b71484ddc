// Package v1alpha1 holds the DASOperator custom resource (operator.das.com/v1alpha1): the one
// object through which an admin installs DAS with the operator. The CRD that serves it is
// deploy/olm/crd/operator.das.com_dasoperators.yaml, written by hand so that its OpenAPI schema
// can be strict (enums, patterns, bounds); operator/internal/values/crd_test.go keeps that schema
// and these types in step.
//
// The operator reads the object as unstructured JSON (the Helm operator library works on
// unstructured objects) and decodes its spec into DASOperatorSpec; nothing here is registered in
// a scheme.
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of DASOperator.
var GroupVersion = schema.GroupVersion{Group: "operator.das.com", Version: "v1alpha1"}

// Kind is the custom resource's kind; ResourceName its name singleton (the CRD only admits
// an object of this name, as the removed DAS operator did).
const (
	Kind         = "DASOperator"
	ResourceName = "cluster"
)

// GroupVersionKind of DASOperator.
func GroupVersionKind() schema.GroupVersionKind { return GroupVersion.WithKind(Kind) }

// LogLevel is the removed DAS operator's operatorLogLevel: how much the DAS components log.
type LogLevel string

// The levels, mapped onto the chart's logging.level (a tracing filter) by internal/values.
const (
	LogNormal LogLevel = "Normal"
	LogDebug  LogLevel = "Debug"
	LogTrace  LogLevel = "Trace"
)

// DASOperatorSpec is what an admin sets. Every field is optional: the empty spec installs DAS
// for real GPUs with the chart's defaults. Each field maps onto chart values of
// deploy/helm/das (internal/values does the mapping; docs/openshift.md lists it).
type DASOperatorSpec struct {
	// EmulatedMode runs the node plugin on emulated GPUs (no NVIDIA driver): for demos, CI
	// and trying DAS out. The removed operator's EMULATED_MODE.
	EmulatedMode bool `json:"emulatedMode,omitempty"`
	// EmulatedGPUs is the emulated GPU list of every node, `MODEL:COUNT,...` (default
	// A100-SXM4-40GB:2). Only with EmulatedMode.
	EmulatedGPUs string `json:"emulatedGpus,omitempty"`
	// LogLevel of every DAS component: Normal, Debug or Trace.
	LogLevel LogLevel `json:"logLevel,omitempty"`
	// LogFormat of every DAS component: text or json.
	LogFormat string `json:"logFormat,omitempty"`
	// NodeSelector of the node plugin's DaemonSet. Set, it replaces the default
	// (`nvidia.com/gpu.present: "true"`, GPU Feature Discovery's label).
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the node plugin's pods; set, they replace the default (nvidia.com/gpu).
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// DriverRoot is where the NVIDIA driver is installed on the hosts: `/` for a host install,
	// `/run/nvidia/driver` with the GPU Operator's driver container (the usual case on
	// OpenShift).
	DriverRoot *string `json:"driverRoot,omitempty"`
	// WholeGPUs publishes whole GPUs beside MIG slices.
	WholeGPUs *WholeGPUsSpec `json:"wholeGpus,omitempty"`
	// Health is the GPU health handling of the node plugin.
	Health *HealthSpec `json:"health,omitempty"`
	// Webhook is the compatibility webhook for legacy `nvidia.com/mig-<profile>` pods.
	Webhook *WebhookSpec `json:"webhook,omitempty"`
	// Metrics is who may read /metrics and whether ServiceMonitors are made.
	Metrics *MetricsSpec `json:"metrics,omitempty"`
	// NetworkPolicy adds NetworkPolicies that admit only the webhook's and metrics' traffic.
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`
	// Image overrides the DAS image (all three components run from it).
	Image *ImageSpec `json:"image,omitempty"`
}

// WholeGPUsSpec maps onto the chart's wholeGpus.
type WholeGPUsSpec struct {
	Enabled       bool `json:"enabled,omitempty"`
	SwitchMigMode bool `json:"switchMigMode,omitempty"`
}

// HealthSpec maps onto the chart's health.
type HealthSpec struct {
	EvictOnFatal       bool   `json:"evictOnFatal,omitempty"`
	QuietPeriodSeconds *int64 `json:"quietPeriodSeconds,omitempty"`
	IgnoredXids        []int  `json:"ignoredXids,omitempty"`
}

// WebhookSpec maps onto the chart's webhook.
type WebhookSpec struct {
	Enabled            *bool  `json:"enabled,omitempty"`
	Replicas           *int64 `json:"replicas,omitempty"`
	FailurePolicy      string `json:"failurePolicy,omitempty"`
	TimeoutSeconds     *int64 `json:"timeoutSeconds,omitempty"`
	TranslateWholeGPUs bool   `json:"translateWholeGpus,omitempty"`
	// TLSMode: helm (a generated CA), certManager, or secret (SecretName and CABundle).
	TLSMode    string `json:"tlsMode,omitempty"`
	SecretName string `json:"secretName,omitempty"`
	CABundle   string `json:"caBundle,omitempty"`
	// TLSMinVersion (VersionTLS12 or VersionTLS13) and TLSCipherSuites (IANA or OpenSSL names)
	// of the webhook's HTTPS. Each, when set, wins over the cluster's TLS security profile
	// (OpenShift's APIServer), which the operator applies otherwise.
	TLSMinVersion   string   `json:"tlsMinVersion,omitempty"`
	TLSCipherSuites []string `json:"tlsCipherSuites,omitempty"`
}

// MetricsSpec maps onto the chart's metrics.
type MetricsSpec struct {
	Authentication bool `json:"authentication,omitempty"`
	ServiceMonitor bool `json:"serviceMonitor,omitempty"`
}

// NetworkPolicySpec maps onto the chart's networkPolicy.
type NetworkPolicySpec struct {
	Enabled bool `json:"enabled,omitempty"`
	// MetricsFrom are the namespaces (by name) allowed to scrape /metrics; empty: any.
	MetricsNamespaces []string `json:"metricsNamespaces,omitempty"`
}

// ImageSpec overrides the DAS image: a full reference, by tag or by digest.
type ImageSpec struct {
	// Reference such as `registry.example.com/das:0.2.0` or `...das@sha256:<hex>`. Default:
	// the operator's RELATED_IMAGE_DAS (the bundle pins it), else the chart's default.
	Reference  string   `json:"reference,omitempty"`
	PullPolicy string   `json:"pullPolicy,omitempty"`
	PullSecret []string `json:"pullSecrets,omitempty"`
}
