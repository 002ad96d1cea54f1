//! What the controller keeps of its children: views.
//!
//! A child in the cache is read for a handful of values: the ones [`crate::drift`]
//! compares, the desired-hash annotation, the owner reference, and the rollout counts
//! and failure conditions status reports. A k8s-openapi `Deployment` holds every field of the API (its Pod
//! template alone is kilobytes, most of it empty `Option`s), and every label map is a
//! B-tree node of a few hundred bytes however few labels it has. So the watches decode
//! children straight into the views below, which keep only what is read, labels as
//! sorted pairs, security contexts as their JSON text ([`Compact`]), no other annotation
//! than the hash, and of the Deployment's conditions only those that say why Pods are
//! missing, with a bounded message. At 10,000 AppServices that is
//! the difference between kilobytes and a few hundred bytes per child (see
//! `benches/cache_cost.rs`).
//!
//! The views decode from the API's JSON (unknown fields ignored), so the watches,
//! `GET`s and patch responses all yield them directly, and the desired objects are
//! turned into views by the same decoder ([`of`]) before they are compared.

use std::borrow::Cow;
use std::collections::BTreeMap;

use common::names::{ANNOTATION_DESIRED_HASH, OWNED_TEMPLATE_ANNOTATIONS};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, MetricSpec,
};
use k8s_openapi::api::core::v1::{
    ContainerPort, EnvFromSource, EnvVarSource, PodSecurityContext, Probe, ResourceRequirements,
    SecurityContext, Service, ServicePort, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::cert_manager::Certificate;
use crate::gateway_api::{HttpRoute, ReferenceGrant, RouteCondition, RouteParentStatus};
use k8s_openapi::api::networking::v1::Ingress;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The view of `obj` (a desired child, or an API response), decoded as a watch would.
pub fn of<V: DeserializeOwned>(obj: &impl Serialize) -> Result<V, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(obj)?)
}

/// A child kind the controller builds, and the view it keeps of it.
pub trait Child:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
{
    /// The kind, for messages.
    const KIND: &'static str;
    /// Writes of this kind, as the `api_writes` metric counts them.
    const WRITTEN: crate::metrics::Written;
    type View: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Drift
        + Hashed
        + Labelled
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;
}

impl Child for Deployment {
    const KIND: &'static str = "Deployment";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::Deployments;
    type View = DeploymentView;
}

impl Child for Service {
    const KIND: &'static str = "Service";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::Services;
    type View = ServiceView;
}

impl Child for HorizontalPodAutoscaler {
    const KIND: &'static str = "HorizontalPodAutoscaler";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::HorizontalPodAutoscalers;
    type View = AutoscalerView;
}

impl Child for HttpRoute {
    const KIND: &'static str = "HTTPRoute";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::HttpRoutes;
    type View = RouteView;
}

impl Child for Ingress {
    const KIND: &'static str = "Ingress";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::Ingresses;
    type View = IngressView;
}

impl Child for Certificate {
    const KIND: &'static str = "Certificate";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::Certificates;
    type View = CertificateView;
}

impl Child for ReferenceGrant {
    const KIND: &'static str = "ReferenceGrant";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::ReferenceGrants;
    type View = GrantView;
}

impl Child for PodDisruptionBudget {
    const KIND: &'static str = "PodDisruptionBudget";
    const WRITTEN: crate::metrics::Written = crate::metrics::Written::PodDisruptionBudgets;
    type View = BudgetView;
}

/// The JSON-patch operations that make `live` what `desired` says in everything the
/// controller is responsible for; empty when nothing differs. Both are views: the desired
/// object is compared in the shape the cache keeps. Implemented in `crate::drift`, which
/// depends on the views, not the other way round.
pub trait Drift {
    fn drift(desired: &Self, live: &Self) -> Vec<serde_json::Value>;
}

/// A view that keeps its object's labels.
pub trait Labelled {
    fn kept_labels(&self) -> &LabelPairs;
}

