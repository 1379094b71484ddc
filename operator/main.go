// das-operator installs DAS from one cluster-scoped DASOperator custom resource
// (operator.das.com/v1alpha1, named `cluster`): it runs the DAS Helm chart, embedded at build
// time, through operator-framework's Helm operator library, which installs, upgrades on every
// spec change, repairs drifted objects and uninstalls when the resource is deleted. A second
// controller (internal/status) reports Available, Progressing and Degraded. On OpenShift the
// cluster's TLS security profile (the APIServer named cluster, watched) is applied to the
// webhook (internal/tlsprofile). docs/openshift.md is the admin's guide; OLM installs it from
// the bundle `make bundle` writes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"

	configv1 "github.com/openshift/api/config/v1"
	"github.com/operator-framework/helm-operator-plugins/pkg/reconciler"
	helmvalues "github.com/operator-framework/helm-operator-plugins/pkg/values"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/das-project/das/operator/api/v1alpha1"
	"github.com/das-project/das/operator/internal/chart"
	"github.com/das-project/das/operator/internal/release"
	"github.com/das-project/das/operator/internal/status"
	"github.com/das-project/das/operator/internal/tlsprofile"
	"github.com/das-project/das/operator/internal/values"
)

// options are the operator's flags: how and where it runs, never what DAS does (that is the
// custom resource's).
type options struct {
	namespace   string
	chartDir    string
	installCRDs bool
	openshift   string
	tlsProfile  string
	metrics     string
	probes      string
	leaderElect bool
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.namespace, "namespace", envOr("OPERATOR_NAMESPACE", "das-system"),
		"namespace DAS is installed into (release `das`); default $OPERATOR_NAMESPACE, the operator's own under OLM")
	flag.StringVar(&o.chartDir, "chart", "", "chart directory to install instead of the embedded deploy/helm/das")
	flag.BoolVar(&o.installCRDs, "install-crds", true,
		"let the chart install the AllocationClaim CRD; false under OLM, which installs it from the bundle")
	flag.StringVar(&o.openshift, "openshift", "auto",
		"grant the components their SecurityContextConstraints: auto (when the API serves security.openshift.io), true or false")
	flag.StringVar(&o.tlsProfile, "tls-profile", "auto",
		"apply the cluster's TLS security profile (OpenShift's apiservers.config.openshift.io cluster) to das-webhook: auto (when the API serves it) or false")
	flag.StringVar(&o.metrics, "metrics-bind-address", ":8080", "address of the operator's /metrics; 0 turns it off")
	flag.StringVar(&o.probes, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader (a lease in --namespace) so that replicas can stand by")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	return o
}

