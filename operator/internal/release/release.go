// Package release adapts the Helm operator library to DAS's cluster-scoped custom resource.
//
// The library names a release after the custom resource and installs it into the resource's
// namespace. A DASOperator is cluster-scoped (one per cluster, named `cluster`), so it has no
// namespace; DAS is installed instead as release `das` in the operator's namespace, the name
// and namespace README.md's `helm install das ... -n das-system` uses. An operator started in
// the namespace of such a Helm install takes that release over and upgrades it in place.
package release

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	"github.com/operator-framework/helm-operator-plugins/pkg/hook"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Name of the Helm release of DAS.
const Name = "das"

// ActionClientGetter returns the library's action clients, with the release stored in and
// installed into namespace and named Name whatever the custom resource is called.
func ActionClientGetter(cfg *rest.Config, rm meta.RESTMapper, namespace string) (helmclient.ActionClientGetter, error) {
	toNamespace := func(client.Object) (string, error) { return namespace, nil }
	acg, err := helmclient.NewActionConfigGetter(cfg, rm,
		helmclient.ClientNamespaceMapper(toNamespace),
		helmclient.StorageDriverMapper(helmclient.DefaultSecretsStorageDriver(
			helmclient.SecretsStorageDriverOpts{StorageNamespaceMapper: toNamespace})),
	)
	if err != nil {
		return nil, err
	}
	base, err := helmclient.NewActionClientGetter(acg)
	if err != nil {
		return nil, err
	}
	return helmclient.ActionClientGetterFunc(func(ctx context.Context, obj client.Object) (helmclient.ActionInterface, error) {
		ac, err := base.ActionClientFor(ctx, obj)
		if err != nil {
			return nil, err
		}
		return named{ActionInterface: ac, namespace: namespace}, nil
	}), nil
}

// named rewrites the release name and namespace of every call.
type named struct {
	helmclient.ActionInterface
	namespace string
}

func (n named) Get(_ string, opts ...helmclient.GetOption) (*release.Release, error) {
	return n.ActionInterface.Get(Name, opts...)
}

func (n named) History(_ string, opts ...helmclient.HistoryOption) ([]*release.Release, error) {
	return n.ActionInterface.History(Name, opts...)
}

func (n named) Install(_, _ string, c *chart.Chart, vals map[string]any, opts ...helmclient.InstallOption) (*release.Release, error) {
	return n.ActionInterface.Install(Name, n.namespace, c, vals, opts...)
}

func (n named) Upgrade(_, _ string, c *chart.Chart, vals map[string]any, opts ...helmclient.UpgradeOption) (*release.Release, error) {
	return n.ActionInterface.Upgrade(Name, n.namespace, c, vals, opts...)
}

func (n named) Uninstall(_ string, opts ...helmclient.UninstallOption) (*release.UninstallReleaseResponse, error) {
	return n.ActionInterface.Uninstall(Name, opts...)
}

// PodSecurityLabels are put on the install namespace: the node plugin needs the privileged Pod
// Security level (hostPath volumes; a privileged container on real GPUs). The chart cannot
// label a namespace it does not create, and the operator's namespace exists before the chart.
var PodSecurityLabels = map[string]string{
	"pod-security.kubernetes.io/enforce": "privileged",
	"pod-security.kubernetes.io/audit":   "privileged",
	"pod-security.kubernetes.io/warn":    "privileged",
}

// NamespaceHook makes sure the install namespace exists and carries PodSecurityLabels before
// every install or upgrade. On OpenShift the label syncer would set the same level from the
// SCCs the chart grants, but only after the first pods were refused.
func NamespaceHook(c client.Client, namespace string) hook.PreHook {
	return hook.PreHookFunc(func(_ *unstructured.Unstructured, _ chartutil.Values, log logr.Logger) error {
		ctx := context.Background()
		ns := &corev1.Namespace{}
		err := c.Get(ctx, client.ObjectKey{Name: namespace}, ns)
		if apierrors.IsNotFound(err) {
			ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: PodSecurityLabels}}
			log.Info("creating the install namespace", "namespace", namespace)
			err := client.IgnoreAlreadyExists(c.Create(ctx, ns))
			if apierrors.IsForbidden(err) {
				// The bundle's RBAC has no namespace create: under OLM the install namespace is
				// the operator's own, which exists (docs/openshift.md, "What the operator may do").
				return fmt.Errorf("the install namespace %s does not exist and the operator may not create it "+
					"(%w): create it, or install DAS into the operator's own namespace (--namespace)", namespace, err)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("read namespace %s: %w", namespace, err)
		}
		patch := client.MergeFrom(ns.DeepCopy())
		changed := false
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		for k, v := range PodSecurityLabels {
			if ns.Labels[k] != v {
				ns.Labels[k] = v
				changed = true
			}
		}
		if !changed {
			return nil
		}
		log.Info("labelling the install namespace for the privileged Pod Security level", "namespace", namespace)
		return c.Patch(ctx, ns, patch)
	})
}
