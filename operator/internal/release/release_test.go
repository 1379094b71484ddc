package release

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func labelsOf(t *testing.T, c client.Client, name string) map[string]string {
	t.Helper()
	ns := &corev1.Namespace{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, ns); err != nil {
		t.Fatal(err)
	}
	return ns.Labels
}

// A missing install namespace is created with the Pod Security labels.
func TestNamespaceHookCreatesTheNamespace(t *testing.T) {
	c := fake.NewClientBuilder().Build()
	if err := NamespaceHook(c, "das-system").Exec(nil, nil, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	if got := labelsOf(t, c, "das-system")["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Fatalf("enforce label %q", got)
	}
}

// An existing namespace keeps its other labels and gets the Pod Security ones.
func TestNamespaceHookLabelsAnExistingNamespace(t *testing.T) {
	existing := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "das-operator", Labels: map[string]string{
		"team": "gpu", "pod-security.kubernetes.io/enforce": "restricted"}}}
	c := fake.NewClientBuilder().WithObjects(existing).Build()
	if err := NamespaceHook(c, "das-operator").Exec(nil, nil, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	got := labelsOf(t, c, "das-operator")
	if got["team"] != "gpu" || got["pod-security.kubernetes.io/enforce"] != "privileged" ||
		got["pod-security.kubernetes.io/warn"] != "privileged" {
		t.Fatalf("labels %v", got)
	}
}

// Under the bundle's RBAC the operator may not create namespaces: a missing install namespace
// is an error that says what to do, not a bare "forbidden".
func TestNamespaceHookSaysWhatToDoWhenTheNamespaceCannotBeCreated(t *testing.T) {
	forbidden := interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "das-system", errors.New("RBAC"))
	}}
	c := fake.NewClientBuilder().WithInterceptorFuncs(forbidden).Build()
	err := NamespaceHook(c, "das-system").Exec(nil, nil, logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "does not exist and the operator may not create it") ||
		!apierrors.IsForbidden(errors.Unwrap(err)) {
		t.Fatalf("want the forbidden create explained, got %v", err)
	}
}
