//! The `AppService` API, version `v1beta1`: the hub. The API server stores this version and
//! the controller works on it; `v1alpha1` objects are converted to and from it
//! ([`crate::conversion`]).
//!
//! What changed from `v1alpha1`, and why:
//!
//! * `ports: [{name, port, protocol}]` instead of one `port`: applications serve metrics,
//!   gRPC or UDP next to HTTP. The Deployment's container and the Service expose every
//!   port; the first one is the application's endpoint (`status.endpoint`) and the one the
//!   readiness probe checks. Defaults to `[{name: http, port: 8080, protocol: TCP}]`, which
//!   is what a `v1alpha1` object without `port` means.
//! * `database: {class}`: a database is requested when `database` is present. The
//!   `enabled` flag of `v1alpha1` allowed `{enabled: true}` without a class (an error) and
//!   `{enabled: false, class: x}` (a class that means nothing); neither can be written now.
//!
//! * `podSecurity: {profile, runAsUser, runAsGroup, fsGroup, readOnlyRootFilesystem}`:
//!   the Pods meet the Pod Security `Restricted` profile by default (non-root, no
//!   privilege escalation, no capabilities, the runtime's seccomp profile), so they are
//!   admitted in namespaces that enforce it; these are the few settings real images need
//!   under it, and `profile: Baseline` for an image that must run as root. `v1alpha1`
//!   objects get the defaults; a `v1beta1` value survives a `v1alpha1` read-edit-write in
//!   an annotation ([`crate::conversion`]).
//!
//! * `rollout: {maxSurge, maxUnavailable}`: how fast a new Pod template replaces the
//!   old one (the Deployment's rolling update). Absent, the Deployment's defaults apply,
//!   as they always did; `v1alpha1` keeps it in an annotation ([`crate::conversion`]).
//!
//! * `canary: {image, replicas}`: a canary release, a second Deployment of the same Pods
//!   with another image behind the same Service. `v1alpha1` keeps it in an annotation.
//!
//! * `config: [{configMap | secret, mountPath}]`: ConfigMaps and Secrets the Pods read,
//!   as variables or files; a change of their data rolls the Pods. `v1alpha1` keeps it
//!   in an annotation.
//!
//! * `autoscaling: {minReplicas, maxReplicas, targetCPUUtilizationPercentage}`: a
//!   HorizontalPodAutoscaler on the AppService's scale subresource. `v1alpha1` keeps it
//!   in an annotation.
//!
//! * `expose: {hostnames, paths, port, tls}`: the application reached from outside the
//!   cluster through the Gateway the cluster's admin named, by an HTTPRoute. `v1alpha1`
//!   keeps it in an annotation.
//!
//! Everything else (image, replicas, env, resources, status) is the same in both versions.

use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::limits::{
    DEFAULT_CANARY_REPLICAS, DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE, DEFAULT_PORT,
    DEFAULT_REPLICAS,
};