/// A view that carries the desired-hash annotation of its object.
pub trait Hashed {
    fn hash(&self) -> Option<&str>;
}

/// `Resource` (the API type, group, version, plural of the kind it views) and `Hashed`
/// for a view with `metadata` and `hash` fields.
macro_rules! view_of {
    ($view:ty, $kind:ty) => {
        impl Resource for $view {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$kind>::kind(&())
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$kind>::group(&())
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$kind>::version(&())
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                <$kind>::api_version(&())
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$kind>::plural(&())
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl Hashed for $view {
            fn hash(&self) -> Option<&str> {
                self.hash.as_deref()
            }
        }

        impl Labelled for $view {
            fn kept_labels(&self) -> &LabelPairs {
                &self.labels
            }
        }
    };
}

/// A label map as sorted pairs: a few dozen bytes where a `BTreeMap` takes a node of
/// several hundred.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelPairs(Box<[(String, String)]>);

impl LabelPairs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl From<BTreeMap<String, String>> for LabelPairs {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the pairs come out sorted and unique.
        LabelPairs(map.into_iter().collect())
    }
}

impl Serialize for LabelPairs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for LabelPairs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<String, String>::deserialize(deserializer)?.into())
    }
}

/// Moves what a view keeps out of `meta`: its labels and the desired hash. The rest of
/// its annotations and `managedFields` are dropped; name, namespace, uid,
/// resourceVersion, generation and owner references stay for the reflector, the
/// controller's owner mapping, and status.
fn split_meta(mut meta: ObjectMeta) -> (ObjectMeta, LabelPairs, Option<String>) {
    let labels = meta.labels.take().map(LabelPairs::from).unwrap_or_default();
    let hash = meta
        .annotations
        .take()
        .and_then(|mut a| a.remove(ANNOTATION_DESIRED_HASH));
    meta.managed_fields = None;
    meta.creation_timestamp = None;
    (meta, labels, hash)
}

// ---- Deployment ------------------------------------------------------------------

/// What the controller reads of a Deployment.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawDeployment")]
pub struct DeploymentView {
    /// Name, namespace, uid, resourceVersion, generation, owner references.
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    /// The desired-hash annotation.
    pub hash: Option<String>,
    pub spec: DeploymentSpecView,
    pub status: Option<DeploymentStatusView>,
}

