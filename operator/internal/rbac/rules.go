package rbac

import (
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
)

// atom is one permission: a verb on a resource of a group for one object name ("" for every
// name), or a verb on a non-resource URL. Rules are sets of atoms; the API server's escalation
// check compares roles atom by atom too (k8s.io/component-helpers/auth/rbac/validation.Covers).
type atom struct {
	group, resource, name, url, verb string
}

// atomsOf breaks a rule into its atoms.
func atomsOf(r rbacv1.PolicyRule) []atom {
	var out []atom
	for _, verb := range r.Verbs {
		for _, url := range r.NonResourceURLs {
			out = append(out, atom{url: url, verb: verb})
		}
		for _, group := range r.APIGroups {
			for _, resource := range r.Resources {
				if len(r.ResourceNames) == 0 {
					out = append(out, atom{group: group, resource: resource, verb: verb})
				}
				for _, name := range r.ResourceNames {
					out = append(out, atom{group: group, resource: resource, name: name, verb: verb})
				}
			}
		}
	}
	return out
}

// atomSet is a set of atoms that knows that an atom for every name covers the named ones.
type atomSet map[atom]bool

func (s atomSet) covers(a atom) bool {
	if s[a] {
		return true
	}
	every := a
	every.name = ""
	return a.url == "" && s[every]
}

func (s atomSet) add(atoms []atom) {
	for _, a := range atoms {
		s[a] = true
	}
}

// compact turns atoms into as few rules as reads well: one rule per group, set of names and set
// of verbs, listing its resources; non-resource URLs with the same verbs together. Atoms for
// one name whose verb the same resource also has for every name are dropped (covered). The
// order is deterministic: by group, then resources, then names, then verbs.
func compact(atoms []atom) []rbacv1.PolicyRule {
	set := atomSet{}
	set.add(atoms)
	type resKey struct{ group, resource, name string }
	verbsOf := map[resKey]map[string]bool{}
	urlVerbs := map[string]map[string]bool{}
	for a := range set {
		if a.url != "" {
			addTo(urlVerbs, a.url, a.verb)
			continue
		}
		if a.name != "" && set.covers(atom{group: a.group, resource: a.resource, verb: a.verb}) {
			continue
		}
		addTo(verbsOf, resKey{a.group, a.resource, a.name}, a.verb)
	}
	// Per resource: the names that share one set of verbs.
	type namesKey struct{ group, resource, verbs string }
	names := map[namesKey][]string{}
	for k, verbs := range verbsOf {
		nk := namesKey{k.group, k.resource, strings.Join(sortVerbs(verbs), ",")}
		names[nk] = append(names[nk], k.name)
	}
	// Per group: the resources that share one set of names and verbs.
	type ruleKey struct{ group, names, verbs string }
	resources := map[ruleKey][]string{}
	for k, ns := range names {
		sort.Strings(ns)
		rk := ruleKey{k.group, strings.Join(ns, ","), k.verbs}
		resources[rk] = append(resources[rk], k.resource)
	}
	var rules []rbacv1.PolicyRule
	for k, rs := range resources {
		sort.Strings(rs)
		r := rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: rs, Verbs: strings.Split(k.verbs, ",")}
		if k.names != "" {
			r.ResourceNames = strings.Split(k.names, ",")
		}
		rules = append(rules, r)
	}
	byVerbs := map[string][]string{}
	for url, verbs := range urlVerbs {
		key := strings.Join(sortVerbs(verbs), ",")
		byVerbs[key] = append(byVerbs[key], url)
	}
	for verbs, urls := range byVerbs {
		sort.Strings(urls)
		rules = append(rules, rbacv1.PolicyRule{NonResourceURLs: urls, Verbs: strings.Split(verbs, ",")})
	}
	sort.Slice(rules, func(i, j int) bool { return ruleOrder(rules[i]) < ruleOrder(rules[j]) })
	return rules
}

func addTo[K comparable](m map[K]map[string]bool, k K, verb string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][verb] = true
}

// verbOrder is the order verbs are listed in: reading, then writing, then the rest by name.
var verbOrder = map[string]int{"get": 0, "list": 1, "watch": 2, "create": 3, "update": 4, "patch": 5, "delete": 6}

func sortVerbs(verbs map[string]bool) []string {
	out := make([]string, 0, len(verbs))
	for v := range verbs {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		oi, iKnown := verbOrder[out[i]]
		oj, jKnown := verbOrder[out[j]]
		switch {
		case iKnown && jKnown:
			return oi < oj
		case iKnown != jKnown:
			return iKnown
		default:
			return out[i] < out[j]
		}
	})
	return out
}

// ruleOrder is a rule's sort key: resource rules by group, the rule for every name before the
// named ones, then by resources and names; non-resource rules last; the verbs break ties.
func ruleOrder(r rbacv1.PolicyRule) string {
	if len(r.NonResourceURLs) > 0 {
		return "~" + strings.Join(r.NonResourceURLs, ",") + " " + strings.Join(r.Verbs, ",")
	}
	named := "0"
	if len(r.ResourceNames) > 0 {
		named = "1" // within a group, the rule for every name first
	}
	return strings.Join(r.APIGroups, ",") + " " + named + " " + strings.Join(r.Resources, ",") + " " +
		strings.Join(r.ResourceNames, ",") + " " + strings.Join(r.Verbs, ",")
}
