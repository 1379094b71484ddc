package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Inputs are the repository files and the release facts a bundle is made of.
type Inputs struct {
	BaseCSV, OperatorCRD, ChartCRD, ClusterRole, Role, SamplesDir string
	Version, Replaces, OperatorImage, DASImage                    string
	Channel, OpenShiftVersions                                    string
}

// PackageName is the OLM package (and the CSV's name prefix).
const PackageName = "das-operator"

// Placeholders in the base CSV's Deployment.
const (
	operatorImagePlaceholder = "OPERATOR_IMAGE"
	dasImagePlaceholder      = "DAS_IMAGE"
)

// Generate returns the bundle's files, path -> content, deterministic for the same inputs (no
// creation timestamp) so that two runs can be compared.
func Generate(in Inputs) (map[string][]byte, error) {
	version, err := semver.Parse(in.Version)
	if err != nil {
		return nil, fmt.Errorf("--version %q: %w", in.Version, err)
	}
	var csv operatorsv1alpha1.ClusterServiceVersion
	if err := readStrict(in.BaseCSV, &csv); err != nil {
		return nil, err
	}
	crds := map[string]*apiextensionsv1.CustomResourceDefinition{}
	files := map[string][]byte{}
	for _, path := range []string{in.OperatorCRD, in.ChartCRD} {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := readStrict(path, &crd); err != nil {
			return nil, err
		}
		// Helm's annotations and labels belong to a chart install, not to OLM's.
		crd.Annotations, crd.Labels = nil, nil
		crds[crd.Name] = &crd
		data, err := yaml.Marshal(&crd)
		if err != nil {
			return nil, err
		}
		files["manifests/"+crd.Spec.Group+"_"+crd.Spec.Names.Plural+".yaml"] = data
	}

	csv.Name = fmt.Sprintf("%s.v%s", PackageName, version)
	csv.Spec.Version.Version = version
	csv.Spec.Replaces = in.Replaces
	if csv.Annotations == nil {
		csv.Annotations = map[string]string{}
	}
	csv.Annotations["containerImage"] = in.OperatorImage
	examples, err := almExamples(in.SamplesDir)
	if err != nil {
		return nil, err
	}
	csv.Annotations["alm-examples"] = examples
	if err := ownedCRDs(&csv, crds); err != nil {
		return nil, err
	}
	if err := setImages(&csv, in.OperatorImage, in.DASImage); err != nil {
		return nil, err
	}
	if err := setPermissions(&csv, in.ClusterRole, in.Role); err != nil {
		return nil, err
	}
	data, err := yaml.Marshal(&csv)
	if err != nil {
		return nil, err
	}
	files["manifests/"+PackageName+".clusterserviceversion.yaml"] = data
	files["metadata/annotations.yaml"], files["bundle.Dockerfile"] = annotations(in)
	return files, nil
}

// almExamples joins the samples into the JSON list OperatorHub pre-fills its forms from.
func almExamples(dir string) (string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	var objs []map[string]any
	for _, p := range paths {
		var o map[string]any
		if err := readStrict(p, &o); err != nil {
			return "", err
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		return "", fmt.Errorf("no sample custom resource in %s", dir)
	}
	data, err := json.MarshalIndent(objs, "", "  ")
	return string(data), err
}

// ownedCRDs checks that the base lists exactly the bundle's CRDs and fills each one's version
// from its file (the storage version).
func ownedCRDs(csv *operatorsv1alpha1.ClusterServiceVersion, crds map[string]*apiextensionsv1.CustomResourceDefinition) error {
	owned := csv.Spec.CustomResourceDefinitions.Owned
	if len(owned) != len(crds) {
		return fmt.Errorf("base CSV owns %d CRDs, the bundle has %d", len(owned), len(crds))
	}
	for i := range owned {
		crd, ok := crds[owned[i].Name]
		if !ok {
			return fmt.Errorf("base CSV owns %s, which no CRD file defines", owned[i].Name)
		}
		if owned[i].Kind != crd.Spec.Names.Kind {
			return fmt.Errorf("base CSV says %s is kind %s, its CRD says %s", crd.Name, owned[i].Kind, crd.Spec.Names.Kind)
		}
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				owned[i].Version = v.Name
			}
		}
	}
	return nil
}

