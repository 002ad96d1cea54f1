//! What both versions of the `AppService` API share: the environment variable and status
//! types, the schema helpers, and the macro that writes a version's spec
//! ([`crate::v1alpha1`], [`crate::v1beta1`]) around the fields they have in common.

use k8s_openapi::api::core::v1::EnvVarSource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::limits::*;

/// One environment variable of the application container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!(has(self.value) && has(self.valueFrom))").message("value and valueFrom are mutually exclusive"))]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name: a C identifier such as `LOG_LEVEL`.
    #[schemars(length(min = 1, max = MAX_ENV_NAME_LEN))]
    pub name: String,

    /// Literal value. Mutually exclusive with `valueFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ENV_VALUE_LEN))]
    pub value: Option<String>,

    /// Value read from a Secret, a ConfigMap or a field of the Pod. Mutually exclusive with
    /// `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// The observed state of an AppService, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppServiceStatus {
    /// The `metadata.generation` this status describes: every status write stamps it,
    /// whether the spec was applied or found blocked (invalid, a name taken, a database
    /// class missing). Until it equals `metadata.generation`, the controller has not yet
    /// looked at the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Number of Pods of the Deployment that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// Label selector of the Pods, in string form, for the scale subresource and
    /// HorizontalPodAutoscalers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// In-cluster URL of the Service: `http://<name>.<namespace>.svc:<port>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Where the application answers from outside the cluster, `https://<host>/<path>`
    /// (or `http://` without TLS): the first host name and path of `spec.expose`, once
    /// the Gateway accepted the route. Absent while it is not exposed or not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,

    /// The canary Deployment, present only while `spec.canary` runs one. `readyReplicas`
    /// above counts the Pods of both Deployments, which the Service sends traffic to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,

    /// The image the Deployment runs, as verified under the `ImagePolicy`s that govern
    /// it: present only while at least one does (see docs/users/image-verification.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageStatus>,

    /// The same for the canary's image, while a canary runs and a policy governs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_image: Option<ImageStatus>,

    /// Current state: `Ready`, `Progressing` and `Degraded`, one entry per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// What runs as the canary of an AppService.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// The image the canary Deployment runs.
    pub image: String,
    /// Pods the canary Deployment asks for.
    pub replicas: i32,
    /// Pods of the canary Deployment that are ready.
    pub ready_replicas: i32,
}

/// What an image reference was verified as: the digest that runs (the Deployment says
/// `image@digest`), and which policy's key verified it, under which generation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageStatus {
    /// The reference as the spec writes it; while the spec's image is held, the one that
    /// keeps running.
    pub reference: String,
    /// The manifest digest it resolved to and that runs (`sha256:<hex>`); empty only for
    /// a held image's predecessor that was never resolved.
    pub digest: String,
    /// When the digest was last verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// One entry per governing policy, in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["policy"]))]
    pub verified_by: Vec<ImageVerification>,
}

/// One policy's verdict on an image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageVerification {
    /// The ImagePolicy's name.
    pub policy: String,
    /// Its `metadata.generation` when it verified.
    pub generation: i64,
    /// `Enforce` or `Audit`.
    pub mode: String,
    /// The name of the key (`keys[].name`) whose signature verified, or none when the
    /// image is not signed by any of the policy's keys (then only under `Audit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

pub(crate) fn replicas_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": MIN_REPLICAS,
        "maximum": MAX_REPLICAS,
        "default": DEFAULT_REPLICAS,
    })
}

/// A container's `ResourceRequirements` as Kubernetes defines it, with the bounds of
/// [`LIST_BOUNDS`] on its maps and list: the API server holds them too.
pub(crate) fn resources_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema =
        generator.subschema_for::<Option<k8s_openapi::api::core::v1::ResourceRequirements>>();
    for (field, keyword) in [
        ("limits", "maxProperties"),
        ("requests", "maxProperties"),
        ("claims", "maxItems"),
    ] {
        let bound = list_bound(&format!("spec.resources.{field}"));
        if let (Some(property), Some(bound)) = (
            schema
                .get_mut("properties")
                .and_then(|p| p.get_mut(field))
                .and_then(|p| p.as_object_mut()),
            bound,
        ) {
            property.insert(keyword.to_owned(), bound.into());
        }
    }
    schema
}

