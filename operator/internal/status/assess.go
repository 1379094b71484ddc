// Package status keeps the DASOperator's Available, Progressing and Degraded conditions: what
// OpenShift's console and `oc get clusteroperator`-minded admins read, and what the removed DAS
// operator reported. The Helm operator library writes its own conditions on the same object
// (Initialized, Deployed, ReleaseFailed, Irreconcilable) about the Helm release; this package
// reads them and adds whether the installed components actually run.
//
// Assess is a pure function of what was read, so the rules are unit-tested without a cluster;
// controller.go reads the cluster and writes the result.
package status

import (
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types this package owns.
const (
	Available   = "Available"
	Progressing = "Progressing"
	Degraded    = "Degraded"
)

// Reasons of the conditions (CamelCase, as Kubernetes conditions want).
const (
	ReasonAsExpected     = "AsExpected"
	ReasonInstalling     = "Installing"
	ReasonRollingOut     = "RollingOut"
	ReasonUnavailable    = "ComponentsUnavailable"
	ReasonReleaseFailed  = "ReleaseFailed"
	ReasonIrreconcilable = "Irreconcilable"
	ReasonWorkloadFailed = "WorkloadFailed"
)

// Workload is what Assess needs of one of DAS's Deployments or its DaemonSet.
type Workload struct {
	// Kind and Name, e.g. Deployment das-controller.
	Kind, Name string
	// Missing: the object does not exist (yet).
	Missing bool
	// Desired pods (replicas, or the DaemonSet's desiredNumberScheduled), Updated to the
	// current template, Available.
	Desired, Updated, Available int32
	// Generation and ObservedGeneration: the workload controller has not seen the latest spec
	// while they differ.
	Generation, ObservedGeneration int64
	// Failure is a Deployment's ProgressDeadlineExceeded or ReplicaFailure message; empty when
	// none.
	Failure string
}

func (w Workload) String() string { return w.Kind + " " + w.Name }

// rolledOut: every desired pod runs the current template and is available.
func (w Workload) rolledOut() bool {
	return !w.Missing && w.ObservedGeneration >= w.Generation &&
		w.Updated >= w.Desired && w.Available >= w.Desired
}

// Assess returns the three conditions from the Helm library's conditions on the object and the
// state of DAS's workloads. They carry no observedGeneration: the Helm library rewrites
// status.conditions with a condition type that has none, and a field one writer keeps and the
// other drops would make them overwrite each other for ever.
func Assess(helm []metav1.Condition, workloads []Workload) []metav1.Condition {
	cond := func(t string, s bool, reason, msg string) metav1.Condition {
		st := metav1.ConditionFalse
		if s {
			st = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: st, Reason: reason, Message: msg}
	}
	find := func(t string) *metav1.Condition {
		for i := range helm {
			if helm[i].Type == t {
				return &helm[i]
			}
		}
		return nil
	}
	isTrue := func(t string) bool { c := find(t); return c != nil && c.Status == metav1.ConditionTrue }

	// Degraded: the release failed, or a workload cannot make progress.
	var degraded metav1.Condition
	var failures []string
	for _, w := range workloads {
		if w.Failure != "" {
			failures = append(failures, fmt.Sprintf("%s: %s", w, w.Failure))
		}
	}
	switch {
	case isTrue("ReleaseFailed"):
		degraded = cond(Degraded, true, ReasonReleaseFailed, find("ReleaseFailed").Message)
	case isTrue("Irreconcilable"):
		degraded = cond(Degraded, true, ReasonIrreconcilable, find("Irreconcilable").Message)
	case len(failures) > 0:
		degraded = cond(Degraded, true, ReasonWorkloadFailed, strings.Join(failures, "; "))
	default:
		degraded = cond(Degraded, false, ReasonAsExpected, "")
	}

	deployed := isTrue("Deployed")
	var pending []string
	for _, w := range workloads {
		if !w.rolledOut() {
			pending = append(pending, describe(w))
		}
	}
	sort.Strings(pending)

	var progressing, available metav1.Condition
	switch {
	case !deployed:
		progressing = cond(Progressing, degraded.Status != metav1.ConditionTrue, ReasonInstalling, "the Helm release of DAS is not installed yet")
		available = cond(Available, false, ReasonInstalling, "DAS is not installed yet")
	case len(pending) > 0:
		progressing = cond(Progressing, true, ReasonRollingOut, strings.Join(pending, "; "))
		available = cond(Available, false, ReasonUnavailable, strings.Join(pending, "; "))
	default:
		progressing = cond(Progressing, false, ReasonAsExpected, "")
		available = cond(Available, true, ReasonAsExpected, "every DAS component is available")
	}
	return []metav1.Condition{available, progressing, degraded}
}

// describe says why a workload is not rolled out, in the words `kubectl rollout status` uses.
func describe(w Workload) string {
	switch {
	case w.Missing:
		return fmt.Sprintf("%s does not exist", w)
	case w.ObservedGeneration < w.Generation:
		return fmt.Sprintf("%s: waiting for its controller to observe the new spec", w)
	case w.Updated < w.Desired:
		return fmt.Sprintf("%s: %d of %d pods updated", w, w.Updated, w.Desired)
	default:
		return fmt.Sprintf("%s: %d of %d pods available", w, w.Available, w.Desired)
	}
}
