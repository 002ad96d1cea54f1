package main

// The AppService API (platform.example.com/v1alpha1) as a hand-written Go type, the way a
// kubebuilder project declares it in api/v1alpha1 (here without controller-gen: the
// CRD comes from the Rust `common` crate, and DeepCopy is written out below).

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion of the AppService API.
var GroupVersion = schema.GroupVersion{Group: "platform.example.com", Version: "v1alpha1"}

// SchemeBuilder registers the AppService types.
var SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

const (
	defaultReplicas int32 = 1
	defaultPort     int32 = 8080
)

// AppServiceSpec is the user's intent (see common/src/types.rs).
type AppServiceSpec struct {
	Image     string                       `json:"image"`
	Replicas  *int32                       `json:"replicas,omitempty"`
	Port      *int32                       `json:"port,omitempty"`
	Env       []corev1.EnvVar              `json:"env,omitempty"`
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	Database  *DatabaseSpec                `json:"database,omitempty"`
}

// DatabaseSpec asks for a PostgreSQL database (not implemented by this baseline).
type DatabaseSpec struct {
	Enabled bool    `json:"enabled"`
	Class   *string `json:"class,omitempty"`
}

// AppServiceStatus is what the controller observed.
type AppServiceStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	ReadyReplicas      *int32             `json:"readyReplicas,omitempty"`
	Selector           string             `json:"selector,omitempty"`
	Endpoint           string             `json:"endpoint,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// AppService is an application: an image run as a Deployment behind a Service.
type AppService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AppServiceSpec   `json:"spec,omitempty"`
	Status AppServiceStatus `json:"status,omitempty"`
}

// AppServiceList is a list of AppServices.
type AppServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AppService `json:"items"`
}

func init() {
	SchemeBuilder.Register(&AppService{}, &AppServiceList{})
}

// ReplicasOrDefault is spec.replicas with its default.
func (s *AppServiceSpec) ReplicasOrDefault() int32 {
	if s.Replicas == nil {
		return defaultReplicas
	}
	return *s.Replicas
}

// PortOrDefault is spec.port with its default.
func (s *AppServiceSpec) PortOrDefault() int32 {
	if s.Port == nil {
		return defaultPort
	}
	return *s.Port
}

// ---- deepcopy (what controller-gen would generate) ----

// DeepCopyInto copies the spec into out.
func (in *AppServiceSpec) DeepCopyInto(out *AppServiceSpec) {
	*out = *in
	if in.Replicas != nil {
		v := *in.Replicas
		out.Replicas = &v
	}
	if in.Port != nil {
		v := *in.Port
		out.Port = &v
	}
	if in.Env != nil {
		out.Env = make([]corev1.EnvVar, len(in.Env))
		for i := range in.Env {
			in.Env[i].DeepCopyInto(&out.Env[i])
		}
	}
	if in.Resources != nil {
		out.Resources = in.Resources.DeepCopy()
	}
	if in.Database != nil {
		db := *in.Database
		if in.Database.Class != nil {
			c := *in.Database.Class
			db.Class = &c
		}
		out.Database = &db
	}
}

// DeepCopyInto copies the status into out.
func (in *AppServiceStatus) DeepCopyInto(out *AppServiceStatus) {
	*out = *in
	if in.ReadyReplicas != nil {
		v := *in.ReadyReplicas
		out.ReadyReplicas = &v
	}
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *AppServiceStatus) DeepCopy() *AppServiceStatus {
	if in == nil {
		return nil
	}
	out := new(AppServiceStatus)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the AppService into out.
func (in *AppService) DeepCopyInto(out *AppService) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy.
func (in *AppService) DeepCopy() *AppService {
	if in == nil {
		return nil
	}
	out := new(AppService)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *AppService) DeepCopyObject() runtime.Object {
	return in.DeepCopy()
}

// DeepCopyInto copies the list into out.
func (in *AppServiceList) DeepCopyInto(out *AppServiceList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]AppService, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *AppServiceList) DeepCopy() *AppServiceList {
	if in == nil {
		return nil
	}
	out := new(AppServiceList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *AppServiceList) DeepCopyObject() runtime.Object {
	return in.DeepCopy()
}
