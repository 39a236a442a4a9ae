package controller

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons, the same as the Rust controller's (crates/kube-operator-runtime/src/status.rs),
// so `kubectl wait --for=condition=Available` and the bench's convergence check read both alike.
const (
	typeAvailable   = "Available"
	typeProgressing = "Progressing"
	typeDegraded    = "Degraded"

	reasonNotOwned = "DeploymentNotOwned"
)

// rollout is how far the owned Deployment has rolled out, reduced to what the conditions need.
type rollout struct {
	desired, replicas, updated, ready, available int32
	// observed: the Deployment controller has seen the Deployment's latest spec.
	observed bool
	// failed, with failureReason and failureMessage: ReplicaFailure, or the progress deadline passed.
	failed                        bool
	failureReason, failureMessage string
}

func rolloutOf(desired int32, d *appsv1.Deployment) rollout {
	r := rollout{
		desired:   desired,
		replicas:  d.Status.Replicas,
		updated:   d.Status.UpdatedReplicas,
		ready:     d.Status.ReadyReplicas,
		available: d.Status.AvailableReplicas,
		observed:  d.Generation == 0 || d.Status.ObservedGeneration >= d.Generation,
	}
	for _, c := range d.Status.Conditions {
		replicaFailure := c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue
		deadline := c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse &&
			c.Reason == "ProgressDeadlineExceeded"
		if replicaFailure || deadline {
			r.failed = true
			r.failureReason = c.Reason
			if r.failureReason == "" {
				r.failureReason = string(c.Type)
			}
			r.failureMessage = c.Message
			break
		}
	}
	return r
}

func (r rollout) isAvailable() bool {
	return r.observed && r.available >= r.desired
}

func (r rollout) isComplete() bool {
	return r.isAvailable() && r.updated == r.desired && r.replicas == r.desired
}

// conditions are the Available, Progressing and Degraded conditions this rollout implies.
func (r rollout) conditions() []metav1.Condition {
	readiness := fmt.Sprintf("%d of %d replicas ready", r.ready, r.desired)
	available := condition(typeAvailable, false, "ReplicasNotReady", readiness)
	if r.isAvailable() {
		available = condition(typeAvailable, true, "AllReplicasReady", readiness)
	}

	var progressing metav1.Condition
	switch {
	case !r.observed:
		progressing = condition(typeProgressing, true, "DeploymentUpdating",
			"the Deployment controller has not yet seen the latest spec")
	case r.updated < r.replicas:
		// Pods of an older template remain.
		progressing = condition(typeProgressing, true, "RollingOut",
			fmt.Sprintf("%d of %d replicas updated", r.updated, r.desired))
	case r.replicas > r.desired:
		progressing = condition(typeProgressing, true, "ScalingDown",
			fmt.Sprintf("%d replicas, %d desired", r.replicas, r.desired))
	case !r.isComplete():
		progressing = condition(typeProgressing, true, "ScalingUp",
			fmt.Sprintf("%d of %d replicas available", r.available, r.desired))
	default:
		progressing = condition(typeProgressing, false, "RolloutComplete",
			fmt.Sprintf("%d replicas up to date and available", r.desired))
	}

	degraded := condition(typeDegraded, false, "AsExpected", "the Deployment reports no failure")
	if r.failed {
		degraded = condition(typeDegraded, true, r.failureReason, r.failureMessage)
	}
	return []metav1.Condition{available, progressing, degraded}
}

// notOwnedConditions describe a Memcached whose Deployment name is taken by a Deployment it does
// not control: nothing runs for it, and a user has to act.
func notOwnedConditions(namespace, name string) []metav1.Condition {
	message := fmt.Sprintf("Deployment %s/%s exists and is not controlled by this Memcached; "+
		"it is left untouched: delete or rename it, or rename the Memcached", namespace, name)
	return []metav1.Condition{
		condition(typeAvailable, false, reasonNotOwned, message),
		condition(typeProgressing, false, reasonNotOwned, message),
		condition(typeDegraded, true, reasonNotOwned, message),
	}
}

func condition(conditionType string, status bool, reason, message string) metav1.Condition {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: conditionType, Status: s, Reason: reason, Message: message}
}
