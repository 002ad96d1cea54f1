//! The `DatabaseClass` API (`platform.example.com/v1alpha1`, cluster-scoped): a PostgreSQL
//! server that cluster admins offer to AppServices, like a StorageClass offers storage.
//!
//! An AppService names a class in `spec.database.class`; the controller connects to the
//! class's server with the admin credentials from a Secret in the operator's namespace,
//! creates a role and a database for the AppService, and on deletion drops them or keeps
//! them, as `deletionPolicy` says.
//!
//! A class is a trust boundary between cluster admins and tenants: the admin Secret it
//! names must opt in ([`ADMIN_SECRET_LABEL`]), it may be limited to some namespaces
//! (`allowedNamespaces`), plain TCP must be acknowledged (`tls.insecureAcknowledged`),
//! and each tenant role gets a connection limit (`connectionLimit`). [`refusal`] and
//! [`AllowedNamespaces::allows`] are the rules; the controller applies them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::{Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::names::DEFAULT_CLASS_ANNOTATION;
/// Default PostgreSQL port.
pub const DEFAULT_PG_PORT: i32 = 5432;
/// Default keys of the admin credentials Secret.
pub const DEFAULT_USERNAME_KEY: &str = "username";
pub const DEFAULT_PASSWORD_KEY: &str = "password";
/// Default key of the CA certificate in a Secret or ConfigMap.
pub const DEFAULT_CA_KEY: &str = "ca.crt";
/// Condition type on a class: the controller could log in to the server (and the class
/// is usable: its spec and admin Secret pass the rules of this module).
pub const REACHABLE: &str = "Reachable";
pub use crate::names::ADMIN_SECRET_LABEL;
/// Connections each tenant role may hold at once unless the class says otherwise.
pub const DEFAULT_CONNECTION_LIMIT: i32 = 10;
/// Upper bound of `connectionLimit` (PostgreSQL's own `max_connections` ceiling is far
/// above any sane share of one server).
pub const MAX_CONNECTION_LIMIT: i32 = 10_000;
/// Bounds of `allowedNamespaces.names`.
pub const MAX_ALLOWED_NAMESPACES: usize = 256;