crate::shared::app_service_spec! {
    version = "v1beta1",
    doc = "An application: an OCI image run as a Deployment of `replicas` Pods behind a Service on `ports`, optionally with a PostgreSQL database.",
    spec_doc = "The desired state of an AppService: what to run, how many copies, on which ports.",
    #[x_kube(validation = Rule::new(
        "!has(oldSelf.database) || !has(self.database) || self.database.class == oldSelf.database.class"
    ).message("database.class is immutable while a database is requested").field_path(".database.class"))]
    #[x_kube(validation = Rule::new(
        "!has(self.canary) || (has(self.canary.replicas) ? self.canary.replicas : 1) <= (has(self.replicas) ? self.replicas : 1)"
    ).message("canary.replicas must not be greater than replicas").field_path(".canary.replicas"))]
    fields {
        /// Ports the container listens on; the Service exposes each. The first one is the
        /// application's endpoint and is probed for readiness. At most 16, names unique, each
        /// port number at most once per protocol. Defaults to
        /// `[{name: http, port: 8080, protocol: TCP}]`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[schemars(schema_with = "ports_schema")]
        pub ports: Vec<AppPort>,

        /// How the Pods run. Without it they meet the Pod Security `Restricted` profile:
        /// a non-root user, no privilege escalation, every capability dropped, the
        /// container runtime's default seccomp profile. Set `runAsUser` for an image
        /// whose `USER` is root or a name rather than a number (the kubelet refuses to
        /// start those as non-root), `fsGroup` for volumes it must write, or
        /// `profile: Baseline` for an image that must run as root (then the namespace's
        /// Pod Security level decides whether its Pods are admitted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pod_security: Option<PodSecurity>,

        /// How a change of the Pod template rolls out: `maxSurge` Pods above `replicas`
        /// and at most `maxUnavailable` Pods below it during the rollout, each a number
        /// or a percentage of `replicas` (`"25%"`), as a Deployment's rolling update
        /// says. Both default to `25%`; they may not both be 0. Without it the
        /// Deployment's own defaults apply (the same 25% and 25%).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub rollout: Option<RolloutSpec>,

        /// A canary release: `replicas` of the `replicas` Pods run `image` instead, in a
        /// second Deployment `<name>-canary` behind the same Service, so they take about
        /// `canary.replicas / replicas` of the traffic (weight is expressed by replicas;
        /// no service mesh is involved). Promote by setting `image` to the canary's image
        /// and removing `canary`; abort by removing `canary`. Validated like `image`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub canary: Option<CanarySpec>,

        /// ConfigMaps and Secrets of the AppService's namespace whose keys the Pods read:
        /// each key an environment variable, or, with `mountPath`, a file in that
        /// directory. A change of their data rolls the Pods (as a change of the spec
        /// does), and so does a change of a ConfigMap or Secret that `env` takes a key
        /// from. While one does not exist, nothing is rolled out and status says which
        /// (`ConfigSourceMissing`). At most 16 entries.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[schemars(schema_with = "config_schema")]
        pub config: Vec<ConfigSource>,

        /// Replicas decided by load: a HorizontalPodAutoscaler `<name>` keeps the average
        /// CPU use of the Pods near `targetCPUUtilizationPercentage` of their CPU request
        /// (`resources.requests.cpu` is required), between `minReplicas` and
        /// `maxReplicas`, by writing `replicas` through the scale subresource. Leave
        /// `replicas` out of manifests applied by GitOps while it is set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub autoscaling: Option<AutoscalingSpec>,

        /// Reach the application from outside the cluster: an HTTPRoute `<name>` sends
        /// requests for `hostnames` (and under `paths`) that arrive at the Gateway the
        /// cluster's admin named to the Service's `port`. With `tls`, the Gateway
        /// terminates HTTPS for these host names with the certificate of the Secret
        /// `tls.secretName`. A host name belongs to one AppService in the cluster: one
        /// another AppService holds is refused. `status.url` says where it answers once
        /// the Gateway accepted the route.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub expose: Option<ExposeSpec>,
    }
    /// A PostgreSQL database provisioned for this application, requested by being
    /// present. The connection URL is passed to the container as `DATABASE_URL`.
}

/// One port of the application.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.name.matches('[a-z]') && !self.name.contains('--')").message("name must be an IANA service name: lowercase letters, digits and '-', at least one letter, no '--', not starting or ending with '-'").field_path(".name"))]
#[serde(rename_all = "camelCase")]
pub struct AppPort {
    /// Name of the port on the container and the Service, an IANA service name of at most
    /// 15 characters such as `http`, `metrics` or `grpc`.
    #[schemars(length(min = 1, max = crate::limits::MAX_PORT_NAME_LEN))]
    pub name: String,

    /// Port number the container listens on and the Service exposes, from 1 to 65535.
    #[schemars(range(min = crate::limits::MIN_PORT, max = crate::limits::MAX_PORT))]
    pub port: i32,

    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "protocol_schema")]
    pub protocol: Option<Protocol>,
}

/// Transport protocol of a port.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Default for Protocol {
    fn default() -> Self {
        DEFAULT_PROTOCOL
    }
}

