package rbac

import (
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// Namespace is the release namespace the chart is rendered into for the derivation. Any name
// gives the same rules (no rule of the chart names its namespace); this is the namespace the
// CSV suggests.
const Namespace = "das-operator"

// NotFeatures are the chart's boolean values that stay off in every render, with why: the
// operator never turns them on under OLM, so it needs no permission for what they render.
var NotFeatures = map[string]string{
	"crds.install":     "OLM installs the AllocationClaim CRD from the bundle (--install-crds=false)",
	"namespace.create": "the operator's namespace exists before the operator (OLM installs it there)",
	"sharing.acrossNamespaces": "on only leaves the shared-claims webhook out of das-webhook's " +
		"MutatingWebhookConfiguration, an object the render with it off has already",
}

// FeatureSets are the chart values rendered, each over the chart's defaults: every optional
// feature on, once per webhook certificate mode that renders objects (`helm`: a Secret;
// `certManager`: an Issuer and a Certificate). profiles are the chart's
// deviceClasses.profiles, every one also shared (sharing.profiles), so that every DeviceClass
// name the chart can render is known. TestEveryBooleanOfTheChartIsDecided keeps this list in
// step with values.yaml.
func FeatureSets(profiles []any) []map[string]any {
	var sets []map[string]any
	for _, tlsMode := range []string{"helm", "certManager"} {
		sets = append(sets, map[string]any{
			"crds":      map[string]any{"install": false},
			"namespace": map[string]any{"create": false},
			"deviceClasses": map[string]any{
				"extendedResourceNames": true, "deprecatedAliases": true,
			},
			"wholeGpus": map[string]any{
				"enabled": true, "switchMigMode": true, "extendedResourceName": true,
			},
			"sharing":         map[string]any{"profiles": profiles, "acrossNamespaces": false},
			"carveBeforeBind": map[string]any{"enabled": true},
			"kubeletPlugin": map[string]any{
				"enableMigMode": true, "reclaimForeignSlices": true,
			},
			"controller": map[string]any{"podDisruptionBudget": map[string]any{"enabled": true}},
			"webhook": map[string]any{
				"enabled": true, "translateWholeGpus": true, "validateDeviceConfigs": true,
				"tls":                 map[string]any{"mode": tlsMode},
				"podDisruptionBudget": map[string]any{"enabled": true},
			},
			"resourceSlicePolicy":       map[string]any{"enabled": true},
			"resourceClaimStatusPolicy": map[string]any{"enabled": true},
			"health":                    map[string]any{"evictOnFatal": true},
			"metrics": map[string]any{
				"authentication": true, "serviceMonitor": map[string]any{"enabled": true},
			},
			"networkPolicy": map[string]any{"enabled": true},
			"mps":           map[string]any{"shmOnEmulatedGpus": true, "host": map[string]any{"enabled": true}},
			"openshift":     map[string]any{"scc": map[string]any{"enabled": true}},
		})
	}
	return sets
}

// Render renders c offline into Namespace with each of FeatureSets, on a cluster that serves
// every API the chart asks about (Kubernetes 1.36, the Prometheus Operator's ServiceMonitor),
// and returns every object of every render (the derivation takes their union).
func Render(c *chart.Chart) ([]Object, error) {
	dc, _ := c.Values["deviceClasses"].(map[string]any)
	profiles, _ := dc["profiles"].([]any)
	if len(profiles) == 0 {
		return nil, fmt.Errorf("the chart's values.yaml lists no deviceClasses.profiles")
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.36.0", Major: "1", Minor: "36"}
	caps.APIVersions = append(caps.APIVersions, "monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor")
	var out []Object
	for _, vals := range FeatureSets(profiles) {
		rv, err := chartutil.ToRenderValues(c, vals,
			chartutil.ReleaseOptions{Name: "das", Namespace: Namespace, IsInstall: true}, caps)
		if err != nil {
			return nil, fmt.Errorf("the chart refuses the all-features values: %w", err)
		}
		files, err := engine.Render(c, rv)
		if err != nil {
			return nil, fmt.Errorf("render the chart with every feature on: %w", err)
		}
		objs, err := parse(files)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// parse reads the objects of rendered templates (YAML documents; NOTES.txt and empty
// documents skipped), in file order.
func parse(files map[string]string) ([]Object, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []Object
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(files[name], "\n---") {
			var o Object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if o.Kind == "" {
				continue
			}
			out = append(out, o)
		}
	}
	return out, nil
}