/// A PostgreSQL server offered to AppServices.
// Several printer columns share a type; clippy reads them as one repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "platform.example.com",
    version = "v1alpha1",
    kind = "DatabaseClass",
    plural = "databaseclasses",
    shortname = "dbclass",
    category = "platform",
    status = "DatabaseClassStatus",
    derive = "PartialEq",
    doc = "A PostgreSQL server that AppServices get databases on (cluster-scoped, configured by cluster admins). Mark one default with the annotation databaseclass.platform.example.com/is-default-class: \"true\".",
    printcolumn(
        name = "Host",
        type_ = "string",
        description = "PostgreSQL server",
        json_path = ".spec.host"
    ),
    printcolumn(
        name = "Port",
        type_ = "integer",
        description = "PostgreSQL port",
        json_path = ".spec.port"
    ),
    printcolumn(
        name = "TLS",
        type_ = "string",
        description = "TLS mode",
        json_path = ".spec.tls.mode"
    ),
    printcolumn(
        name = "Policy",
        type_ = "string",
        description = "What happens to a database when its AppService is deleted",
        json_path = ".spec.deletionPolicy"
    ),
    printcolumn(
        name = "Reachable",
        type_ = "string",
        description = "Status of the Reachable condition",
        json_path = ".status.conditions[?(@.type==\"Reachable\")].status"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        description = "Server version",
        json_path = ".status.serverVersion"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClassSpec {
    /// Host name or IP address of the PostgreSQL server, as both the controller and the
    /// applications reach it (it is written into each application's DATABASE_URL).
    #[schemars(length(min = 1, max = crate::types::MAX_SUBDOMAIN_LEN))]
    pub host: String,

    /// TCP port of the server. Defaults to 5432.
    #[serde(default = "default_port")]
    #[schemars(range(min = crate::types::MIN_PORT, max = crate::types::MAX_PORT), extend("default" = 5432))]
    pub port: i32,

    /// Transport security of connections to the server (required, so that choosing
    /// plain TCP is a decision someone wrote down).
    pub tls: DatabaseTls,

    /// Secret in the operator's namespace holding a PostgreSQL login that may create
    /// roles and databases (CREATEROLE and CREATEDB, or a superuser).
    pub admin_credentials: AdminCredentials,

    /// What happens to an AppService's role and database when the AppService is
    /// deleted or its database disabled: `Delete` drops both, `Retain` keeps them (the
    /// role loses LOGIN and its sessions are ended; the data stays). Defaults to Delete.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// What the controller's periodic scan does with databases and roles of AppServices
    /// that no longer exist (a finalizer removed by hand, a cluster restored from a
    /// backup): `Report` counts them (metric, Event on the class); `Drop` also drops
    /// each one found in two scans in a row. Retained ones (deletionPolicy Retain) are
    /// reported apart and never dropped. Defaults to Report. Use `Drop` only for a
    /// server no other cluster provisions on.
    #[serde(default)]
    pub orphan_policy: OrphanPolicy,

    /// Connections each AppService's role may hold at once (`CONNECTION LIMIT`), so one
    /// tenant cannot use up the server's connections. Applied when the role is created
    /// and put back when it drifts. Defaults to 10.
    #[serde(default = "default_connection_limit")]
    #[schemars(range(min = 1, max = MAX_CONNECTION_LIMIT), extend("default" = 10))]
    pub connection_limit: i32,

    /// Namespaces whose AppServices may use the class: those listed in `names` and
    /// those whose labels match `selector`. Absent: every namespace (a class for all
    /// tenants). An AppService elsewhere gets `DatabaseReady=False`,
    /// `DatabaseClassNotAllowed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<AllowedNamespaces>,
}

fn default_port() -> i32 {
    DEFAULT_PG_PORT
}

fn default_connection_limit() -> i32 {
    DEFAULT_CONNECTION_LIMIT
}

/// Which namespaces may use a class.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Namespaces allowed by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ALLOWED_NAMESPACES), extend("x-kubernetes-list-type" = "set"))]
    pub names: Vec<String>,
    /// Namespaces allowed by their labels (an empty selector matches every namespace,
    /// as everywhere in Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

impl AllowedNamespaces {
    /// Whether the namespace may use the class. `labels` are the namespace's labels,
    /// needed only when it is not listed by name and a selector is set
    /// ([`Self::needs_labels`]); `None` then counts as no labels. A selector that does
    /// not parse allows nothing.
    pub fn allows(&self, namespace: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        if self.names.iter().any(|n| n == namespace) {
            return true;
        }
        let Some(selector) = &self.selector else {
            return false;
        };
        let Ok(selector) = Selector::try_from(selector.clone()) else {
            return false;
        };
        selector.matches(labels.unwrap_or(&BTreeMap::new()))
    }

    /// Whether [`Self::allows`] must see the namespace's labels to decide.
    pub fn needs_labels(&self, namespace: &str) -> bool {
        self.selector.is_some() && !self.names.iter().any(|n| n == namespace)
    }
}

/// Why a class may not be used at all (whoever asks), or `None`. The API server holds
/// the same rules for new writes (the CRD's CEL rules); the controller applies them to
/// every class it reads, including ones stored before a rule existed.
pub fn refusal(spec: &DatabaseClassSpec) -> Option<String> {
    if spec.tls.mode == TlsMode::Disable && !spec.tls.insecure_acknowledged {
        return Some(
            "tls.mode is disable (the admin password and all data would cross the network in clear text) and tls.insecureAcknowledged is not true".to_owned(),
        );
    }
    if spec.tls.mode == TlsMode::VerifyFull && spec.tls.ca.is_none() {
        return Some("tls.ca is required when tls.mode is verify-full".to_owned());
    }
    if let Some(selector) = spec
        .allowed_namespaces
        .as_ref()
        .and_then(|a| a.selector.clone())
        && let Err(e) = Selector::try_from(selector)
    {
        return Some(format!("allowedNamespaces.selector is not valid: {e}"));
    }
    None
}

/// TLS settings of a class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.mode != 'verify-full' || has(self.ca)").message("tls.ca is required when tls.mode is verify-full").field_path(".ca"))]
#[x_kube(validation = Rule::new("self.mode != 'disable' || (has(self.insecureAcknowledged) && self.insecureAcknowledged)").message("tls.mode disable sends the admin password and all data in clear text: set tls.insecureAcknowledged: true to confirm").field_path(".insecureAcknowledged"))]
#[serde(rename_all = "camelCase")]
pub struct DatabaseTls {
    /// `disable` (plain TCP), `require` (encrypted, the server is not authenticated) or
    /// `verify-full` (encrypted, the server's certificate must chain to `ca` and name
    /// `host`). Defaults to verify-full.
    #[serde(default)]
    pub mode: TlsMode,

    /// The CA that signed the server's certificate, from a Secret in the operator's
    /// namespace or a ConfigMap there. Required for verify-full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSource>,

    /// Must be `true` with `mode: disable`: the admin's password, each application's
    /// password and all data then cross the network in clear text, and someone has to
    /// say they accept that. Without it the class is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_acknowledged: bool,
}

/// TLS mode, named as libpq's `sslmode`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    #[serde(rename = "disable")]
    Disable,
    #[serde(rename = "require")]
    Require,
    #[default]
    #[serde(rename = "verify-full")]
    VerifyFull,
}

