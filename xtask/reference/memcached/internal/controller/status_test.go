package controller

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cachev1beta1 "operator-manager.dev/reference/memcached/api/v1beta1"
)

// The same cases as crates/kube-operator-runtime/src/status.rs.

func settled(n int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Generation: 1},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 1, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
		},
	}
}

func byType(t *testing.T, conditions []metav1.Condition, conditionType string) metav1.Condition {
	t.Helper()
	for _, c := range conditions {
		if c.Type == conditionType {
			return c
		}
	}
	t.Fatalf("%s missing", conditionType)
	return metav1.Condition{}
}

func TestSettledDeploymentIsAvailableAndNotProgressing(t *testing.T) {
	c := rolloutOf(3, settled(3)).conditions()
	if byType(t, c, typeAvailable).Status != metav1.ConditionTrue ||
		byType(t, c, typeProgressing).Status != metav1.ConditionFalse ||
		byType(t, c, typeDegraded).Status != metav1.ConditionFalse {
		t.Errorf("%+v", c)
	}
	if m := byType(t, c, typeAvailable).Message; m != "3 of 3 replicas ready" {
		t.Errorf("message %q", m)
	}
}

func TestScalingUpIsProgressingAndUnavailable(t *testing.T) {
	d := settled(3)
	d.Status.Replicas, d.Status.UpdatedReplicas = 5, 5
	c := rolloutOf(5, d).conditions()
	if byType(t, c, typeAvailable).Status != metav1.ConditionFalse || byType(t, c, typeProgressing).Reason != "ScalingUp" {
		t.Errorf("%+v", c)
	}
}

func TestUnobservedGenerationIsProgressing(t *testing.T) {
	d := settled(3)
	d.Generation = 2
	if r := byType(t, rolloutOf(3, d).conditions(), typeProgressing).Reason; r != "DeploymentUpdating" {
		t.Errorf("reason %q", r)
	}
}

func TestScaledToZeroIsAvailable(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: appsv1.DeploymentStatus{ObservedGeneration: 1}}
	if !rolloutOf(0, d).isComplete() {
		t.Error("not complete")
	}
}

func TestReplicaFailureIsDegradedWithItsReason(t *testing.T) {
	d := settled(0)
	d.Status.Conditions = []appsv1.DeploymentCondition{{
		Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: "pods are forbidden",
	}}
	c := byType(t, rolloutOf(3, d).conditions(), typeDegraded)
	if c.Status != metav1.ConditionTrue || c.Reason != "FailedCreate" || c.Message != "pods are forbidden" {
		t.Errorf("%+v", c)
	}
}

func TestTransitionTimeIsKeptWhileStatusHolds(t *testing.T) {
	status := &cachev1beta1.MemcachedStatus{}
	setConditions(status, rolloutOf(3, settled(1)).conditions(), 1)
	first := byType(t, status.Conditions, typeDegraded).LastTransitionTime
	first = metav1.NewTime(first.Add(-time.Minute))
	for i := range status.Conditions {
		status.Conditions[i].LastTransitionTime = first
	}
	setConditions(status, rolloutOf(3, settled(3)).conditions(), 2)
	if got := byType(t, status.Conditions, typeDegraded).LastTransitionTime; !got.Equal(&first) {
		t.Error("Degraded did not change but its transition time did")
	}
	if got := byType(t, status.Conditions, typeAvailable).LastTransitionTime; got.Equal(&first) {
		t.Error("Available changed but kept its transition time")
	}
	if status.ObservedGeneration != 2 || byType(t, status.Conditions, typeAvailable).ObservedGeneration != 2 {
		t.Errorf("%+v", status)
	}
	if len(status.Conditions) != 3 || status.Conditions[0].Type != typeAvailable {
		t.Errorf("order %+v", status.Conditions)
	}
}

func TestNotOwnedIsDegraded(t *testing.T) {
	c := notOwnedConditions("ns", "mc")
	if d := byType(t, c, typeDegraded); d.Status != metav1.ConditionTrue || d.Reason != reasonNotOwned {
		t.Errorf("%+v", d)
	}
	if byType(t, c, typeAvailable).Status != metav1.ConditionFalse {
		t.Error("available")
	}
}
