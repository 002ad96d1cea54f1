//! The `AppService` API, version `v1alpha1`: one `port`, and `database: {enabled, class}`.
//! Still served; the API server stores `v1beta1` and converts through the webhook's
//! `/convert` ([`crate::conversion`]). The CRD schema annotations make the API server
//! enforce the same rules as `crate::validation` (which validates a `v1alpha1` object by
//! converting it to the hub).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{DEFAULT_PORT, DEFAULT_REPLICAS};
use crate::shared::port_schema;

crate::shared::app_service_spec! {
    version = "v1alpha1",
    doc = "An application: an OCI image run as a Deployment of `replicas` Pods behind a Service on `port`, optionally with a PostgreSQL database.",
    spec_doc = "The desired state of an AppService: what to run and how many copies of it.",
    #[x_kube(validation = Rule::new(
        "!(has(oldSelf.database) && oldSelf.database.enabled && has(self.database) && self.database.enabled) || (has(self.database.class) && has(oldSelf.database.class) && self.database.class == oldSelf.database.class)"
    ).message("database.class is immutable while the database is enabled").field_path(".database.class"))]
    fields {
        /// TCP port the container listens on and the Service exposes, from 1 to 65535.
        /// Defaults to 8080.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "port_schema")]
        pub port: Option<i32>,
    }
    /// A PostgreSQL database provisioned for this application. When enabled, the
    /// connection URL is passed to the container as `DATABASE_URL`.
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
    #[schemars(length(min = 1, max = crate::limits::MAX_CLASS_LEN))]
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
