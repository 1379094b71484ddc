package rbac

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/component-helpers/auth/rbac/validation"
)

// The chart and the committed files, read in place.
const (
	chartDir = "../../../deploy/helm/das"
	rbacDir  = "../../../deploy/olm/rbac"
)

var loaded *chart.Chart

func repoChart(t *testing.T) *chart.Chart {
	t.Helper()
	if loaded == nil {
		c, err := loader.Load(chartDir)
		if err != nil {
			t.Fatal(err)
		}
		loaded = c
	}
	return loaded
}

func repoObjects(t *testing.T) []Object {
	t.Helper()
	objs, err := Render(repoChart(t))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func repoPermissions(t *testing.T) Permissions {
	t.Helper()
	p, err := Derive(repoObjects(t), Namespace)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// deploy/olm/rbac is what the chart gives: a chart change that needs another permission fails
// here until `make operator-rbac` is run and the change reviewed.
func TestCommittedFilesMatchTheChart(t *testing.T) {
	if err := Check(rbacDir, repoPermissions(t)); err != nil {
		t.Fatal(err)
	}
}

// The API server's own escalation check (Covers, the function ConfirmNoEscalation uses): the
// operator holds every rule of every ClusterRole the chart renders cluster-wide, and every rule
// of its Roles in the namespace, so it creates, updates and binds them without escalate or bind.
func TestTheOperatorHoldsEveryRuleOfTheChartsRoles(t *testing.T) {
	p := repoPermissions(t)
	cluster := Rules(p.Cluster)
	inNamespace := append(Rules(p.Namespace), cluster...)
	roles := 0
	for _, o := range repoObjects(t) {
		var owner []rbacv1.PolicyRule
		switch o.Kind {
		case "ClusterRole":
			owner = cluster
		case "Role":
			owner = inNamespace
		default:
			continue
		}
		roles++
		if ok, missing := validation.Covers(owner, o.Rules); !ok {
			t.Errorf("%s %s needs %v, which the operator does not hold", o.Kind, o.Metadata.Name, missing)
		}
	}
	if roles < 8 {
		t.Fatalf("only %d roles rendered: the all-features render lost some", roles)
	}
}

// The operator may not grant itself more: no escalate, bind or impersonate, no wildcard.
func TestTheOperatorHoldsNoEscalationVerbOrWildcard(t *testing.T) {
	p := repoPermissions(t)
	for _, r := range append(Rules(p.Cluster), Rules(p.Namespace)...) {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.NonResourceURLs} {
			for _, s := range list {
				if s == "*" || s == "escalate" || s == "bind" || s == "impersonate" {
					t.Errorf("rule %v grants %q", r, s)
				}
			}
		}
	}
}

// Cluster-wide, the operator reads, updates and deletes RBAC objects, DeviceClasses, webhook
// configurations and admission policies only by the names the chart renders.
func TestClusterScopedWritesAreLimitedToDASsNames(t *testing.T) {
	p := repoPermissions(t)
	limited := map[string]bool{"clusterroles": true, "clusterrolebindings": true, "deviceclasses": true,
		"mutatingwebhookconfigurations": true, "validatingwebhookconfigurations": true,
		"validatingadmissionpolicies": true, "validatingadmissionpolicybindings": true,
		"namespaces": true, "dasoperators": true, "apiservers": true}
	names := map[string]map[string]bool{}
	for _, r := range Rules(p.Cluster) {
		for _, a := range atomsOf(r) {
			if !limited[a.resource] || a.verb == "list" || a.verb == "watch" || a.verb == "create" {
				continue
			}
			if a.name == "" {
				t.Errorf("%s %s on every name", a.verb, a.resource)
			}
			if names[a.resource] == nil {
				names[a.resource] = map[string]bool{}
			}
			names[a.resource][a.name] = true
		}
	}
	for resource, want := range map[string]string{
		"clusterroles":                "das-kubelet-plugin",
		"clusterrolebindings":         "das-controller",
		"validatingadmissionpolicies": "das-resourceclaim-status-own-node",
		"deviceclasses":               "gpu.das.com",
	} {
		if !names[resource][want] {
			t.Errorf("%s: %s is not among the names %v", resource, want, names[resource])
		}
	}
	if _, ok := names["namespaces"]; ok {
		t.Error("the ClusterRole names namespaces: the install namespace is the Role's")
	}
}

// Every boolean of the chart's values.yaml is decided for the all-features render: on, or off
// with a reason (NotFeatures). A new feature switch in the chart fails here until it is.
func TestEveryBooleanOfTheChartIsDecided(t *testing.T) {
	set := FeatureSets([]any{"1g.10gb"})[0]
	var bools []string
	walkBools(repoChart(t).Values, "", &bools)
	sort.Strings(bools)
	if len(bools) < 10 {
		t.Fatalf("only %d booleans found in values.yaml: %v", len(bools), bools)
	}
	for _, path := range bools {
		v, ok := lookup(set, path)
		switch {
		case !ok:
			t.Errorf("%s: not set by FeatureSets; turn it on, or off in NotFeatures with why", path)
		case v == false && NotFeatures[path] == "":
			t.Errorf("%s: off in FeatureSets without a reason in NotFeatures", path)
		case v == true && NotFeatures[path] != "":
			t.Errorf("%s: on in FeatureSets but listed in NotFeatures", path)
		}
	}
}

func walkBools(v any, path string, out *[]string) {
	switch x := v.(type) {
	case bool:
		*out = append(*out, path)
	case map[string]any:
		for k, child := range x {
			p := k
			if path != "" {
				p = path + "." + k
			}
			walkBools(child, p, out)
		}
	}
}

func lookup(m map[string]any, path string) (any, bool) {
	var cur any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// The files read back (as `make bundle` reads them) to exactly the derived rules.
func TestFilesReadBackToTheRules(t *testing.T) {
	p := repoPermissions(t)
	files := Files(p)
	for name, want := range map[string][]rbacv1.PolicyRule{
		ClusterRoleFile: Rules(p.Cluster), RoleFile: Rules(p.Namespace)} {
		got, err := ParseRules(files[name])
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, files[name])
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s reads back as\n%v\nwant\n%v", name, got, want)
		}
	}
}

