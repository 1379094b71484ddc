// Package rbac derives the DAS operator's own RBAC, deploy/olm/rbac (the CSV's
// clusterPermissions and permissions), from what the DAS chart renders, so that the two cannot
// drift apart (docs/openshift.md, "What the operator may do").
//
// The operator installs the chart's ClusterRoles, Roles and bindings without `escalate` or
// `bind`. The API server then lets it create or update a role only with permissions it holds
// itself, and bind only roles whose permissions it holds (RBAC's escalation check). So the
// operator holds the union of the rules of every role the chart renders with every optional
// feature on, and for DAS's own cluster-scoped objects (roles, bindings, DeviceClasses, webhook
// configurations, admission policies) it may get, update, patch and delete exactly the names the
// chart renders. `create`, `list` and `watch` cannot be limited by name: the Helm library watches
// every kind of the release, and a new object has no name to check yet.
//
// Derive is pure (rendered objects in, rules out); Render renders the chart; Write and Check
// handle the files. cmd/das-rbac is the command `make operator-rbac` runs.
package rbac

import (
	"fmt"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
)

// Object is what the derivation reads of one rendered manifest.
type Object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"metadata"`
	// Rules of a ClusterRole or Role.
	Rules []rbacv1.PolicyRule `json:"rules,omitempty"`
	// RoleRef of a ClusterRoleBinding or RoleBinding.
	RoleRef *rbacv1.RoleRef `json:"roleRef,omitempty"`
}

// Section is a group of rules with the reason they are there, written above them as a comment.
type Section struct {
	Why   string
	Rules []rbacv1.PolicyRule
}

// Permissions are the operator's two roles.
type Permissions struct {
	// Cluster is the ClusterRole das-operator: the CSV's clusterPermissions, cluster-wide.
	Cluster []Section
	// Namespace is the Role das-operator: the CSV's permissions, which OLM grants in the
	// operator's namespace (install mode OwnNamespace), where DAS is installed.
	Namespace []Section
}

// Rules returns every rule of sections, in order.
func Rules(sections []Section) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, s := range sections {
		out = append(out, s.Rules...)
	}
	return out
}

// Names the operator's rules refer to.
const (
	// ResourceName is the one DASOperator's name (the CRD admits no other).
	ResourceName = "cluster"
	// APIServerName is OpenShift's APIServer whose TLS security profile the operator follows.
	APIServerName = "cluster"
	// LeaderElectionID is the operator's leader-election Lease (operator/main.go).
	LeaderElectionID = "das-operator.operator.das.com"
)

var (
	allVerbs    = []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	byName      = []string{"get", "update", "patch", "delete"}
	unnamedable = []string{"list", "watch", "create"}
)

// Derive returns the operator's rules for the objects the chart renders into namespace.
//
// Errors: a kind the derivation does not know, a namespaced object outside namespace, a role
// with a wildcard (the operator would have to hold it), or a binding to a role the chart does
// not render (the operator would have to hold that role's permissions, which nothing here
// tells).
func Derive(objs []Object, namespace string) (Permissions, error) {
	clusterNames := map[kind][]string{}
	namespaced := map[kind]bool{}
	clusterRoles := map[string][]rbacv1.PolicyRule{}
	roles := map[string][]rbacv1.PolicyRule{}
	var bindings []Object
	for _, o := range objs {
		k, err := kindOf(o.APIVersion, o.Kind)
		if err != nil {
			return Permissions{}, err
		}
		if k.namespaced && o.Metadata.Namespace != namespace {
			return Permissions{}, fmt.Errorf("the chart renders %s %s into namespace %q, not the release's %q: "+
				"the operator may write only its own namespace", o.Kind, o.Metadata.Name, o.Metadata.Namespace, namespace)
		}
		if k.namespaced {
			namespaced[k] = true
		} else {
			clusterNames[k] = append(clusterNames[k], o.Metadata.Name)
		}
		switch o.Kind {
		case "ClusterRole", "Role":
			if err := noWildcard(o); err != nil {
				return Permissions{}, err
			}
			if o.Kind == "ClusterRole" {
				clusterRoles[o.Metadata.Name] = o.Rules
			} else {
				roles[o.Metadata.Name] = o.Rules
			}
		case "ClusterRoleBinding", "RoleBinding":
			bindings = append(bindings, o)
		}
	}
	for _, b := range bindings {
		if err := boundRoleRendered(b, clusterRoles, roles); err != nil {
			return Permissions{}, err
		}
	}
	return Permissions{
		Cluster:   clusterSections(clusterNames, clusterRoles),
		Namespace: namespaceSections(namespaced, roles),
	}, nil
}

func clusterSections(names map[kind][]string, clusterRoles map[string][]rbacv1.PolicyRule) []Section {
	b := builder{}
	b.add("The DASOperator: the controllers watch it (list, watch cannot be limited by name) and "+
		"write only the one named cluster (the CRD admits no other name).",
		rule("operator.das.com", []string{"dasoperators"}, nil, "list", "watch"),
		rule("operator.das.com", []string{"dasoperators", "dasoperators/status", "dasoperators/finalizers"},
			[]string{ResourceName}, "get", "update", "patch"))
	b.add("Events about the cluster-scoped DASOperator land in the default namespace; create "+
		"cannot be limited by name, nor patch usefully (event names are generated).",
		rule("", []string{"events"}, nil, "create", "patch"))
	b.add("OpenShift's TLS security profile: the APIServer named cluster, cached alone (a "+
		"metadata.name field selector, which RBAC checks against resourceNames).",
		rule("config.openshift.io", []string{"apiservers"}, []string{APIServerName}, "get", "list", "watch"))
	var kindRules []rbacv1.PolicyRule
	var kindNames []string
	for _, k := range sortedKinds(names) {
		kindNames = append(kindNames, k.resource)
		kindRules = append(kindRules,
			rule(k.group, []string{k.resource}, nil, unnamedable...),
			rule(k.group, []string{k.resource}, dedupe(names[k]), byName...))
	}
	sort.Strings(kindNames)
	b.add("DAS's cluster-scoped objects ("+strings.Join(kindNames, ", ")+"): the Helm library "+
		"watches each kind of the release and creates what is missing (list, watch and create "+
		"cannot be limited by name); it reads, updates and deletes only the names the chart "+
		"renders with every optional feature on.", kindRules...)
	b.add(unionWhy("ClusterRoles", clusterRoles)+" cluster-wide, so that the API server lets "+
		"the operator create, update and bind them without escalate or bind.", union(clusterRoles)...)
	return b.sections
}

func namespaceSections(kinds map[kind]bool, roles map[string][]rbacv1.PolicyRule) []Section {
	b := builder{}
	b.add("The install namespace itself (a Role's rule on namespaces covers only the namespace "+
		"the Role is in): read, and labelled for the privileged Pod Security level.",
		rule("", []string{"namespaces"}, nil, "get", "patch"))
	groups := map[string][]string{"": {"secrets"}}
	for k := range kinds {
		groups[k.group] = append(groups[k.group], k.resource)
	}
	var kindRules []rbacv1.PolicyRule
	for _, g := range sortedKeys(groups) {
		kindRules = append(kindRules, rule(g, dedupe(groups[g]), nil, allVerbs...))
	}
	b.add("DAS's namespaced objects, and the Secrets in which Helm keeps each revision of the "+
		"release (sh.helm.release.v1.das.v<N>): the Helm library installs, watches, repairs and "+
		"uninstalls them here.", kindRules...)
	b.add(unionWhy("Roles", roles)+" here, so that the API server lets the operator create, "+
		"update and bind them without escalate or bind.", union(roles)...)
	b.add("The operator's leader-election Lease (--leader-elect).",
		rule("coordination.k8s.io", []string{"leases"}, nil, "create"),
		rule("coordination.k8s.io", []string{"leases"}, []string{LeaderElectionID}, "get", "update"))
	return b.sections
}

// builder collects sections, leaving out of each what an earlier one grants already.
type builder struct {
	sections []Section
	granted  atomSet
}

func (b *builder) add(why string, rules ...rbacv1.PolicyRule) {
	if b.granted == nil {
		b.granted = atomSet{}
	}
	var fresh []atom
	for _, r := range rules {
		for _, a := range atomsOf(r) {
			if !b.granted.covers(a) {
				fresh = append(fresh, a)
			}
		}
	}
	if len(fresh) == 0 {
		return
	}
	b.granted.add(fresh)
	b.sections = append(b.sections, Section{Why: why, Rules: compact(fresh)})
}

func rule(group string, resources, names []string, verbs ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, ResourceNames: names, Verbs: verbs}
}

// union is every rule of every role, as one compact list.
func union(roles map[string][]rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var atoms []atom
	for _, rules := range roles {
		for _, r := range rules {
			atoms = append(atoms, atomsOf(r)...)
		}
	}
	return compact(atoms)
}

func unionWhy(what string, roles map[string][]rbacv1.PolicyRule) string {
	return "Every rule of the chart's " + what + " (" + strings.Join(sortedKeys(roles), ", ") + "), held"
}

func noWildcard(o Object) error {
	for _, r := range o.Rules {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.NonResourceURLs} {
			for _, s := range list {
				if s == "*" || strings.HasSuffix(s, "/*") {
					return fmt.Errorf("%s %s grants %q: the operator would have to hold that wildcard to create it; "+
						"name what the component needs instead", o.Kind, o.Metadata.Name, s)
				}
			}
		}
	}
	return nil
}

func boundRoleRendered(b Object, clusterRoles, roles map[string][]rbacv1.PolicyRule) error {
	if b.RoleRef == nil {
		return fmt.Errorf("%s %s has no roleRef", b.Kind, b.Metadata.Name)
	}
	_, isClusterRole := clusterRoles[b.RoleRef.Name]
	_, isRole := roles[b.RoleRef.Name]
	ok := (b.RoleRef.Kind == "ClusterRole" && isClusterRole) ||
		(b.RoleRef.Kind == "Role" && b.Kind == "RoleBinding" && isRole)
	if !ok {
		return fmt.Errorf("%s %s binds %s %s, which the chart does not render: without bind the operator "+
			"may bind only roles whose permissions it holds; render that role in the chart (or bind one it renders)",
			b.Kind, b.Metadata.Name, b.RoleRef.Kind, b.RoleRef.Name)
	}
	return nil
}

func sortedKinds(m map[kind][]string) []kind {
	out := make([]kind, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].group+"/"+out[i].resource < out[j].group+"/"+out[j].resource
	})
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}