impl Protocol {
    /// The protocol as the core API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// Database request of an AppService: present means requested.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Database class: the name of a cluster-admin configured PostgreSQL server. Cannot
    /// change while the database is requested.
    #[schemars(length(min = 1, max = crate::limits::MAX_CLASS_LEN))]
    pub class: String,
}

/// How the Pods of an AppService run: the Pod Security profile their template meets,
/// and the ids and filesystem settings an image may need under it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.runAsUser) || self.runAsUser != 0 || (has(self.profile) && self.profile == 'Baseline')").message("runAsUser 0 is root, which the Restricted profile forbids; use profile Baseline for an image that must run as root").field_path(".runAsUser"))]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    /// The Pod Security Standard the Pod template meets. `Restricted` (the default):
    /// `runAsNonRoot`, `allowPrivilegeEscalation: false`, all capabilities dropped,
    /// seccomp `RuntimeDefault`; admitted everywhere. `Baseline`: the image's user, root
    /// included, with the container runtime's default capabilities (still no privilege
    /// escalation, seccomp `RuntimeDefault`); admitted only where the namespace enforces
    /// `baseline` or `privileged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "profile_schema")]
    pub profile: Option<SecurityProfile>,

    /// Numeric user id the container runs as, from 0 to 2147483647 (0, root, only with
    /// `profile: Baseline`). Defaults to the image's `USER`, which must then be a
    /// non-root number under `Restricted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::limits::MIN_ID, max = crate::limits::MAX_ID))]
    pub run_as_user: Option<i64>,

    /// Numeric primary group id of the container's process, from 0 to 2147483647.
    /// Defaults to the image's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::limits::MIN_ID, max = crate::limits::MAX_ID))]
    pub run_as_group: Option<i64>,

    /// Group id that owns the Pod's volumes and is added to the process's groups, from 0
    /// to 2147483647, so a non-root process can use files mounted for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = crate::limits::MIN_ID, max = crate::limits::MAX_ID))]
    pub fs_group: Option<i64>,

    /// Mounts the container's root filesystem read-only (writable paths then come from
    /// volumes). Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_root_filesystem: Option<bool>,
}

/// How an AppService's replicas follow its load.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must not be greater than maxReplicas").field_path(".minReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingSpec {
    /// The fewest replicas, from 1. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "min_replicas_schema")]
    pub min_replicas: Option<i32>,

    /// The most replicas, from 1 to 1000.
    #[schemars(range(min = crate::limits::MIN_AUTOSCALING_REPLICAS, max = crate::limits::MAX_REPLICAS))]
    pub max_replicas: i32,

    /// The average CPU use the Pods are kept near, as a percentage of their CPU request,
    /// from 1 to 1000. Defaults to 80.
    #[serde(
        default,
        rename = "targetCPUUtilizationPercentage",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "target_cpu_schema")]
    pub target_cpu_utilization_percentage: Option<i32>,
}

fn min_replicas_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": crate::limits::MIN_AUTOSCALING_REPLICAS,
        "maximum": crate::limits::MAX_REPLICAS,
        "default": crate::limits::DEFAULT_MIN_REPLICAS,
    })
}

fn target_cpu_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": crate::limits::MIN_TARGET_CPU_UTILIZATION,
        "maximum": crate::limits::MAX_TARGET_CPU_UTILIZATION,
        "default": crate::limits::DEFAULT_TARGET_CPU_UTILIZATION,
    })
}

impl AutoscalingSpec {
    /// `minReplicas` with the default applied.
    pub fn min_replicas(&self) -> i32 {
        self.min_replicas
            .unwrap_or(crate::limits::DEFAULT_MIN_REPLICAS)
    }

    /// `targetCPUUtilizationPercentage` with the default applied.
    pub fn target_cpu_utilization(&self) -> i32 {
        self.target_cpu_utilization_percentage
            .unwrap_or(crate::limits::DEFAULT_TARGET_CPU_UTILIZATION)
    }
}