impl TlsMode {
    /// libpq's `sslmode` value.
    pub fn as_sslmode(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Require => "require",
            TlsMode::VerifyFull => "verify-full",
        }
    }
}

/// Where a PEM CA certificate is: exactly one of a Secret or a ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.secretRef) != has(self.configMapRef)").message("set exactly one of secretRef and configMapRef"))]
#[serde(rename_all = "camelCase")]
pub struct CaSource {
    /// A Secret in the operator's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<KeyRef>,
    /// A ConfigMap in the operator's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeyRef>,
}

/// A key of a Secret or ConfigMap in the operator's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the object.
    #[schemars(length(min = 1, max = crate::types::MAX_SUBDOMAIN_LEN))]
    pub name: String,
    /// Key holding the PEM certificate(s). Defaults to `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl KeyRef {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_CA_KEY)
    }
}

/// The admin login of a class.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdminCredentials {
    /// Name of the Secret in the operator's namespace. The Secret must carry the label
    /// `platform.example.com/database-admin: "true"`, or the class is not usable.
    #[schemars(length(min = 1, max = crate::types::MAX_SUBDOMAIN_LEN))]
    pub secret_name: String,
    /// Key of the user name. Defaults to `username`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_key: Option<String>,
    /// Key of the password. Defaults to `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_key: Option<String>,
}

impl AdminCredentials {
    pub fn username_key(&self) -> &str {
        self.username_key.as_deref().unwrap_or(DEFAULT_USERNAME_KEY)
    }
    pub fn password_key(&self) -> &str {
        self.password_key.as_deref().unwrap_or(DEFAULT_PASSWORD_KEY)
    }
}

/// What happens to a database when it is no longer wanted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeletionPolicy {
    /// Terminate its sessions, drop the database and the role.
    #[default]
    Delete,
    /// Keep the database and its data; the role loses LOGIN and its sessions are ended,
    /// so the credentials handed to the application stop working. An admin removes
    /// them (or grants LOGIN again).
    Retain,
}

/// What the orphan scan does with a database whose AppService is gone.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OrphanPolicy {
    /// Count and report them; never touch them.
    #[default]
    Report,
    /// Also drop the database and its role once two scans in a row found it orphaned.
    Drop,
}

/// What the controller last observed of the class's server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClassStatus {
    /// The `metadata.generation` the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `server_version` reported by the server at the last successful login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,

    /// `Reachable`: whether the controller could log in with the admin credentials, and
    /// if not, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Whether an admin Secret with `labels` opted in to being a class's admin login.
pub fn admin_secret_opted_in(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(ADMIN_SECRET_LABEL))
        .is_some_and(|v| v == "true")
}

impl DatabaseClass {
    /// Whether AppServices of `namespace` (with `labels`, when needed) may use the class.
    pub fn allows_namespace(
        &self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        self.spec
            .allowed_namespaces
            .as_ref()
            .is_none_or(|a| a.allows(namespace, labels))
    }

    /// Whether the class carries the default-class annotation.
    pub fn is_default(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true")
    }
}