pub(crate) fn port_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": MIN_PORT,
        "maximum": MAX_PORT,
        "default": DEFAULT_PORT,
    })
}

/// Declares one version's `AppServiceSpec` and, through kube's derive, its `AppService`:
/// what every version shares (group, names, scale subresource, printer columns, the
/// name rule; the `image`, `replicas`, `env`, `resources` and `database` fields) is
/// written here once. A version gives its `version`, the kind's and the spec's docs, its own
/// object-level rule, the fields between `replicas` and `env`, and the `database` field's
/// documentation; field order is the version's wire order.
macro_rules! app_service_spec {
    (
        version = $version:literal,
        doc = $doc:literal,
        spec_doc = $spec_doc:literal,
        $(#[$spec_attr:meta])*
        fields { $($fields:tt)* }
        $(#[doc = $database_doc:literal])*
    ) => {
        #[doc = $spec_doc]
        // Several printer columns share a type; clippy reads them as one repeated attribute.
        #[allow(clippy::duplicated_attributes)]
        #[derive(
            kube::CustomResource, kube::KubeSchema, serde::Serialize, serde::Deserialize,
            Clone, Debug, Default, PartialEq,
        )]
        #[kube(
            group = "platform.example.com",
            version = $version,
            kind = "AppService",
            plural = "appservices",
            shortname = "appsrv",
            category = "platform",
            namespaced,
            status = "crate::shared::AppServiceStatus",
            derive = "PartialEq",
            derive = "Default",
            doc = $doc,
            scale(
                spec_replicas_path = ".spec.replicas",
                status_replicas_path = ".status.readyReplicas",
                label_selector_path = ".status.selector"
            ),
            validation = Rule::new(format!("size(self.metadata.name) <= {} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')", crate::limits::MAX_NAME_LEN))
                .message(kube::core::Message::Message(format!("metadata.name must be a DNS-1035 label of at most {} characters (it names the Service)", crate::limits::MAX_NAME_LEN))),
            printcolumn(
                name = "Ready",
                type_ = "string",
                description = "Status of the Ready condition",
                json_path = ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            printcolumn(
                name = "Replicas",
                type_ = "integer",
                description = "Desired replicas",
                json_path = ".spec.replicas"
            ),
            printcolumn(
                name = "Canary",
                type_ = "string",
                description = "Image of the canary, while one runs",
                json_path = ".status.canary.image"
            ),
            printcolumn(
                name = "Endpoint",
                type_ = "string",
                description = "In-cluster URL of the Service",
                json_path = ".status.endpoint"
            ),
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        $(#[$spec_attr])*
        #[serde(rename_all = "camelCase")]
        pub struct AppServiceSpec {
            /// OCI image reference to run, for example `registry.example.com/checkout:v3.4.0` or
            /// `registry.example.com/checkout@sha256:<digest>`. Pin a tag or a digest: an image
            /// without a tag, or with `:latest`, is accepted with a warning.
            #[schemars(length(min = 1, max = crate::limits::MAX_IMAGE_LEN))]
            pub image: String,

            /// Number of Pods to run, from 0 to 1000. Defaults to 1. Also settable through the
            /// `scale` subresource (`kubectl scale appservice/<name> --replicas=N`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(schema_with = "crate::shared::replicas_schema")]
            pub replicas: Option<i32>,

            $($fields)*

            /// Environment variables for the container. Names are unique C identifiers
            /// (`[A-Za-z_][A-Za-z0-9_]*`); each sets either `value` or `valueFrom`.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(
                length(max = crate::limits::MAX_ENV),
                extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
            )]
            pub env: Vec<crate::shared::EnvVar>,

            /// Compute resources (CPU, memory) requested by and limited for the container.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(schema_with = "crate::shared::resources_schema")]
            pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,

            $(#[doc = $database_doc])*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub database: Option<DatabaseSpec>,
        }
    };
}
pub(crate) use app_service_spec;
