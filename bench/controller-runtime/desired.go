package main

// The children of an AppService, as controller/core/src/desired.rs builds them: same names,
// labels, owner reference, ports and probe. Written as controllerutil.CreateOrUpdate
// mutate functions: they set only the fields the controller owns on the object read from
// the cache, so the API server's defaults (and other writers' labels) stay and a
// converged child compares equal, making no request.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// Names and labels from common/src/names.rs.
const (
	finalizer      = "platform.example.com/cleanup"
	leaseName      = "appservice-controller"
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "appservice-operator"
	containerName  = "app"
	portName       = "http"
)

func selectorLabels(app string) map[string]string {
	return map[string]string{labelInstance: app, labelManagedBy: managedBy}
}

func childLabels(app string) map[string]string {
	l := selectorLabels(app)
	l[labelName] = app
	return l
}

// selectorString is status.selector: the selector labels sorted by key, k=v joined by ",".
func selectorString(app string) string {
	l := selectorLabels(app)
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}

func endpoint(app, namespace string, port int32) string {
	return fmt.Sprintf("http://%s.%s.svc:%d", app, namespace, port)
}

// withLabels returns labels with ours set and everyone else's kept.
func withLabels(labels, ours map[string]string) map[string]string {
	if labels == nil {
		labels = make(map[string]string, len(ours))
	}
	maps.Copy(labels, ours)
	return labels
}

// mutateDeployment makes d the Deployment of app.
func mutateDeployment(d *appsv1.Deployment, app *AppService, scheme *runtime.Scheme) error {
	name := app.Name
	port := app.Spec.PortOrDefault()
	d.Labels = withLabels(d.Labels, childLabels(name))
	if err := controllerutil.SetControllerReference(app, d, scheme); err != nil {
		return err
	}
	d.Spec.Replicas = ptr.To(app.Spec.ReplicasOrDefault())
	if d.CreationTimestamp.IsZero() {
		// Immutable once created.
		d.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(name)}
	}
	d.Spec.Template.Labels = withLabels(d.Spec.Template.Labels, childLabels(name))

	containers := d.Spec.Template.Spec.Containers
	i := slices.IndexFunc(containers, func(c corev1.Container) bool { return c.Name == containerName })
	if i < 0 {
		containers = append(containers, corev1.Container{Name: containerName})
		i = len(containers) - 1
	}
	c := &containers[i]
	c.Image = app.Spec.Image
	c.Ports = []corev1.ContainerPort{{Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP}}
	c.Env = nil
	if len(app.Spec.Env) > 0 {
		c.Env = make([]corev1.EnvVar, len(app.Spec.Env))
		for j := range app.Spec.Env {
			app.Spec.Env[j].DeepCopyInto(&c.Env[j])
		}
	}
	c.Resources = corev1.ResourceRequirements{}
	if r := app.Spec.Resources; r != nil {
		r.DeepCopyInto(&c.Resources)
	}
	if c.ReadinessProbe == nil {
		c.ReadinessProbe = &corev1.Probe{}
	}
	// Only the handler: timeouts and thresholds keep the API server's defaults.
	c.ReadinessProbe.ProbeHandler = corev1.ProbeHandler{
		TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)},
	}
	d.Spec.Template.Spec.Containers = containers
	return nil
}

// minReplicasForBudget: common/src/names.rs MIN_REPLICAS_FOR_BUDGET.
const minReplicasForBudget = 2

// mutateBudget makes b the PodDisruptionBudget of app (controller/core/src/desired/disruption.rs).
func mutateBudget(b *policyv1.PodDisruptionBudget, app *AppService, scheme *runtime.Scheme) error {
	b.Labels = withLabels(b.Labels, childLabels(app.Name))
	if err := controllerutil.SetControllerReference(app, b, scheme); err != nil {
		return err
	}
	one := intstr.FromInt32(1)
	b.Spec.MaxUnavailable = &one
	b.Spec.MinAvailable = nil
	b.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(app.Name)}
	b.Spec.UnhealthyPodEvictionPolicy = ptr.To(policyv1.AlwaysAllow)
	return nil
}

// mutateService makes s the ClusterIP Service of app.
func mutateService(s *corev1.Service, app *AppService, scheme *runtime.Scheme) error {
	name := app.Name
	port := app.Spec.PortOrDefault()
	s.Labels = withLabels(s.Labels, childLabels(name))
	if err := controllerutil.SetControllerReference(app, s, scheme); err != nil {
		return err
	}
	s.Spec.Selector = selectorLabels(name)
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.Ports = []corev1.ServicePort{{
		Name:       portName,
		Port:       port,
		TargetPort: intstr.FromInt32(port),
		Protocol:   corev1.ProtocolTCP,
	}}
	return nil
}
