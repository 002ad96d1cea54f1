//! The `AppService` API, version `v1alpha1`: one `port`, and `database: {enabled, class}`.
//! Still served; the API server stores `v1beta1` and converts through the webhook's
//! `/convert` ([`crate::conversion`]). The CRD schema annotations make the API server
//! enforce the same rules as `crate::validation` (which validates a `v1alpha1` object by
//! converting it to the hub).

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::defaults::{DEFAULT_PORT, DEFAULT_REPLICAS};
use crate::types::{AppServiceStatus, EnvVar, port_schema, replicas_schema};

/// The desired state of an AppService: what to run and how many copies of it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "platform.example.com",
    version = "v1alpha1",
    kind = "AppService",
    plural = "appservices",
    shortname = "appsrv",
    category = "platform",
    namespaced,
    status = "AppServiceStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "An application: an OCI image run as a Deployment of `replicas` Pods behind a Service on `port`, optionally with a PostgreSQL database.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.readyReplicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1035 label of at most 63 characters (it names the Service)"),
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
#[x_kube(validation = Rule::new(
    "!(has(oldSelf.database) && oldSelf.database.enabled && has(self.database) && self.database.enabled) || (has(self.database.class) && has(oldSelf.database.class) && self.database.class == oldSelf.database.class)"
).message("database.class is immutable while the database is enabled").field_path(".database.class"))]
#[serde(rename_all = "camelCase")]
pub struct AppServiceSpec {
    /// OCI image reference to run, for example `registry.example.com/checkout:v3.4.0` or
    /// `registry.example.com/checkout@sha256:<digest>`. Pin a tag or a digest: an image
    /// without a tag, or with `:latest`, is accepted with a warning.
    #[schemars(length(min = 1, max = crate::types::MAX_IMAGE_LEN))]
    pub image: String,

    /// Number of Pods to run, from 0 to 1000. Defaults to 1. Also settable through the
    /// `scale` subresource (`kubectl scale appservice/<name> --replicas=N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "replicas_schema")]
    pub replicas: Option<i32>,

    /// TCP port the container listens on and the Service exposes, from 1 to 65535.
    /// Defaults to 8080.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "port_schema")]
    pub port: Option<i32>,

    /// Environment variables for the container. Names are unique C identifiers
    /// (`[A-Za-z_][A-Za-z0-9_]*`); each sets either `value` or `valueFrom`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = crate::types::MAX_ENV),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub env: Vec<EnvVar>,

    /// Compute resources (CPU, memory) requested by and limited for the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// A PostgreSQL database provisioned for this application. When enabled, the
    /// connection URL is passed to the container as `DATABASE_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseSpec>,
}

/// Database request of an AppService.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!self.enabled || has(self.class)").message("database.class is required when database.enabled is true").field_path(".class").reason(kube::core::Reason::FieldValueRequired))]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Whether to provision a database. Defaults to false.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub enabled: bool,

    /// Database class: the name of a cluster-admin configured PostgreSQL server. Required
    /// when `enabled` is true; cannot change while the database is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::types::MAX_CLASS_LEN))]
    pub class: Option<String>,
}

impl AppServiceSpec {
    /// Replicas to run, with the default applied.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// Port to serve on, with the default applied.
    pub fn port(&self) -> i32 {
        self.port.unwrap_or(DEFAULT_PORT)
    }

    /// The database class when a database is requested.
    pub fn database_class(&self) -> Option<&str> {
        self.database
            .as_ref()
            .filter(|db| db.enabled)
            .and_then(|db| db.class.as_deref())
    }
}