impl DeploymentView {
    /// The image of the application's container (the one the controller writes).
    pub fn image(&self) -> Option<&str> {
        self.spec
            .template
            .spec
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == crate::desired::CONTAINER_NAME)?
            .image
            .as_deref()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpecView {
    #[serde(default)]
    pub replicas: Option<i32>,
    /// The rollout strategy: ours only when the AppService sets `spec.rollout` (then
    /// it is compared and put back), the API server's defaults otherwise.
    #[serde(default)]
    pub strategy: Option<k8s_openapi::api::apps::v1::DeploymentStrategy>,
    #[serde(default)]
    pub template: PodTemplateView,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PodTemplateView {
    /// `None` when the template has no metadata at all.
    #[serde(default)]
    pub metadata: Option<TemplateMetaView>,
    #[serde(default)]
    pub spec: Option<PodSpecView>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawTemplateMeta")]
pub struct TemplateMetaView {
    pub labels: Option<LabelPairs>,
    /// Whether the template has an annotation map at all (a JSON patch adds a key to an
    /// existing map, or the map).
    pub has_annotations: bool,
    /// The annotations of the template the controller owns
    /// ([`OWNED_TEMPLATE_ANNOTATIONS`]); others' annotations are not kept.
    pub owned_annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawTemplateMeta {
    #[serde(default)]
    labels: Option<LabelPairs>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

impl From<RawTemplateMeta> for TemplateMetaView {
    fn from(raw: RawTemplateMeta) -> Self {
        TemplateMetaView {
            labels: raw.labels,
            has_annotations: raw.annotations.is_some(),
            owned_annotations: raw
                .annotations
                .map(|a| {
                    a.into_iter()
                        .filter(|(k, _)| OWNED_TEMPLATE_ANNOTATIONS.contains(&k.as_str()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecView {
    #[serde(default)]
    pub containers: Vec<ContainerView>,
    /// The Pod's security context; `None` when absent or empty.
    #[serde(default, deserialize_with = "pod_security_context")]
    pub security_context: Option<Compact>,
    /// The Pod's volumes (the controller owns only those [`common::names::is_owned_pod_volume`] names);
    /// `None` when absent.
    #[serde(default, deserialize_with = "volumes")]
    pub volumes: Option<Vec<Named>>,
    /// The Pod's spread constraints, each named by its `topologyKey` (the controller
    /// owns only those of [`common::names::OWNED_SPREAD_KEYS`]); `None` when absent.
    #[serde(default, deserialize_with = "spread_constraints")]
    pub topology_spread_constraints: Option<Vec<Named>>,
}

/// The fields of a container the controller sets (and nothing else).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVarView>>,
    /// Whole ConfigMaps and Secrets as variables (`spec.config`): the controller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<Vec<EnvFromSource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Box<Probe>>,
    /// The container's security context; `None` when absent or empty.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "container_security_context"
    )]
    pub security_context: Option<Compact>,
    /// The container's volume mounts (the controller owns only those of its own volumes,
    /// [`common::names::is_owned_pod_volume`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "volume_mounts"
    )]
    pub volume_mounts: Option<Vec<Named>>,
}

/// An entry of a list keyed by name (a volume, a volume mount), kept as its name and its
/// JSON text ([`Compact`]); serialized as the entry itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub value: Compact,
}

impl Serialize for Named {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

fn named<'de, T, D>(
    deserializer: D,
    name: impl Fn(&T) -> &str,
) -> Result<Option<Vec<Named>>, D::Error>
where
    T: Deserialize<'de> + Serialize,
    D: Deserializer<'de>,
{
    let Some(entries) = Option::<Vec<T>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    entries
        .iter()
        .map(|entry| {
            let text = serde_json::to_string(entry).map_err(serde::de::Error::custom)?;
            Ok(Named {
                name: name(entry).to_owned(),
                value: Compact(text.into_boxed_str()),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn volumes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Named>>, D::Error> {
    named::<Volume, D>(d, |v| v.name.as_str())
}

fn volume_mounts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Named>>, D::Error> {
    named::<VolumeMount, D>(d, |m| m.name.as_str())
}

fn spread_constraints<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Named>>, D::Error> {
    named::<TopologySpreadConstraint, D>(d, |c| c.topology_key.as_str())
}

/// An API value kept as its JSON text: one allocation of a few dozen bytes where the
/// k8s-openapi struct (a security context: a dozen nested `Option`s, mostly empty) takes
/// several hundred. The text is what the typed struct serializes to, so two values that
/// mean the same (fields in another order, explicit `null`s) have the same text, and an
/// empty object is no value at all (the API server stores `securityContext: {}` for an
/// absent Pod security context). Compared whole by [`crate::drift`], which owns these
/// values entirely.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compact(Box<str>);

impl Compact {
    /// The value, decoded (a valid JSON text by construction).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_default()
    }

    /// The canonical form of `value`, `None` for an empty one.
    fn of<T: Serialize>(value: &T) -> Result<Option<Compact>, serde_json::Error> {
        let text = serde_json::to_string(value)?;
        Ok((text != "{}").then(|| Compact(text.into_boxed_str())))
    }
}

impl Serialize for Compact {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

fn compact<'de, T, D>(deserializer: D) -> Result<Option<Compact>, D::Error>
where
    T: Deserialize<'de> + Serialize,
    D: Deserializer<'de>,
{
    match Option::<T>::deserialize(deserializer)? {
        Some(value) => Compact::of(&value).map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

fn pod_security_context<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Compact>, D::Error> {
    compact::<PodSecurityContext, D>(d)
}

fn container_security_context<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Compact>, D::Error> {
    compact::<SecurityContext, D>(d)
}

/// An environment variable: k8s-openapi's `EnvVar` holds its `valueFrom` inline, a few
/// hundred bytes per variable whether it is set or not; here it is boxed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarView {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<Box<EnvVarSource>>,
}

/// The rollout counts of a Deployment's status, and the conditions that say why its Pods
/// are missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeploymentStatusView {
    pub observed_generation: Option<i64>,
    pub replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    /// `ReplicaFailure=True` (Pods could not be created: Pod Security, a quota, a limit
    /// range) and `Progressing=False` (the progress deadline passed). Empty, and
    /// allocating nothing, for a healthy Deployment.
    pub failures: Box<[DeploymentConditionView]>,
}

/// The longest condition message a view keeps. A denial names each violated control once;
/// this holds several, and bounds what a foreign writer of the status can make us cache.
pub const MAX_CONDITION_MESSAGE_LEN: usize = 1024;

/// A Deployment condition as status reads it: type, status, reason, and its message cut at
/// [`MAX_CONDITION_MESSAGE_LEN`] bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeploymentConditionView {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Condition type of a Deployment whose Pods could not be created or deleted.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// Condition type of a Deployment's rollout progress.
pub const PROGRESSING: &str = "Progressing";

impl DeploymentStatusView {
    /// The failure condition of `type_`, if the Deployment has one.
    pub fn failure(&self, type_: &str) -> Option<&DeploymentConditionView> {
        self.failures.iter().find(|c| c.type_ == type_)
    }
}

/// `message` cut at [`MAX_CONDITION_MESSAGE_LEN`] bytes on a character boundary, with `…`
/// where it was cut.
fn bounded(mut message: String) -> String {
    if message.len() > MAX_CONDITION_MESSAGE_LEN {
        let mut end = MAX_CONDITION_MESSAGE_LEN - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

impl From<DeploymentStatus> for DeploymentStatusView {
    fn from(s: DeploymentStatus) -> Self {
        let failures = s
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                matches!(
                    (c.type_.as_deref(), c.status.as_deref()),
                    (Some(REPLICA_FAILURE), Some("True")) | (Some(PROGRESSING), Some("False"))
                )
            })
            .map(|c| DeploymentConditionView {
                type_: c.type_.unwrap_or_default(),
                status: c.status.unwrap_or_default(),
                reason: c.reason.unwrap_or_default(),
                message: bounded(c.message.unwrap_or_default()),
            })
            .collect();
        DeploymentStatusView {
            observed_generation: s.observed_generation,
            replicas: s.replicas,
            updated_replicas: s.updated_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            failures,
        }
    }
}

#[derive(Deserialize)]
struct RawDeployment {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: DeploymentSpecView,
    #[serde(default)]
    status: Option<DeploymentStatus>,
}

impl From<RawDeployment> for DeploymentView {
    fn from(raw: RawDeployment) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        DeploymentView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
            status: raw.status.map(Into::into),
        }
    }
}

view_of!(DeploymentView, Deployment);

// ---- Service ---------------------------------------------------------------------

/// What the controller reads of a Service.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawService")]
pub struct ServiceView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<ServiceSpecView>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpecView {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ServicePort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelPairs>,
}

#[derive(Deserialize)]
struct RawService {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<ServiceSpecView>,
}

impl From<RawService> for ServiceView {
    fn from(raw: RawService) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        ServiceView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
        }
    }
}

view_of!(ServiceView, Service);

// ---- PodDisruptionBudget -----------------------------------------------------------

/// What the controller reads of a PodDisruptionBudget: the fields it sets, and
/// `minAvailable`, which must be absent beside `maxUnavailable`. Its status (the
/// disruption controller's, rewritten on every Pod change) is not kept.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawBudget")]
pub struct BudgetView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<BudgetSpecView>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpecView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_pod_eviction_policy: Option<String>,
}

#[derive(Deserialize)]
struct RawBudget {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<BudgetSpecView>,
}

impl From<RawBudget> for BudgetView {
    fn from(raw: RawBudget) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        BudgetView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
        }
    }
}

view_of!(BudgetView, PodDisruptionBudget);

// ---- HorizontalPodAutoscaler -----------------------------------------------------

/// What the controller reads of a HorizontalPodAutoscaler: the fields it sets. Its
/// `behavior` is left to others (a platform's policy may tune it), its status to the
/// autoscaler.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawAutoscaler")]
pub struct AutoscalerView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<AutoscalerSpecView>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerSpecView {
    #[serde(default)]
    pub scale_target_ref: CrossVersionObjectReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    #[serde(default)]
    pub max_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<MetricSpec>>,
}

#[derive(Deserialize)]
struct RawAutoscaler {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<AutoscalerSpecView>,
}

impl From<RawAutoscaler> for AutoscalerView {
    fn from(raw: RawAutoscaler) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        AutoscalerView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
        }
    }
}

view_of!(AutoscalerView, HorizontalPodAutoscaler);

// ---- HTTPRoute -------------------------------------------------------------------

/// Longest condition message kept of a route's status (a Gateway's messages are
/// usually a sentence; a hostile or buggy one is cut).
const MAX_ROUTE_MESSAGE: usize = 256;

/// What the controller reads of an HTTPRoute: its spec, whole (every field of it is the
/// controller's, so any difference is someone else's edit), and what the Gateways say
/// of it (their conditions, messages cut to [`MAX_ROUTE_MESSAGE`]).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawRoute")]
pub struct RouteView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<serde_json::Value>,
    pub parents: Vec<RouteParentStatus>,
}

#[derive(Deserialize)]
struct RawRoute {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    #[serde(default)]
    status: Option<RawRouteStatus>,
}

#[derive(Deserialize)]
struct RawRouteStatus {
    #[serde(default)]
    parents: Vec<RouteParentStatus>,
}

impl From<RawRoute> for RouteView {
    fn from(raw: RawRoute) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        let mut parents = raw.status.map(|s| s.parents).unwrap_or_default();
        for condition in parents.iter_mut().flat_map(|p| p.conditions.iter_mut()) {
            cut(&mut condition.message);
        }
        RouteView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
            parents,
        }
    }
}