/// How an AppService is reached from outside the cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExposeSpec {
    /// The host names requests for the application carry, lowercase DNS names such as
    /// `shop.apps.example.com` (no wildcards, no IP addresses). 1 to 16, each unique.
    #[schemars(schema_with = "hostnames_schema")]
    pub hostnames: Vec<String>,

    /// Path prefixes sent to the application, each starting with `/`. Defaults to
    /// `["/"]`: every path. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "expose_paths_schema")]
    pub paths: Vec<String>,

    /// The name of the port in `ports` that receives the requests; a TCP port. Defaults
    /// to the first port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::limits::MAX_PORT_NAME_LEN))]
    pub port: Option<String>,

    /// HTTPS for the host names, terminated at the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ExposeTls>,
}

/// The certificate the Gateway serves for an AppService's host names: a Secret of yours,
/// or one cert-manager issues (`issuerRef`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.secretName) || has(self.issuerRef)").message("secretName or issuerRef is required"))]
#[serde(rename_all = "camelCase")]
pub struct ExposeTls {
    /// A Secret of type `kubernetes.io/tls` in the AppService's namespace holding the
    /// certificate (for every host name) and its key. Only the Gateway is allowed to read
    /// it (a ReferenceGrant the controller keeps). With `issuerRef`, the Secret
    /// cert-manager writes; defaults to `<name>-tls` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::limits::MAX_SUBDOMAIN_LEN))]
    pub secret_name: Option<String>,

    /// A cert-manager issuer: the controller keeps a Certificate `<name>` for every host
    /// name, issued by it into `secretName` (the cluster must run cert-manager, and the
    /// controller be installed with `controller.expose.certManager`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// A cert-manager issuer, as a Certificate's `issuerRef` names it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// The issuer's name: an `Issuer` of the AppService's namespace, or a `ClusterIssuer`.
    #[schemars(length(min = 1, max = crate::limits::MAX_SUBDOMAIN_LEN))]
    pub name: String,

    /// `Issuer` (the default) or `ClusterIssuer`, or an external issuer's kind with its
    /// `group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: Option<String>,

    /// The issuer's API group; defaults to `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::limits::MAX_SUBDOMAIN_LEN))]
    pub group: Option<String>,
}

impl ExposeTls {
    /// The Secret the Gateway serves from, for the AppService `app`.
    pub fn secret(&self, app: &str) -> String {
        match &self.secret_name {
            Some(name) => name.clone(),
            None => format!("{app}-tls"),
        }
    }
}

impl ExposeSpec {
    /// `paths` with the default applied.
    pub fn paths(&self) -> Vec<&str> {
        if self.paths.is_empty() {
            vec![crate::limits::DEFAULT_EXPOSE_PATH]
        } else {
            self.paths.iter().map(String::as_str).collect()
        }
    }
}

fn hostnames_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": crate::limits::MAX_EXPOSE_HOSTNAMES,
        "x-kubernetes-list-type": "set",
        "items": {"type": "string", "minLength": 1, "maxLength": crate::limits::MAX_SUBDOMAIN_LEN},
    })
}

fn expose_paths_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": crate::limits::MAX_EXPOSE_PATHS,
        "items": {"type": "string", "minLength": 1, "maxLength": crate::limits::MAX_EXPOSE_PATH_LEN},
    })
}

/// A ConfigMap or a Secret the Pods of an AppService read: exactly one of the two.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.configMap) != has(self.secret)").message("exactly one of configMap and secret must be set"))]
#[serde(rename_all = "camelCase")]
pub struct ConfigSource {
    /// The name of a ConfigMap in the AppService's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::limits::MAX_SUBDOMAIN_LEN))]
    pub config_map: Option<String>,

    /// The name of a Secret in the AppService's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::limits::MAX_SUBDOMAIN_LEN))]
    pub secret: Option<String>,

    /// An absolute directory in the container where each key is a file (read-only).
    /// Without it, each key is an environment variable (keys that are not valid variable
    /// names are skipped by the kubelet, which records an Event); variables set in `env`
    /// win over these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = crate::limits::MAX_MOUNT_PATH_LEN))]
    pub mount_path: Option<String>,
}