func main() {
	if err := run(parseFlags()); err != nil {
		fmt.Fprintln(os.Stderr, "das-operator:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	log := ctrl.Log.WithName("das-operator")
	chrt, err := chart.Load(o.chartDir)
	if err != nil {
		return err
	}
	cfg := ctrl.GetConfigOrDie()
	openshift, err := detectOpenShift(cfg, o.openshift)
	if err != nil {
		return err
	}
	followTLS, err := detectTLSProfile(cfg, o.tlsProfile)
	if err != nil {
		return err
	}
	settings := values.Settings{
		DefaultImage: os.Getenv("RELATED_IMAGE_DAS"),
		InstallCRDs:  o.installCRDs,
		OpenShift:    openshift,
	}
	log.Info("starting", "namespace", o.namespace, "chart", chrt.Metadata.Version,
		"openshift", openshift, "clusterTLSProfile", followTLS, "installCRDs", o.installCRDs,
		"defaultImage", settings.DefaultImage)

	byObject := map[client.Object]cache.ByObject{}
	if followTLS {
		if err := configv1.Install(scheme.Scheme); err != nil {
			return err
		}
		// The one APIServer object: nothing else of config.openshift.io is cached.
		byObject[&configv1.APIServer{}] = cache.ByObject{
			Field: fields.OneTermEqualSelector("metadata.name", tlsprofile.APIServerName)}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                   installNamespaceOnly(o.namespace, byObject),
		Metrics:                 metricsserver.Options{BindAddress: o.metrics},
		HealthProbeBindAddress:  o.probes,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "das-operator.operator.das.com",
		LeaderElectionNamespace: o.namespace,
	})
	if err != nil {
		return err
	}
	// Namespaces are read and written directly: caching every namespace of the cluster for one
	// Get per reconcile is not worth the memory.
	direct, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	acg, err := release.ActionClientGetter(cfg, mgr.GetRESTMapper(), o.namespace)
	if err != nil {
		return err
	}
	announcer := &tlsprofile.Announcer{Log: log.WithName("tls"), Recorder: mgr.GetEventRecorderFor("das-operator")}
	translate := helmvalues.TranslatorFunc(func(ctx context.Context, obj *unstructured.Unstructured) (chartutil.Values, error) {
		raw, _, err := unstructured.NestedMap(obj.Object, "spec")
		if err != nil {
			return nil, err
		}
		spec, err := values.Decode(raw)
		if err != nil {
			return nil, err
		}
		s := settings
		if followTLS {
			profile, err := tlsprofile.Reader{Client: mgr.GetClient()}.Read(ctx)
			if err != nil {
				return nil, err
			}
			s.ClusterTLS = &profile
		}
		// An error (a profile das-webhook cannot serve) stops the upgrade: the release keeps
		// its values and the DASOperator is Degraded with the message.
		tls, err := values.WebhookTLS(spec, s)
		if err != nil {
			return nil, err
		}
		announcer.Announce(obj, tls)
		return values.Map(spec, s)
	})
	options := []reconciler.Option{
		reconciler.WithChart(*chrt),
		reconciler.WithGroupVersionKind(v1alpha1.GroupVersionKind()),
		reconciler.WithActionClientGetter(acg),
		reconciler.WithValueTranslator(translate),
		reconciler.WithPreHook(release.NamespaceHook(direct, o.namespace)),
		reconciler.WithMaxReleaseHistory(10),
		reconciler.WithLog(log.WithName("helm")),
	}
	if followTLS {
		options = append(options, reconciler.WithControllerSetupFunc(watchTLSProfile(mgr)))
	}
	helmReconciler, err := reconciler.New(options...)
	if err != nil {
		return err
	}
	if err := helmReconciler.SetupWithManager(mgr); err != nil {
		return err
	}
	statusReconciler := &status.Reconciler{
		Client:    mgr.GetClient(),
		Recorder:  mgr.GetEventRecorderFor("das-operator"),
		Namespace: o.namespace,
	}
	if err := statusReconciler.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// installNamespaceOnly restricts the cache, and so the operator's watches, to the install
// namespace for every namespaced kind, those of custom resources the chart may render
// (ServiceMonitors, cert-manager's Issuer and Certificate) included; cluster-scoped kinds are
// cached cluster-wide. The Helm library watches each kind of the release to repair drift;
// without this it would list and watch Secrets, Deployments and the rest in every namespace,
// and the bundle would have to grant that cluster-wide (deploy/olm/rbac/role.yaml grants them
// in the operator's namespace only).
func installNamespaceOnly(namespace string, byObject map[client.Object]cache.ByObject) cache.Options {
	return cache.Options{
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject:          byObject,
	}
}

// detectOpenShift resolves --openshift: auto asks discovery whether SecurityContextConstraints
// are served (they are on every OpenShift, and nowhere else).
func detectOpenShift(cfg *rest.Config, flagValue string) (bool, error) {
	switch strings.ToLower(flagValue) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	case "auto":
	default:
		return false, fmt.Errorf("--openshift %q: want auto, true or false", flagValue)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	resources, err := dc.ServerResourcesForGroupVersion("security.openshift.io/v1")
	if err != nil {
		return false, client.IgnoreNotFound(err)
	}
	for _, r := range resources.APIResources {
		if r.Name == "securitycontextconstraints" {
			return true, nil
		}
	}
	return false, nil
}

// detectTLSProfile resolves --tls-profile: auto asks discovery whether the API serves
// apiservers.config.openshift.io (every OpenShift does; the object named cluster carries the
// cluster's TLS security profile). It is asked apart from --openshift, which is about SCCs.
func detectTLSProfile(cfg *rest.Config, flagValue string) (bool, error) {
	switch strings.ToLower(flagValue) {
	case "false":
		return false, nil
	case "auto":
	default:
		return false, fmt.Errorf("--tls-profile %q: want auto or false", flagValue)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	resources, err := dc.ServerResourcesForGroupVersion(configv1.GroupVersion.String())
	if err != nil {
		return false, client.IgnoreNotFound(err)
	}
	for _, r := range resources.APIResources {
		if r.Name == "apiservers" {
			return true, nil
		}
	}
	return false, nil
}

// watchTLSProfile makes the Helm controller reconcile the DASOperator when the APIServer's
// tlsSecurityProfile changes: the translator reads the new profile, the rendered webhook
// Deployment differs and the release is upgraded (the webhook rolls). A watch rather than a
// periodic requeue: the change reaches the webhook within seconds, and nothing is re-rendered
// while the profile stays as it is (the Helm library's dry-run upgrade on every requeue costs
// API calls).
func watchTLSProfile(mgr ctrl.Manager) reconciler.ControllerSetupFunc {
	toCR := handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *configv1.APIServer) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: v1alpha1.ResourceName}}}
	})
	changed := predicate.TypedFuncs[*configv1.APIServer]{
		UpdateFunc: func(e event.TypedUpdateEvent[*configv1.APIServer]) bool {
			return !reflect.DeepEqual(e.ObjectOld.Spec.TLSSecurityProfile, e.ObjectNew.Spec.TLSSecurityProfile)
		},
	}
	return func(c reconciler.ControllerSetup) error {
		return c.Watch(source.Kind(mgr.GetCache(), &configv1.APIServer{}, toCR, changed))
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
