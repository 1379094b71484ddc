package status

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/das-project/das/operator/api/v1alpha1"
)

// Names of DAS's workloads, as the chart names them.
const (
	ControllerDeployment = "das-controller"
	WebhookDeployment    = "das-webhook"
	PluginDaemonSet      = "das-kubelet-plugin"
)

// Reconciler writes Available, Progressing and Degraded on the DASOperator and posts an event
// when one of them changes. It runs beside the Helm library's reconciler in the same manager
// and never touches the conditions that one owns.
type Reconciler struct {
	Client    client.Client
	Recorder  record.EventRecorder
	Namespace string // where the release's workloads are
}

// SetupWithManager watches the DASOperator and DAS's workloads in Namespace: a pod becoming
// ready changes a workload's status and so the conditions.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(v1alpha1.GroupVersionKind())
	toCR := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: v1alpha1.ResourceName}}}
	})
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Namespace && o.GetLabels()["app.kubernetes.io/part-of"] == "das"
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("dasoperator-status").
		For(obj, builder.WithPredicates(predicate.Funcs{
			// Status writes (ours and the Helm library's) change no generation but may change
			// the Helm conditions we read: react to every update.
			UpdateFunc: func(e event.UpdateEvent) bool { return true },
		})).
		Watches(&appsv1.Deployment{}, toCR, builder.WithPredicates(ours)).
		Watches(&appsv1.DaemonSet{}, toCR, builder.WithPredicates(ours)).
		Complete(r)
}

// Reconcile reads the DASOperator and the workloads, and writes the conditions if they changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(v1alpha1.GroupVersionKind())
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if obj.GetDeletionTimestamp() != nil {
		return reconcile.Result{}, nil // the Helm library is uninstalling; the object goes
	}
	conds, err := conditionsOf(obj)
	if err != nil {
		return reconcile.Result{}, err
	}
	workloads, err := r.workloads(ctx, webhookEnabled(obj))
	if err != nil {
		return reconcile.Result{}, err
	}
	changed := false
	for _, c := range Assess(conds, workloads) {
		old := meta.FindStatusCondition(conds, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason {
			r.announce(obj, c)
		}
		if meta.SetStatusCondition(&conds, c) {
			changed = true
		}
	}
	if !changed {
		return reconcile.Result{}, nil
	}
	if err := setConditions(obj, conds); err != nil {
		return reconcile.Result{}, err
	}
	// A conflict (the Helm library wrote meanwhile) requeues with the fresh object.
	return reconcile.Result{}, r.Client.Status().Update(ctx, obj)
}

// announce posts an event for a condition that changed: Warning for trouble, Normal otherwise.
func (r *Reconciler) announce(obj runtime.Object, c metav1.Condition) {
	kind := corev1.EventTypeNormal
	bad := (c.Type == Degraded && c.Status == metav1.ConditionTrue) ||
		(c.Type == Available && c.Status == metav1.ConditionFalse && c.Reason != ReasonInstalling)
	if bad {
		kind = corev1.EventTypeWarning
	}
	msg := fmt.Sprintf("%s is %s", c.Type, c.Status)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	r.Recorder.Event(obj, kind, c.Type+string(c.Status), msg)
}

// workloads reads DAS's Deployments and DaemonSet.
func (r *Reconciler) workloads(ctx context.Context, webhook bool) ([]Workload, error) {
	names := []string{ControllerDeployment}
	if webhook {
		names = append(names, WebhookDeployment)
	}
	var out []Workload
	for _, name := range names {
		d := &appsv1.Deployment{}
		w := Workload{Kind: "Deployment", Name: name}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, d)
		switch {
		case apierrors.IsNotFound(err):
			w.Missing = true
		case err != nil:
			return nil, err
		default:
			w = fromDeployment(d)
		}
		out = append(out, w)
	}
	ds := &appsv1.DaemonSet{}
	w := Workload{Kind: "DaemonSet", Name: PluginDaemonSet}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: PluginDaemonSet}, ds)
	switch {
	case apierrors.IsNotFound(err):
		w.Missing = true
	case err != nil:
		return nil, err
	default:
		w = fromDaemonSet(ds)
	}
	return append(out, w), nil
}

func fromDeployment(d *appsv1.Deployment) Workload {
	w := Workload{Kind: "Deployment", Name: d.Name, Desired: 1, Updated: d.Status.UpdatedReplicas,
		Available: d.Status.AvailableReplicas, Generation: d.Generation, ObservedGeneration: d.Status.ObservedGeneration}
	if d.Spec.Replicas != nil {
		w.Desired = *d.Spec.Replicas
	}
	for _, c := range d.Status.Conditions {
		failed := (c.Type == appsv1.DeploymentProgressing && c.Reason == "ProgressDeadlineExceeded") ||
			(c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue)
		if failed {
			w.Failure = c.Message
		}
	}
	return w
}

func fromDaemonSet(ds *appsv1.DaemonSet) Workload {
	return Workload{Kind: "DaemonSet", Name: ds.Name, Desired: ds.Status.DesiredNumberScheduled,
		Updated: ds.Status.UpdatedNumberScheduled, Available: ds.Status.NumberAvailable,
		Generation: ds.Generation, ObservedGeneration: ds.Status.ObservedGeneration}
}

// webhookEnabled: spec.webhook.enabled, true unless set false.
func webhookEnabled(obj *unstructured.Unstructured) bool {
	enabled, found, _ := unstructured.NestedBool(obj.Object, "spec", "webhook", "enabled")
	return !found || enabled
}

// conditionsOf reads status.conditions (the Helm library's and ours).
func conditionsOf(obj *unstructured.Unstructured) ([]metav1.Condition, error) {
	raw, _, err := unstructured.NestedSlice(obj.Object, "status", "conditions")
	if err != nil {
		return nil, err
	}
	var conds []metav1.Condition
	for _, item := range raw {
		m, ok := item.(map[string]any)
		if !ok {
			continue
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err != nil {
			return nil, fmt.Errorf("status.conditions: %w", err)
		}
		conds = append(conds, c)
	}
	return conds, nil
}

// setConditions writes conds back into status.conditions, keeping the rest of status.
func setConditions(obj *unstructured.Unstructured, conds []metav1.Condition) error {
	list := make([]any, 0, len(conds))
	for i := range conds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&conds[i])
		if err != nil {
			return err
		}
		list = append(list, m)
	}
	return unstructured.SetNestedSlice(obj.Object, list, "status", "conditions")
}