impl ConfigSource {
    /// The kind and name of the object this entry reads; `None` unless exactly one is set.
    pub fn source(&self) -> Option<(ConfigKind, &str)> {
        match (&self.config_map, &self.secret) {
            (Some(name), None) => Some((ConfigKind::ConfigMap, name)),
            (None, Some(name)) => Some((ConfigKind::Secret, name)),
            _ => None,
        }
    }
}

/// The kinds of object `spec.config` (and `env`) may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
}

impl ConfigKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::ConfigMap => "ConfigMap",
            ConfigKind::Secret => "Secret",
        }
    }
}

fn config_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<ConfigSource>();
    json_schema!({
        "type": "array",
        "items": item,
        "maxItems": crate::limits::MAX_CONFIG_SOURCES,
    })
}

/// A canary release of an AppService: a few Pods of another image beside the others.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanarySpec {
    /// OCI image reference the canary Pods run, with the same rules as `spec.image`.
    #[schemars(length(min = 1, max = crate::limits::MAX_IMAGE_LEN))]
    pub image: String,

    /// How many of the AppService's `replicas` run the canary image, from 1 to
    /// `replicas`. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "canary_replicas_schema")]
    pub replicas: Option<i32>,
}

fn canary_replicas_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": crate::limits::MIN_CANARY_REPLICAS,
        "maximum": crate::limits::MAX_REPLICAS,
        "default": DEFAULT_CANARY_REPLICAS,
    })
}

impl CanarySpec {
    /// `replicas` with the default applied.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_CANARY_REPLICAS)
    }
}

/// How the Deployment replaces its Pods: its `strategy.rollingUpdate`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new(ROLLOUT_NOT_BOTH_ZERO).message("maxUnavailable may not be 0 when maxSurge is 0: the rollout could never replace a Pod").field_path(".maxUnavailable"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Pods that may run above `replicas` during a rollout: a non-negative number, or a
    /// percentage of `replicas` from `0%` to `100%` (rounded up). Defaults to `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_surge_schema")]
    pub max_surge: Option<IntOrString>,

    /// Pods that may be missing below `replicas` during a rollout: a non-negative number,
    /// or a percentage of `replicas` from `0%` to `100%` (rounded down). Defaults to
    /// `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_unavailable_schema")]
    pub max_unavailable: Option<IntOrString>,
}

/// The CEL form of "a non-negative number, or a percentage from 0% to 100%", as
/// `common::validation` checks it (leading zeros allowed, as Kubernetes parses them).
const INT_OR_PERCENT_RULE: &str =
    "type(self) == int ? self >= 0 : self.matches('^0*(100|[1-9]?[0-9])%$')";
/// Both settings present and 0 (as a number or a percentage): what a Deployment refuses.
const ROLLOUT_NOT_BOTH_ZERO: &str = "!(has(self.maxSurge) && has(self.maxUnavailable) && (type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge.matches('^0+%$')) && (type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable.matches('^0+%$')))";

fn int_or_percent_schema(default: &str) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "default": default,
        "x-kubernetes-validations": [{
            "rule": INT_OR_PERCENT_RULE,
            "message": "must be a non-negative integer or a percentage from 0% to 100% (e.g. '25%')"
        }],
    })
}

fn max_surge_schema(_: &mut SchemaGenerator) -> Schema {
    int_or_percent_schema(DEFAULT_MAX_SURGE)
}

fn max_unavailable_schema(_: &mut SchemaGenerator) -> Schema {
    int_or_percent_schema(DEFAULT_MAX_UNAVAILABLE)
}

impl RolloutSpec {
    /// `maxSurge` with the default applied.
    pub fn max_surge(&self) -> IntOrString {
        self.max_surge
            .clone()
            .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_SURGE.to_owned()))
    }

    /// `maxUnavailable` with the default applied.
    pub fn max_unavailable(&self) -> IntOrString {
        self.max_unavailable
            .clone()
            .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_UNAVAILABLE.to_owned()))
    }
}

/// A Pod Security Standard an AppService's Pod template meets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SecurityProfile {
    Restricted,
    Baseline,
}

impl Default for SecurityProfile {
    fn default() -> Self {
        DEFAULT_SECURITY_PROFILE
    }
}

