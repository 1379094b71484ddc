package status

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func helmCond(t string, s metav1.ConditionStatus, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: "x", Message: msg}
}

func ready(kind, name string, n int32) Workload {
	return Workload{Kind: kind, Name: name, Desired: n, Updated: n, Available: n, Generation: 2, ObservedGeneration: 2}
}

// status of the three conditions, in the order Assess returns them.
func statuses(conds []metav1.Condition) (a, p, d metav1.Condition) {
	return conds[0], conds[1], conds[2]
}

func TestAllRolledOutIsAvailable(t *testing.T) {
	deployed := []metav1.Condition{helmCond("Deployed", metav1.ConditionTrue, "")}
	a, p, d := statuses(Assess(deployed, []Workload{
		ready("Deployment", "das-controller", 2), ready("Deployment", "das-webhook", 2),
		ready("DaemonSet", "das-kubelet-plugin", 3)}))
	if a.Status != metav1.ConditionTrue || p.Status != metav1.ConditionFalse || d.Status != metav1.ConditionFalse {
		t.Fatalf("Available %s Progressing %s Degraded %s", a.Status, p.Status, d.Status)
	}
}

func TestBeforeTheReleaseIsInstalledItIsProgressing(t *testing.T) {
	a, p, d := statuses(Assess(nil, []Workload{{Kind: "DaemonSet", Name: "das-kubelet-plugin", Missing: true}}))
	if a.Status != metav1.ConditionFalse || a.Reason != ReasonInstalling || p.Status != metav1.ConditionTrue ||
		d.Status != metav1.ConditionFalse {
		t.Fatalf("got %+v %+v %+v", a, p, d)
	}
}

func TestARollingDaemonSetIsProgressingAndSaysHowFar(t *testing.T) {
	deployed := []metav1.Condition{helmCond("Deployed", metav1.ConditionTrue, "")}
	rolling := ready("DaemonSet", "das-kubelet-plugin", 4)
	rolling.Updated = 1
	a, p, _ := statuses(Assess(deployed, []Workload{ready("Deployment", "das-controller", 2), rolling}))
	if a.Status != metav1.ConditionFalse || p.Status != metav1.ConditionTrue || p.Reason != ReasonRollingOut {
		t.Fatalf("got %+v %+v", a, p)
	}
	if want := "DaemonSet das-kubelet-plugin: 1 of 4 pods updated"; p.Message != want {
		t.Fatalf("message %q, want %q", p.Message, want)
	}
}

func TestAFailedReleaseIsDegradedWithTheHelmMessage(t *testing.T) {
	conds := []metav1.Condition{helmCond("Deployed", metav1.ConditionTrue, ""),
		helmCond("ReleaseFailed", metav1.ConditionTrue, "upgrade failed: boom")}
	_, _, d := statuses(Assess(conds, nil))
	if d.Status != metav1.ConditionTrue || d.Reason != ReasonReleaseFailed || d.Message != "upgrade failed: boom" {
		t.Fatalf("got %+v", d)
	}
	conds = []metav1.Condition{helmCond("Irreconcilable", metav1.ConditionTrue, "bad values")}
	a, p, d := statuses(Assess(conds, nil))
	if d.Reason != ReasonIrreconcilable || p.Status != metav1.ConditionFalse || a.Status != metav1.ConditionFalse {
		t.Fatalf("got %+v %+v %+v", a, p, d)
	}
}

func TestAStuckDeploymentIsDegraded(t *testing.T) {
	deployed := []metav1.Condition{helmCond("Deployed", metav1.ConditionTrue, "")}
	stuck := ready("Deployment", "das-webhook", 2)
	stuck.Available, stuck.Failure = 0, "ReplicaSet has timed out progressing"
	_, _, d := statuses(Assess(deployed, []Workload{stuck}))
	if d.Status != metav1.ConditionTrue || d.Reason != ReasonWorkloadFailed {
		t.Fatalf("got %+v", d)
	}
}