view_of!(RouteView, HttpRoute);

// ---- ReferenceGrant --------------------------------------------------------------

/// What the controller reads of a ReferenceGrant: its spec, whole (ours entirely).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawGrant")]
pub struct GrantView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawGrant {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<serde_json::Value>,
}

impl From<RawGrant> for GrantView {
    fn from(raw: RawGrant) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        GrantView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
        }
    }
}

view_of!(GrantView, ReferenceGrant);

// ---- Ingress -----------------------------------------------------------------------

/// What the controller reads of an Ingress: its spec, whole (ours entirely), and whether
/// an ingress controller admitted it (it wrote an address into its status).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawIngress")]
pub struct IngressView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<serde_json::Value>,
    pub admitted: bool,
}

#[derive(Deserialize)]
struct RawIngress {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    #[serde(default)]
    status: Option<serde_json::Value>,
}

impl From<RawIngress> for IngressView {
    fn from(raw: RawIngress) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        let admitted = raw
            .status
            .as_ref()
            .and_then(|s| s.pointer("/loadBalancer/ingress"))
            .and_then(serde_json::Value::as_array)
            .is_some_and(|addresses| !addresses.is_empty());
        IngressView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
            admitted,
        }
    }
}

view_of!(IngressView, Ingress);

// ---- Certificate (cert-manager) ----------------------------------------------------