func obj(apiVersion, kind, name, namespace string) Object {
	o := Object{APIVersion: apiVersion, Kind: kind}
	o.Metadata.Name, o.Metadata.Namespace = name, namespace
	return o
}

func clusterRole(name string, rules ...rbacv1.PolicyRule) Object {
	o := obj("rbac.authorization.k8s.io/v1", "ClusterRole", name, "")
	o.Rules = rules
	return o
}

func binding(kind, name, namespace, roleKind, role string) Object {
	o := obj("rbac.authorization.k8s.io/v1", kind, name, namespace)
	o.RoleRef = &rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: roleKind, Name: role}
	return o
}

// A new rule in a chart role becomes the operator's; its new object's name becomes one it
// manages; what an earlier section grants is not repeated.
func TestDeriveFollowsTheChartsRolesAndNames(t *testing.T) {
	objs := []Object{
		clusterRole("das-new", rule("example.com", []string{"widgets"}, nil, "get", "list")),
		binding("ClusterRoleBinding", "das-new", "", "ClusterRole", "das-new"),
		obj("v1", "Service", "das-new", "ns"),
	}
	p, err := Derive(objs, "ns")
	if err != nil {
		t.Fatal(err)
	}
	cluster := Rules(p.Cluster)
	if ok, missing := validation.Covers(cluster, objs[0].Rules); !ok {
		t.Errorf("the new rule is not held: %v", missing)
	}
	if !(atomSet{}).coversAll(cluster, atom{group: "rbac.authorization.k8s.io", resource: "clusterroles", name: "das-new", verb: "update"}) {
		t.Errorf("ClusterRole das-new is not managed by name: %v", cluster)
	}
	if ok, _ := validation.Covers(Rules(p.Namespace), []rbacv1.PolicyRule{
		rule("", []string{"services"}, nil, allVerbs...)}); !ok {
		t.Errorf("Services of the namespace are not managed: %v", p.Namespace)
	}
	seen := map[string]bool{}
	for _, s := range p.Cluster {
		for _, r := range s.Rules {
			for _, a := range atomsOf(r) {
				key := a.group + "/" + a.resource + "/" + a.name + "/" + a.url + "/" + a.verb
				if seen[key] {
					t.Errorf("%s granted twice", key)
				}
				seen[key] = true
			}
		}
	}
}

// What the derivation cannot turn into a bounded role is refused, saying why and what to do.
func TestDeriveRefusesWhatTheOperatorCouldNotHold(t *testing.T) {
	cases := []struct {
		name string
		objs []Object
		want string
	}{
		{"unknown kind", []Object{obj("example.com/v1", "Widget", "w", "")}, "add it to kinds"},
		{"another namespace", []Object{obj("v1", "Service", "s", "kube-system")}, `into namespace "kube-system"`},
		{"foreign role bound", []Object{binding("ClusterRoleBinding", "admin", "", "ClusterRole", "cluster-admin")},
			"binds ClusterRole cluster-admin, which the chart does not render"},
		{"wildcard", []Object{clusterRole("das-all", rule("", []string{"*"}, nil, "get"))}, `grants "*"`},
	}
	for _, c := range cases {
		_, err := Derive(c.objs, "ns")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error with %q, got %v", c.name, c.want, err)
		}
	}
}

// compact merges atoms into few rules, drops named atoms an every-name atom covers, and gives
// the same rules whatever the order of its input.
func TestCompactMergesAndIsDeterministic(t *testing.T) {
	in := []rbacv1.PolicyRule{
		rule("apps", []string{"deployments"}, nil, "get", "list"),
		rule("apps", []string{"daemonsets"}, nil, "list", "get"),
		rule("apps", []string{"deployments"}, []string{"x"}, "get"),
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}
	var atoms []atom
	for _, r := range in {
		atoms = append(atoms, atomsOf(r)...)
	}
	got := compact(atoms)
	want := []rbacv1.PolicyRule{
		rule("apps", []string{"daemonsets", "deployments"}, nil, "get", "list"),
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("compact gave %v, want %v", got, want)
	}
	for i := 0; i < 10; i++ {
		for j := range atoms {
			k := (j*7 + i) % len(atoms)
			atoms[j], atoms[k] = atoms[k], atoms[j]
		}
		if again := compact(atoms); !reflect.DeepEqual(again, got) {
			t.Fatalf("compact depends on the input order: %v vs %v", again, got)
		}
	}
}

// Check names the stale file and the way out.
func TestCheckNamesTheStaleFileAndTheFix(t *testing.T) {
	p := repoPermissions(t)
	dir := t.TempDir()
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir, p); err != nil {
		t.Fatalf("fresh files: %v", err)
	}
	p.Namespace = p.Namespace[1:]
	err := Check(dir, p)
	if err == nil || !strings.Contains(err.Error(), "role.yaml: line") || !strings.Contains(err.Error(), "make operator-rbac") {
		t.Fatalf("want role.yaml named with the fix, got %v", err)
	}
}

// coversAll says whether rules grant a.
func (s atomSet) coversAll(rules []rbacv1.PolicyRule, a atom) bool {
	for _, r := range rules {
		s.add(atomsOf(r))
	}
	return s.covers(a)
}
