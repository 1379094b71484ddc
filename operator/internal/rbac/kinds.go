package rbac

import (
	"fmt"
	"strings"
)

// kind is where the API serves one kind the chart renders: its group, its resource (plural)
// and whether its objects live in a namespace.
type kind struct {
	group, resource string
	namespaced      bool
}

// kinds are the kinds the chart may render, by "group/Kind" (core kinds: "/Kind"). A kind not
// listed fails the derivation, so that a new kind in the chart is a decision (which scope, which
// verbs) and never a permission the operator silently lacks or silently gains.
var kinds = map[string]kind{
	"/Secret":                               {"", "secrets", true},
	"/Service":                              {"", "services", true},
	"/ServiceAccount":                       {"", "serviceaccounts", true},
	"/ConfigMap":                            {"", "configmaps", true},
	"apps/Deployment":                       {"apps", "deployments", true},
	"apps/DaemonSet":                        {"apps", "daemonsets", true},
	"policy/PodDisruptionBudget":            {"policy", "poddisruptionbudgets", true},
	"networking.k8s.io/NetworkPolicy":       {"networking.k8s.io", "networkpolicies", true},
	"rbac.authorization.k8s.io/Role":        {"rbac.authorization.k8s.io", "roles", true},
	"rbac.authorization.k8s.io/RoleBinding": {"rbac.authorization.k8s.io", "rolebindings", true},
	"monitoring.coreos.com/ServiceMonitor":  {"monitoring.coreos.com", "servicemonitors", true},
	"cert-manager.io/Issuer":                {"cert-manager.io", "issuers", true},
	"cert-manager.io/Certificate":           {"cert-manager.io", "certificates", true},
	"rbac.authorization.k8s.io/ClusterRole": {"rbac.authorization.k8s.io", "clusterroles", false},
	"resource.k8s.io/DeviceClass":           {"resource.k8s.io", "deviceclasses", false},
	"apiextensions.k8s.io/CustomResourceDefinition": {
		"apiextensions.k8s.io", "customresourcedefinitions", false},
	"rbac.authorization.k8s.io/ClusterRoleBinding": {
		"rbac.authorization.k8s.io", "clusterrolebindings", false},
	"admissionregistration.k8s.io/MutatingWebhookConfiguration": {
		"admissionregistration.k8s.io", "mutatingwebhookconfigurations", false},
	"admissionregistration.k8s.io/ValidatingWebhookConfiguration": {
		"admissionregistration.k8s.io", "validatingwebhookconfigurations", false},
	"admissionregistration.k8s.io/ValidatingAdmissionPolicy": {
		"admissionregistration.k8s.io", "validatingadmissionpolicies", false},
	"admissionregistration.k8s.io/ValidatingAdmissionPolicyBinding": {
		"admissionregistration.k8s.io", "validatingadmissionpolicybindings", false},
}

// kindOf looks up the kind of an object by its apiVersion ("group/version" or "v1") and Kind.
func kindOf(apiVersion, k string) (kind, error) {
	group := ""
	if i := strings.Index(apiVersion, "/"); i >= 0 {
		group = apiVersion[:i]
	}
	if found, ok := kinds[group+"/"+k]; ok {
		return found, nil
	}
	return kind{}, fmt.Errorf("the chart renders %s %s, which the operator's RBAC does not know: "+
		"add it to kinds in operator/internal/rbac (its resource and whether it is namespaced)", apiVersion, k)
}