impl SecurityProfile {
    /// The profile as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityProfile::Restricted => "Restricted",
            SecurityProfile::Baseline => "Baseline",
        }
    }
}

fn profile_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": [SecurityProfile::Restricted.as_str(), SecurityProfile::Baseline.as_str()],
        "default": DEFAULT_SECURITY_PROFILE.as_str(),
    })
}

impl JsonSchema for SecurityProfile {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SecurityProfile".into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        profile_schema(generator)
    }
}

impl PodSecurity {
    /// The profile with the default applied.
    pub fn profile(&self) -> SecurityProfile {
        self.profile.unwrap_or_default()
    }
}

fn ports_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<AppPort>();
    json_schema!({
        "type": "array",
        "items": item,
        "maxItems": crate::limits::MAX_PORTS,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "default": default_ports(),
        "x-kubernetes-validations": [{
            "rule": "self.all(p, self.filter(q, q.port == p.port && (has(q.protocol) ? q.protocol : 'TCP') == (has(p.protocol) ? p.protocol : 'TCP')).size() == 1)",
            "message": "each port number may appear once per protocol"
        }],
    })
}

fn protocol_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": [Protocol::Tcp.as_str(), Protocol::Udp.as_str(), Protocol::Sctp.as_str()],
        "default": DEFAULT_PROTOCOL.as_str(),
    })
}

impl JsonSchema for Protocol {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Protocol".into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        protocol_schema(generator)
    }
}

impl AppPort {
    /// The default port list's only entry, and what a `v1alpha1` `port` becomes.
    pub fn http(port: i32) -> Self {
        AppPort {
            name: DEFAULT_PORT_NAME.to_owned(),
            port,
            protocol: Some(DEFAULT_PROTOCOL),
        }
    }

    /// The protocol with the default applied.
    pub fn protocol(&self) -> Protocol {
        self.protocol.unwrap_or_default()
    }
}

impl AppServiceSpec {
    /// Replicas to run, with the default applied.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// The ports with the defaults applied: never empty, every protocol set.
    pub fn ports(&self) -> Vec<AppPort> {
        let mut ports = self.ports.clone();
        default_port_list(&mut ports);
        ports
    }

    /// The first port's number, the application's endpoint, with the default applied.
    pub fn port(&self) -> i32 {
        self.ports.first().map_or(DEFAULT_PORT, |p| p.port)
    }

    /// The database class when a database is requested.
    pub fn database_class(&self) -> Option<&str> {
        self.database.as_ref().map(|db| db.class.as_str())
    }

    /// Replicas of the stable Deployment: `replicas` less those of the canary.
    pub fn stable_replicas(&self) -> i32 {
        let canary = self.canary.as_ref().map_or(0, CanarySpec::replicas);
        (self.replicas() - canary).max(0)
    }

    /// How the Pods run, with the defaults applied (`Restricted`, the image's ids).
    pub fn pod_security(&self) -> PodSecurity {
        let mut security = self.pod_security.clone().unwrap_or_default();
        security.profile.get_or_insert(DEFAULT_SECURITY_PROFILE);
        security
    }
}

/// The name of the default port, and of the port a `v1alpha1` `port` stands for.
pub const DEFAULT_PORT_NAME: &str = "http";
/// A port's protocol when omitted.
pub const DEFAULT_PROTOCOL: Protocol = Protocol::Tcp;
/// `spec.podSecurity.profile` when omitted, and the profile of an AppService without
/// `podSecurity` (every `v1alpha1` object): Pods that Pod Security admits everywhere.
pub const DEFAULT_SECURITY_PROFILE: SecurityProfile = SecurityProfile::Restricted;

/// `spec.ports` when omitted: the `http` port 8080 over TCP.
pub fn default_ports() -> Vec<AppPort> {
    vec![AppPort::http(DEFAULT_PORT)]
}

/// `ports` with the defaults applied: the default list for none, and every protocol set.
pub fn default_port_list(ports: &mut Vec<AppPort>) {
    if ports.is_empty() {
        *ports = default_ports();
    }
    for port in ports {
        port.protocol.get_or_insert(DEFAULT_PROTOCOL);
    }
}