/// What the controller reads of a Certificate: its spec, whole (ours entirely), and its
/// `Ready` condition (message cut to [`MAX_ROUTE_MESSAGE`]).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawCertificate")]
pub struct CertificateView {
    pub metadata: ObjectMeta,
    pub labels: LabelPairs,
    pub hash: Option<String>,
    pub spec: Option<serde_json::Value>,
    pub ready: Option<RouteCondition>,
}

#[derive(Deserialize)]
struct RawCertificate {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    #[serde(default)]
    status: Option<RawCertificateStatus>,
}

#[derive(Deserialize)]
struct RawCertificateStatus {
    #[serde(default)]
    conditions: Vec<RouteCondition>,
}

impl From<RawCertificate> for CertificateView {
    fn from(raw: RawCertificate) -> Self {
        let (metadata, labels, hash) = split_meta(raw.metadata);
        let ready = raw
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
            .map(|mut c| {
                cut(&mut c.message);
                c
            });
        CertificateView {
            metadata,
            labels,
            hash,
            spec: raw.spec,
            ready,
        }
    }
}

view_of!(CertificateView, Certificate);

/// `message` cut to [`MAX_ROUTE_MESSAGE`] bytes, on a character boundary.
fn cut(message: &mut String) {
    if message.len() > MAX_ROUTE_MESSAGE {
        let mut end = MAX_ROUTE_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
}

// ---- AppService ------------------------------------------------------------------

/// Drops from an AppService what the controller never reads before it enters the
/// cache: `managedFields`, and kubectl's copy of the whole object in an annotation.
pub fn slim_app(app: &mut common::AppService) {
    app.metadata.managed_fields = None;
    if let Some(annotations) = app.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            app.metadata.annotations = None;
        }
    }
}