// setImages puts the images into the Deployment (replacing the placeholders) and relatedImages,
// which disconnected mirroring (oc-mirror) reads.
func setImages(csv *operatorsv1alpha1.ClusterServiceVersion, operatorImage, dasImage string) error {
	deployments := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs
	if len(deployments) != 1 {
		return fmt.Errorf("base CSV has %d Deployments, want the operator's only", len(deployments))
	}
	found := false
	containers := deployments[0].Spec.Template.Spec.Containers
	for i := range containers {
		if containers[i].Image == operatorImagePlaceholder {
			containers[i].Image = operatorImage
			found = true
		}
		for j := range containers[i].Env {
			if containers[i].Env[j].Value == dasImagePlaceholder {
				containers[i].Env[j].Value = dasImage
			}
		}
	}
	if !found {
		return fmt.Errorf("base CSV's Deployment has no container with image %s", operatorImagePlaceholder)
	}
	csv.Spec.RelatedImages = []operatorsv1alpha1.RelatedImage{
		{Name: "das-operator", Image: operatorImage},
		{Name: "das", Image: dasImage},
	}
	return nil
}

// setPermissions copies the operator's RBAC rules into the CSV for its service account.
func setPermissions(csv *operatorsv1alpha1.ClusterServiceVersion, clusterRolePath, rolePath string) error {
	sa := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.ServiceAccountName
	if sa == "" {
		return fmt.Errorf("base CSV's Deployment names no serviceAccountName")
	}
	var clusterRole rbacv1.ClusterRole
	if err := readStrict(clusterRolePath, &clusterRole); err != nil {
		return err
	}
	var role rbacv1.Role
	if err := readStrict(rolePath, &role); err != nil {
		return err
	}
	if err := leastPrivilege(clusterRolePath, clusterRole.Rules); err != nil {
		return err
	}
	if err := leastPrivilege(rolePath, role.Rules); err != nil {
		return err
	}
	for _, m := range csv.Spec.InstallModes {
		if m.Type == operatorsv1alpha1.InstallModeTypeAllNamespaces && m.Supported && len(role.Rules) > 0 {
			return fmt.Errorf("base CSV supports AllNamespaces: OLM would grant the namespaced permissions of %s "+
				"cluster-wide; support OwnNamespace only", rolePath)
		}
	}
	spec := &csv.Spec.InstallStrategy.StrategySpec
	spec.ClusterPermissions = []operatorsv1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: clusterRole.Rules}}
	spec.Permissions = []operatorsv1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: role.Rules}}
	return nil
}

// leastPrivilege refuses rules with which the operator could grant itself more than it holds
// (escalate, bind, impersonate) or that name everything (a wildcard): deploy/olm/rbac is
// derived from the chart without them (operator/internal/rbac).
func leastPrivilege(path string, rules []rbacv1.PolicyRule) error {
	for _, r := range rules {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.NonResourceURLs} {
			for _, s := range list {
				if s == "*" || s == "escalate" || s == "bind" || s == "impersonate" {
					return fmt.Errorf("%s grants %q (%v): the operator must hold no escalation verb and no wildcard; "+
						"regenerate it with `make operator-rbac`", path, s, r)
				}
			}
		}
	}
	return nil
}

// annotations returns metadata/annotations.yaml and bundle.Dockerfile, which carry the same
// keys (the file for OLM's registry, the labels for the image).
func annotations(in Inputs) ([]byte, []byte) {
	keys := [][2]string{
		{"operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"},
		{"operators.operatorframework.io.bundle.manifests.v1", "manifests/"},
		{"operators.operatorframework.io.bundle.metadata.v1", "metadata/"},
		{"operators.operatorframework.io.bundle.package.v1", PackageName},
		{"operators.operatorframework.io.bundle.channels.v1", in.Channel},
		{"operators.operatorframework.io.bundle.channel.default.v1", in.Channel},
		{"com.redhat.openshift.versions", in.OpenShiftVersions},
	}
	var a, d bytes.Buffer
	a.WriteString("# Written by `make bundle` (operator/bundle); do not edit.\nannotations:\n")
	d.WriteString("# Written by `make bundle` (operator/bundle): `podman build -f bundle.Dockerfile -t IMG bundle/`.\nFROM scratch\n")
	for _, kv := range keys {
		fmt.Fprintf(&a, "  %s: %s\n", kv[0], quote(kv[1]))
		fmt.Fprintf(&d, "LABEL %s=%s\n", kv[0], kv[1])
	}
	d.WriteString("COPY manifests /manifests/\nCOPY metadata /metadata/\n")
	return a.Bytes(), d.Bytes()
}

// quote writes a YAML scalar that stays a string ("registry+v1", "v4.21").
func quote(s string) string {
	data, _ := json.Marshal(s)
	return string(data)
}

// readStrict reads one YAML object, refusing fields its Go type does not have: a typo in the
// base CSV fails the build instead of vanishing from the bundle.
func readStrict(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// WriteDir replaces dir with files.
func WriteDir(dir string, files map[string][]byte) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if !strings.HasSuffix(string(data), "\n") {
			data = append(data, '\n')
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
