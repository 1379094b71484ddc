package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	"sigs.k8s.io/yaml"
)

// repoInputs are the repository's real inputs, as `make bundle` passes them.
func repoInputs() Inputs {
	root := "../.."
	return Inputs{
		BaseCSV:           filepath.Join(root, "deploy/olm/base/das-operator.clusterserviceversion.yaml"),
		OperatorCRD:       filepath.Join(root, "deploy/olm/crd/operator.das.com_dasoperators.yaml"),
		ChartCRD:          filepath.Join(root, "deploy/helm/das/files/allocationclaims.yaml"),
		ClusterRole:       filepath.Join(root, "deploy/olm/rbac/cluster-role.yaml"),
		Role:              filepath.Join(root, "deploy/olm/rbac/role.yaml"),
		SamplesDir:        filepath.Join(root, "deploy/olm/samples"),
		Version:           "0.1.0",
		OperatorImage:     "registry.example.com/das-operator@sha256:" + strings.Repeat("a", 64),
		DASImage:          "registry.example.com/das@sha256:" + strings.Repeat("b", 64),
		Channel:           "candidate-v0",
		OpenShiftVersions: "v4.21",
	}
}

// The bundle of the repository's inputs passes every validator, and generating twice gives
// the same bytes (no timestamps), so a bundle image is reproducible.
func TestRepositoryBundleValidatesAndIsReproducible(t *testing.T) {
	files, err := Generate(repoInputs())
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Generate(repoInputs())
	for name, data := range files {
		if !bytes.Equal(data, again[name]) {
			t.Errorf("%s differs between two runs", name)
		}
	}
	dir := t.TempDir()
	if err := WriteDir(dir, files); err != nil {
		t.Fatal(err)
	}
	report, err := Validate(dir, "1.34")
	if err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(report, "\n"))
	}
}

// The generated CSV carries the images where OLM and mirroring tools look for them, and the
// operator's RBAC.
func TestCSVCarriesImagesAndPermissions(t *testing.T) {
	in := repoInputs()
	files, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	var csv operatorsv1alpha1.ClusterServiceVersion
	if err := yaml.UnmarshalStrict(files["manifests/das-operator.clusterserviceversion.yaml"], &csv); err != nil {
		t.Fatal(err)
	}
	if csv.Name != "das-operator.v0.1.0" || csv.Annotations["containerImage"] != in.OperatorImage {
		t.Errorf("name %s, containerImage %s", csv.Name, csv.Annotations["containerImage"])
	}
	c := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0]
	if c.Image != in.OperatorImage {
		t.Errorf("operator container image %s", c.Image)
	}
	related := false
	for _, e := range c.Env {
		if e.Name == "RELATED_IMAGE_DAS" && e.Value == in.DASImage {
			related = true
		}
	}
	if !related || len(csv.Spec.RelatedImages) != 2 {
		t.Errorf("RELATED_IMAGE_DAS set: %v; relatedImages %v", related, csv.Spec.RelatedImages)
	}
	perms := csv.Spec.InstallStrategy.StrategySpec.ClusterPermissions
	if len(perms) != 1 || perms[0].ServiceAccountName != "das-operator" || len(perms[0].Rules) == 0 {
		t.Fatalf("clusterPermissions %v", perms)
	}
	scc := false
	for _, r := range perms[0].Rules {
		if len(r.APIGroups) == 1 && r.APIGroups[0] == "security.openshift.io" {
			scc = strings.Join(r.ResourceNames, ",") == "nonroot-v2,privileged" && strings.Join(r.Verbs, ",") == "use"
		}
	}
	if !scc {
		t.Error("clusterPermissions do not grant `use` on the privileged and nonroot-v2 SCCs")
	}
	if !strings.Contains(csv.Annotations["alm-examples"], `"kind": "DASOperator"`) {
		t.Error("alm-examples has no DASOperator")
	}
}

// A typo in the base CSV fails generation instead of vanishing from the bundle.
func TestUnknownFieldInTheBaseIsAnError(t *testing.T) {
	in := repoInputs()
	base, err := os.ReadFile(in.BaseCSV)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "csv.yaml")
	broken := strings.Replace(string(base), "  minKubeVersion:", "  minKubeVersoin:", 1)
	if err := os.WriteFile(bad, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	in.BaseCSV = bad
	if _, err := Generate(in); err == nil || !strings.Contains(err.Error(), "minKubeVersoin") {
		t.Fatalf("want an error naming minKubeVersoin, got %v", err)
	}
}

// The operator's roles go into the CSV only without escalation verbs or wildcards, and only
// with an install mode that keeps the namespaced permissions in the operator's namespace.
func TestEscalationAndClusterWidePermissionsAreRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ rule, want string }{
		{"[{apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [escalate]}]", `grants "escalate"`},
		{"[{apiGroups: [rbac.authorization.k8s.io], resources: [clusterrolebindings], verbs: [bind]}]", `grants "bind"`},
		{"[{apiGroups: [\"\"], resources: [\"*\"], verbs: [get]}]", `grants "*"`},
	} {
		in := repoInputs()
		in.ClusterRole = write("cluster-role.yaml", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"+
			"metadata: {name: das-operator}\nrules: "+c.rule+"\n")
		if _, err := Generate(in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rules %s: want an error with %s, got %v", c.rule, c.want, err)
		}
	}
	base, err := os.ReadFile(repoInputs().BaseCSV)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Replace(string(base), "    - type: AllNamespaces\n      supported: false",
		"    - type: AllNamespaces\n      supported: true", 1)
	if all == string(base) {
		t.Fatal("the base CSV has no unsupported AllNamespaces mode to turn on")
	}
	in := repoInputs()
	in.BaseCSV = write("csv.yaml", all)
	if _, err := Generate(in); err == nil || !strings.Contains(err.Error(), "supports AllNamespaces") {
		t.Fatalf("want AllNamespaces refused, got %v", err)
	}
}