/// What the caches held of a child before views: the whole object, without
/// `managedFields` and without annotations but the hash (kept for the comparison in
/// `benches/cache_cost.rs`).
pub fn slim_meta_of<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == ANNOTATION_DESIRED_HASH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{desired_deployment, desired_service};
    use crate::subject::subject;
    use common::AppService;
    use common::testing::{spec, stored};
    use serde_json::json;

    /// Everything the desired builders set survives into the views: the comparison
    /// and the repair patches built from a desired view lose nothing of it.
    /// An AppService with several ports (the first one UDP), env and resources.
    fn multi_port_app() -> AppService {
        let mut app = stored("web", spec("nginx:1.27"));
        app.spec = serde_json::from_value(json!({
            "image": "registry.example.com/dns:v2",
            "replicas": 3,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "http", "port": 8053},
                {"name": "metrics", "port": 9090, "protocol": "TCP"}
            ],
            "podSecurity": {"runAsUser": 10001, "fsGroup": 2000, "readOnlyRootFilesystem": true},
            "env": [{"name": "LOG_LEVEL", "value": "debug"}],
            "resources": {"requests": {"cpu": "100m"}}
        }))
        .unwrap();
        app
    }

    #[test]
    fn desired_children_survive_the_view() {
        for app in [stored("web", spec("nginx:1.27")), multi_port_app()] {
            desired_children_survive_the_view_of(&app);
        }
    }

    fn desired_children_survive_the_view_of(app: &AppService) {
        let d = desired_deployment(&subject(app), &crate::external::PodAdditions::default());
        let v: DeploymentView = of(&d).unwrap();
        let want = serde_json::to_value(&d).unwrap();
        let containers =
            serde_json::to_value(&v.spec.template.spec.as_ref().unwrap().containers).unwrap();
        assert_eq!(containers, want["spec"]["template"]["spec"]["containers"]);
        assert_eq!(
            serde_json::to_value(&v.spec.template.spec.as_ref().unwrap().security_context).unwrap(),
            want["spec"]["template"]["spec"]["securityContext"]
        );
        assert_eq!(
            serde_json::to_value(&v.labels).unwrap(),
            want["metadata"]["labels"]
        );
        assert_eq!(
            serde_json::to_value(&v.spec.template.metadata.as_ref().unwrap().labels).unwrap(),
            want["spec"]["template"]["metadata"]["labels"]
        );
        assert_eq!(v.spec.replicas, d.spec.replicas);
        assert_eq!(v.metadata.owner_references, d.metadata.owner_references);

        let s = desired_service(&subject(app));
        let v: ServiceView = of(&s).unwrap();
        let want = serde_json::to_value(&s).unwrap();
        assert_eq!(serde_json::to_value(&v.spec).unwrap(), want["spec"]);
        let ports = want["spec"]["ports"].as_array().unwrap().len();
        assert_eq!(ports, app.spec.ports().len());
    }

    #[test]
    fn labels_are_sorted_pairs_and_the_hash_is_kept_apart() {
        let v: ServiceView = serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop",
                "labels": {"z": "1", "a": "2", "m": "3"},
                "annotations": {ANNOTATION_DESIRED_HASH: "abc", "other": "dropped"},
                "managedFields": [{"manager": "x"}]
            },
            "spec": {"selector": {"b": "1", "a": "0"}, "clusterIP": "10.0.0.1"}
        }))
        .unwrap();
        assert_eq!(v.labels.get("a"), Some("2"));
        assert_eq!(v.labels.get("m"), Some("3"));
        assert_eq!(v.labels.get("missing"), None);
        assert_eq!(
            v.labels.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            ["a", "m", "z"]
        );
        assert_eq!(v.hash.as_deref(), Some("abc"));
        assert_eq!(v.metadata.annotations, None);
        assert_eq!(v.metadata.managed_fields, None);
        assert_eq!(
            v.spec.unwrap().selector.unwrap().iter().collect::<Vec<_>>(),
            [("a", "0"), ("b", "1")]
        );
    }

    #[test]
    fn deployment_status_keeps_counts_and_the_failures_only() {
        let denial = format!(
            "pods \"web-1-x\" is forbidden: violates PodSecurity \"restricted:latest\": {}",
            "é".repeat(MAX_CONDITION_MESSAGE_LEN)
        );
        let v: DeploymentView = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"template": {"spec": {"containers": [{"name": "app"}]}}},
            "status": {"observedGeneration": 3, "readyReplicas": 1, "conditions": [
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                 "message": "Deployment does not have minimum availability."},
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                 "message": "ReplicaSet \"web-1\" has timed out progressing."},
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": denial}
            ]}
        }))
        .unwrap();
        let status = v.status.unwrap();
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.ready_replicas, Some(1));
        assert_eq!(status.failures.len(), 2, "{:?}", status.failures);
        let deadline = status.failure(PROGRESSING).unwrap();
        assert_eq!(
            (deadline.status.as_str(), deadline.reason.as_str()),
            ("False", "ProgressDeadlineExceeded")
        );
        assert_eq!(
            deadline.message,
            "ReplicaSet \"web-1\" has timed out progressing."
        );
        let failure = status.failure(REPLICA_FAILURE).unwrap();
        assert_eq!(failure.reason, "FailedCreate");
        // Cut to the bound on a character boundary, and marked.
        assert!(failure.message.len() <= MAX_CONDITION_MESSAGE_LEN);
        assert!(failure.message.len() > MAX_CONDITION_MESSAGE_LEN - 4);
        assert!(failure.message.starts_with("pods \"web-1-x\" is forbidden"));
        assert!(failure.message.ends_with('…'));

        // A healthy Deployment keeps no condition.
        let v: DeploymentView = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "status": {"conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
            ]}
        }))
        .unwrap();
        assert!(v.status.unwrap().failures.is_empty());
    }

    #[test]
    fn security_contexts_are_kept_as_canonical_text() {
        let v: DeploymentView = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"template": {"spec": {
                "securityContext": {},
                "containers": [{"name": "app", "securityContext": {
                    "capabilities": {"drop": ["ALL"]}, "runAsUser": null,
                    "allowPrivilegeEscalation": false}}]
            }}}
        }))
        .unwrap();
        let spec = v.spec.template.spec.unwrap();
        // An empty security context is none.
        assert_eq!(spec.security_context, None);
        let container = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(
            container.0.as_ref(),
            r#"{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}"#
        );
        assert_eq!(
            serde_json::to_value(&container).unwrap(),
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
        );
    }
}
