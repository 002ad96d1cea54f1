package main

// The reconciler, written as a kubebuilder project writes one: reads from the manager's
// cache, finalizer by Update, children by controllerutil.CreateOrUpdate (GET from the
// cache, PUT when the mutate function changed something, POST when missing), status by
// Update of the status subresource when it changed. Errors go back to controller-runtime,
// which requeues with its default per-item exponential backoff.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
)

// Requeue delays, the Rust controller's defaults (--rollout-requeue, --resync-interval,
// reconcile::CONFLICT_RECHECK).
const (
	rolloutRequeue  = 10 * time.Second
	resyncInterval  = 10 * time.Minute
	conflictRecheck = 60 * time.Second
)

// apiWrites counts the writes reconcile made, by resource: the same series as the Rust
// controller's `appservice_controller_api_writes_total`, which the scale benchmark reads.
var apiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "appservice_controller_api_writes_total",
	Help: "API writes made by reconcile, by resource",
}, []string{"resource"})

func init() {
	metrics.Registry.MustRegister(apiWrites)
	for _, r := range []string{"appservices", "appservices/status", "deployments", "services"} {
		apiWrites.WithLabelValues(r)
	}
}

// AppServiceReconciler reconciles AppServices into a Deployment and a Service.
type AppServiceReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder recorder.EventRecorder
}

// SetupWithManager registers the controller: For AppServices, Owns Deployments,
// Services and PodDisruptionBudgets (each cached in full by the manager's default cache).
func (r *AppServiceReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&AppService{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Named("appservice").
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r)
}

// Reconcile converges one AppService.
func (r *AppServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	var app AppService
	if err := r.Get(ctx, req.NamespacedName, &app); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	if !app.DeletionTimestamp.IsZero() {
		// No external resources in this baseline: the children go with the owner
		// references, so deletion only releases the finalizer.
		if controllerutil.RemoveFinalizer(&app, finalizer) {
			if err := r.Update(ctx, &app); err != nil {
				return ctrl.Result{}, client.IgnoreNotFound(err)
			}
			apiWrites.WithLabelValues("appservices").Inc()
			log.V(1).Info("finalizer removed")
		}
		return ctrl.Result{}, nil
	}

	if controllerutil.AddFinalizer(&app, finalizer) {
		if err := r.Update(ctx, &app); err != nil {
			return ctrl.Result{}, err
		}
		apiWrites.WithLabelValues("appservices").Inc()
	}

	// Never adopt: a same-named child this AppService does not control blocks both.
	var liveDeployment appsv1.Deployment
	var liveService corev1.Service
	deploymentTaken, err := r.taken(ctx, req.NamespacedName, &liveDeployment, &app)
	if err != nil {
		return ctrl.Result{}, err
	}
	serviceTaken, err := r.taken(ctx, req.NamespacedName, &liveService, &app)
	if err != nil {
		return ctrl.Result{}, err
	}
	if deploymentTaken || serviceTaken {
		var names []string
		var ours *appsv1.Deployment
		if deploymentTaken {
			names = append(names, "Deployment "+req.String())
		} else if liveDeployment.UID != "" {
			ours = &liveDeployment
		}
		if serviceTaken {
			names = append(names, "Service "+req.String())
		}
		verb, be, pron := "exists", "is", "it is"
		if len(names) > 1 {
			verb, be, pron = "exist", "are", "they are"
		}
		msg := fmt.Sprintf("%s already %s and %s not controlled by this AppService; left untouched, and nothing is created until %s deleted or renamed (or the AppService is renamed)",
			strings.Join(names, " and "), verb, be, pron)
		if err := r.writeStatus(ctx, &app, conflictStatus(&app, ours, serviceTaken, msg)); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: conflictRecheck}, nil
	}

	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app.Name, Namespace: app.Namespace}}
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, deployment, func() error {
		return mutateDeployment(deployment, &app, r.Scheme)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("deployment: %w", err)
	}
	if op != controllerutil.OperationResultNone {
		apiWrites.WithLabelValues("deployments").Inc()
	}
	service := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app.Name, Namespace: app.Namespace}}
	op, err = controllerutil.CreateOrUpdate(ctx, r.Client, service, func() error {
		return mutateService(service, &app, r.Scheme)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("service: %w", err)
	}
	if op != controllerutil.OperationResultNone {
		apiWrites.WithLabelValues("services").Inc()
	}
	if err := r.convergeBudget(ctx, &app); err != nil {
		return ctrl.Result{}, fmt.Errorf("poddisruptionbudget: %w", err)
	}

	if err := r.writeStatus(ctx, &app, appliedStatus(&app, deployment)); err != nil {
		return ctrl.Result{}, err
	}
	if rollout(deployment).state == rolloutInProgress {
		return ctrl.Result{RequeueAfter: rolloutRequeue}, nil
	}
	return ctrl.Result{RequeueAfter: resyncInterval}, nil
}

// convergeBudget makes the PodDisruptionBudget of an AppService with two or more
// replicas, and deletes the one it controls below that (as the Rust controller does).
// A budget someone else holds under the name is left alone.
func (r *AppServiceReconciler) convergeBudget(ctx context.Context, app *AppService) error {
	budget := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: app.Name, Namespace: app.Namespace}}
	if app.Spec.ReplicasOrDefault() < minReplicasForBudget {
		if err := r.Get(ctx, client.ObjectKeyFromObject(budget), budget); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !metav1.IsControlledBy(budget, app) {
			return nil
		}
		if err := r.Delete(ctx, budget, client.Preconditions{UID: &budget.UID}); err != nil {
			return client.IgnoreNotFound(err)
		}
		apiWrites.WithLabelValues("poddisruptionbudgets").Inc()
		return nil
	}
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, budget, func() error {
		return mutateBudget(budget, app, r.Scheme)
	})
	if err != nil {
		return err
	}
	if op != controllerutil.OperationResultNone {
		apiWrites.WithLabelValues("poddisruptionbudgets").Inc()
	}
	return nil
}

// taken reads the child named like the AppService from the cache into obj and says
// whether it exists without being controlled by app.
func (r *AppServiceReconciler) taken(ctx context.Context, key client.ObjectKey, obj client.Object, app *AppService) (bool, error) {
	if err := r.Get(ctx, key, obj); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return !metav1.IsControlledBy(obj, app), nil
}

// writeStatus updates the status subresource when the status changed, and records an
// Event on a Ready transition worth one (as the Rust controller does).
func (r *AppServiceReconciler) writeStatus(ctx context.Context, app *AppService, status AppServiceStatus) error {
	if equality.Semantic.DeepEqual(app.Status, status) {
		return nil
	}
	before := meta.FindStatusCondition(app.Status.Conditions, condReady)
	after := meta.FindStatusCondition(status.Conditions, condReady)
	var wasReady bool
	var beforeState string
	if before != nil {
		wasReady = before.Status == metav1.ConditionTrue
		beforeState = string(before.Status) + "/" + before.Reason
	}
	app.Status = status
	// A 409 (the cache was behind our last write) goes back as an error: requeued with
	// backoff, by then the cache has caught up.
	if err := r.Status().Update(ctx, app); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	apiWrites.WithLabelValues("appservices/status").Inc()
	if after != nil && string(after.Status)+"/"+after.Reason != beforeState &&
		(after.Reason != reasonRollingOut || wasReady) {
		eventType, note := corev1.EventTypeNormal, after.Message
		if after.Status == metav1.ConditionTrue {
			note = "Ready: " + after.Message
		} else if after.Reason != reasonRollingOut {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(app, nil, eventType, after.Reason, "Reconcile", "%s", note)
	}
	return nil
}