/// The default class among `classes`: the one marked default, by name when several are
/// (as for StorageClasses, several defaults are an admin error; picking the first name
/// keeps the choice stable).
pub fn default_class(classes: &[DatabaseClass]) -> Option<&DatabaseClass> {
    classes
        .iter()
        .filter(|c| c.is_default())
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn class(name: &str, default: Option<&str>) -> DatabaseClass {
        let mut c = DatabaseClass::new(
            name,
            serde_json::from_value(serde_json::json!({
                "host": "db", "adminCredentials": {"secretName": "admin"},
                "tls": {"mode": "verify-full", "ca": {"configMapRef": {"name": "ca"}}}
            }))
            .unwrap(),
        );
        c.metadata.annotations =
            default.map(|v| BTreeMap::from([(DEFAULT_CLASS_ANNOTATION.to_owned(), v.to_owned())]));
        c
    }

    #[test]
    fn defaults_of_a_minimal_spec() {
        let c = class("a", None);
        assert_eq!(c.spec.port, 5432);
        assert_eq!(c.spec.tls.mode, TlsMode::VerifyFull);
        assert_eq!(c.spec.deletion_policy, DeletionPolicy::Delete);
        assert_eq!(c.spec.admin_credentials.username_key(), "username");
        assert_eq!(c.spec.admin_credentials.password_key(), "password");
        assert_eq!(c.spec.connection_limit, DEFAULT_CONNECTION_LIMIT);
        assert_eq!(c.spec.orphan_policy, OrphanPolicy::Report);
        assert!(c.spec.allowed_namespaces.is_none());
        assert!(!c.spec.tls.insecure_acknowledged);
        assert_eq!(refusal(&c.spec), None);
        assert!(
            c.allows_namespace("anyone", None),
            "no list: every namespace"
        );
    }

    fn spec(tls: serde_json::Value) -> DatabaseClassSpec {
        serde_json::from_value(serde_json::json!({
            "host": "db", "adminCredentials": {"secretName": "admin"}, "tls": tls
        }))
        .unwrap()
    }

    #[test]
    fn plain_tcp_needs_an_acknowledgement() {
        let refused = refusal(&spec(serde_json::json!({"mode": "disable"}))).unwrap();
        assert!(refused.contains("insecureAcknowledged"), "{refused}");
        let refused = refusal(&spec(
            serde_json::json!({"mode": "disable", "insecureAcknowledged": false}),
        ));
        assert!(refused.is_some());
        assert_eq!(
            refusal(&spec(
                serde_json::json!({"mode": "disable", "insecureAcknowledged": true})
            )),
            None
        );
        assert_eq!(refusal(&spec(serde_json::json!({"mode": "require"}))), None);
        assert!(refusal(&spec(serde_json::json!({"mode": "verify-full"}))).is_some());
    }

    #[test]
    fn allowed_namespaces_by_name_and_selector() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let by_name: AllowedNamespaces =
            serde_json::from_value(serde_json::json!({"names": ["shop"]})).unwrap();
        assert!(by_name.allows("shop", None));
        assert!(!by_name.allows("other", Some(&labels(&[("team", "shop")]))));
        assert!(!by_name.needs_labels("other"));

        let by_label: AllowedNamespaces = serde_json::from_value(serde_json::json!({
            "names": ["legacy"],
            "selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod", "staging"]}]}
        }))
        .unwrap();
        assert!(by_label.allows("legacy", None));
        assert!(!by_label.needs_labels("legacy"));
        assert!(by_label.needs_labels("shop"));
        assert!(by_label.allows("shop", Some(&labels(&[("tier", "prod")]))));
        assert!(!by_label.allows("shop", Some(&labels(&[("tier", "dev")]))));
        assert!(!by_label.allows("shop", None));

        let everyone: AllowedNamespaces =
            serde_json::from_value(serde_json::json!({"selector": {}})).unwrap();
        assert!(everyone.allows("x", None), "an empty selector matches all");
        let nobody = AllowedNamespaces::default();
        assert!(!nobody.allows("x", Some(&labels(&[("a", "b")]))));

        let mut bad = spec(serde_json::json!({"mode": "require"}));
        bad.allowed_namespaces = Some(
            serde_json::from_value(serde_json::json!({
                "selector": {"matchExpressions": [{"key": "tier", "operator": "Sometimes"}]}
            }))
            .unwrap(),
        );
        assert!(refusal(&bad).unwrap().contains("selector"));
        assert!(!bad.allowed_namespaces.unwrap().allows("x", None));
    }

    #[test]
    fn admin_secrets_opt_in_by_label() {
        let l = |v: &str| BTreeMap::from([(ADMIN_SECRET_LABEL.to_owned(), v.to_owned())]);
        assert!(admin_secret_opted_in(Some(&l("true"))));
        assert!(!admin_secret_opted_in(Some(&l("yes"))));
        assert!(!admin_secret_opted_in(Some(&BTreeMap::new())));
        assert!(!admin_secret_opted_in(None));
    }

    #[test]
    fn default_class_is_the_annotated_one() {
        let classes = vec![
            class("b", Some("true")),
            class("a", Some("false")),
            class("c", Some("true")),
        ];
        assert_eq!(
            default_class(&classes).and_then(|c| c.metadata.name.as_deref()),
            Some("b")
        );
        assert!(default_class(&[class("x", None)]).is_none());
    }

    #[test]
    fn tls_modes_serialize_as_sslmode() {
        for mode in [TlsMode::Disable, TlsMode::Require, TlsMode::VerifyFull] {
            assert_eq!(
                serde_json::to_value(mode).unwrap(),
                serde_json::json!(mode.as_sslmode())
            );
        }
    }
}
