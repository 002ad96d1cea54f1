package main

// Status as controller/core/src/status/mod.rs computes it: the rollout of the Deployment as
// `kubectl rollout status` assesses it, and the Ready/Progressing/Degraded conditions.
// meta.SetStatusCondition keeps lastTransitionTime while a condition's status stays.

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	condReady       = "Ready"
	condProgressing = "Progressing"
	condDegraded    = "Degraded"

	reasonAvailable        = "Available"
	reasonRollingOut       = "RollingOut"
	reasonScaledToZero     = "ScaledToZero"
	reasonReconciled       = "Reconciled"
	reasonResourceConflict = "ResourceConflict"
	reasonDeploymentFailed = "DeploymentFailed"
	reasonAsExpected       = "AsExpected"
)

type rolloutState int

const (
	rolloutComplete rolloutState = iota
	rolloutInProgress
	rolloutFailed
)

type rolloutResult struct {
	state   rolloutState
	ready   int32
	desired int32
	message string
}

// rollout assesses a Deployment's rollout.
func rollout(d *appsv1.Deployment) rolloutResult {
	desired := ptr.Deref(d.Spec.Replicas, 1)
	st := d.Status
	r := rolloutResult{ready: st.ReadyReplicas, desired: desired}
	if st.ObservedGeneration < d.Generation {
		r.state = rolloutInProgress
		r.message = fmt.Sprintf("waiting for the Deployment controller to observe generation %d", d.Generation)
		return r
	}
	for _, c := range st.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == "False" && c.Reason == "ProgressDeadlineExceeded" {
			r.state = rolloutFailed
			r.message = "rollout exceeded its progress deadline: " + c.Message
			return r
		}
	}
	switch {
	case st.UpdatedReplicas < desired:
		r.message = fmt.Sprintf("%d of %d replicas updated", st.UpdatedReplicas, desired)
	case st.Replicas > st.UpdatedReplicas:
		r.message = fmt.Sprintf("%d old replicas pending termination", st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < st.UpdatedReplicas || st.ReadyReplicas < desired:
		r.message = fmt.Sprintf("%d/%d replicas ready", st.ReadyReplicas, desired)
	default:
		r.state = rolloutComplete
		return r
	}
	r.state = rolloutInProgress
	return r
}

func setConditions(st *AppServiceStatus, generation int64, conds ...[4]string) {
	for _, c := range conds {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type:               c[0],
			Status:             metav1.ConditionStatus(c[1]),
			Reason:             c[2],
			Message:            c[3],
			ObservedGeneration: generation,
		})
	}
}

// appliedStatus is the status once both children of this generation are in place.
func appliedStatus(app *AppService, d *appsv1.Deployment) AppServiceStatus {
	st := *app.Status.DeepCopy()
	gen := app.Generation
	st.Selector = selectorString(app.Name)
	st.ObservedGeneration = gen
	st.Endpoint = endpoint(app.Name, app.Namespace, app.Spec.PortOrDefault())
	r := rollout(d)
	st.ReadyReplicas = ptr.To(r.ready)
	desired := app.Spec.ReplicasOrDefault()
	switch r.state {
	case rolloutComplete:
		reason, msg := reasonAvailable, fmt.Sprintf("%d/%d replicas ready", r.ready, desired)
		if desired == 0 {
			reason, msg = reasonScaledToZero, "scaled to zero"
		}
		setConditions(&st, gen,
			[4]string{condReady, "True", reason, msg},
			[4]string{condProgressing, "False", reasonReconciled, "rollout complete"},
			[4]string{condDegraded, "False", reasonAsExpected, ""})
	case rolloutInProgress:
		setConditions(&st, gen,
			[4]string{condReady, "False", reasonRollingOut, fmt.Sprintf("%d/%d replicas ready", r.ready, r.desired)},
			[4]string{condProgressing, "True", reasonRollingOut, fmt.Sprintf("rolling out: %d/%d replicas ready", r.ready, r.desired)},
			[4]string{condDegraded, "False", reasonAsExpected, ""})
	case rolloutFailed:
		setConditions(&st, gen,
			[4]string{condReady, "False", reasonDeploymentFailed, r.message},
			[4]string{condProgressing, "False", reasonDeploymentFailed, r.message},
			[4]string{condDegraded, "True", reasonDeploymentFailed, r.message})
	}
	return st
}

// conflictStatus: a child's name is taken by an object this AppService does not control.
func conflictStatus(app *AppService, ours *appsv1.Deployment, serviceTaken bool, message string) AppServiceStatus {
	st := *app.Status.DeepCopy()
	st.Selector = selectorString(app.Name)
	var running int32
	if ours != nil {
		running = ours.Status.ReadyReplicas
	}
	st.ReadyReplicas = ptr.To(running)
	if serviceTaken {
		st.Endpoint = ""
	}
	setConditions(&st, app.Generation,
		[4]string{condReady, "False", reasonResourceConflict, message},
		[4]string{condProgressing, "False", reasonResourceConflict, "blocked until the conflicting objects are gone"},
		[4]string{condDegraded, "True", reasonResourceConflict, message})
	return st
}
