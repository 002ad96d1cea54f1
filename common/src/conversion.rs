//! Conversion between `v1alpha1` and `v1beta1` AppServices, as pure functions; the
//! webhook's `/convert` calls [`convert_object`] for each object of a ConversionReview.
//!
//! Lossless in both directions. What one version cannot express travels in an annotation
//! that only conversion writes and reads:
//!
//! * `v1beta1 → v1alpha1`: `port` is the first port's number; when the ports are anything
//!   but `[{name: http, port: <port>, protocol: TCP}]`, the whole list is kept in
//!   [`ANNOTATION_V1BETA1_PORTS`]. Back in `v1beta1`, that list is restored with the first
//!   port's number taken from `port`: a `v1alpha1` client that edits `port` changes the
//!   first port, and the other ports, names and protocols survive.
//! * `v1beta1 → v1alpha1`: `podSecurity`, which `v1alpha1` has no field for, is kept in
//!   [`ANNOTATION_V1BETA1_POD_SECURITY`] whenever it is present, and restored as it was.
//!   A `v1alpha1` object without it has the defaults (the `Restricted` profile).
//! * `v1beta1 → v1alpha1`: `rollout` likewise, in [`ANNOTATION_V1BETA1_ROLLOUT`]; a
//!   `v1alpha1` object without it rolls out with the Deployment's defaults.
//! * `v1beta1 → v1alpha1`: `canary` likewise, in [`ANNOTATION_V1BETA1_CANARY`], so a
//!   `v1alpha1` client's edit (of `replicas`, say) neither ends nor promotes a canary.
//! * `v1beta1 → v1alpha1`: `config` likewise, in [`ANNOTATION_V1BETA1_CONFIG`], and
//!   `autoscaling` in [`ANNOTATION_V1BETA1_AUTOSCALING`], and `expose` in
//!   [`ANNOTATION_V1BETA1_EXPOSE`].
//! * `v1alpha1 → v1beta1`: `{enabled: true, class}` is `{class}`; a database that is not
//!   enabled is no `database`, and the `v1alpha1` value is kept in
//!   [`ANNOTATION_V1ALPHA1_DATABASE`]. It is restored only while `v1beta1`'s `database` is
//!   still what it converted to, so a `v1beta1` client's edit wins over the stored value.
//!
//! Each annotation is removed by the conversion back, so it is never seen in the version
//! it was written for; an annotation that does not parse (edited by hand) is ignored.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::defaults::DEFAULT_PORT;
use crate::names::{
    ANNOTATION_V1ALPHA1_DATABASE, ANNOTATION_V1BETA1_AUTOSCALING, ANNOTATION_V1BETA1_CANARY,
    ANNOTATION_V1BETA1_CONFIG, ANNOTATION_V1BETA1_EXPOSE, ANNOTATION_V1BETA1_POD_SECURITY,
    ANNOTATION_V1BETA1_PORTS, ANNOTATION_V1BETA1_ROLLOUT, GROUP,
};
use crate::{v1alpha1, v1beta1};

/// The versions of the AppService API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1alpha1,
    V1beta1,
}

impl Version {
    /// `platform.example.com/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            Version::V1alpha1 => "platform.example.com/v1alpha1",
            Version::V1beta1 => "platform.example.com/v1beta1",
        }
    }

    /// The version alone (`v1alpha1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1alpha1 => "v1alpha1",
            Version::V1beta1 => "v1beta1",
        }
    }

    /// The version named by a full `apiVersion` (`platform.example.com/v1beta1`).
    pub fn from_api_version(api_version: &str) -> Option<Self> {
        let (group, version) = api_version.split_once('/')?;
        if group != GROUP {
            return None;
        }
        Self::from_version(version)
    }

    /// The version named by a bare version (`v1beta1`).
    pub fn from_version(version: &str) -> Option<Self> {
        match version {
            "v1alpha1" => Some(Version::V1alpha1),
            "v1beta1" => Some(Version::V1beta1),
            _ => None,
        }
    }
}

/// Why an object could not be converted.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConversionError {
    #[error("object is not a JSON object")]
    NotAnObject,
    #[error("unsupported apiVersion {0:?}: expected platform.example.com/v1alpha1 or v1beta1")]
    UnsupportedVersion(String),
    #[error("kind {0:?} is not AppService")]
    WrongKind(String),
    #[error("object is not a valid {version} AppService: {reason}")]
    Invalid {
        version: &'static str,
        reason: String,
    },
}

/// `v1alpha1 → v1beta1`.
pub fn to_v1beta1(app: &v1alpha1::AppService) -> v1beta1::AppService {
    let mut metadata = app.metadata.clone();
    let saved_ports: Option<Vec<v1beta1::AppPort>> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_PORTS)
            .and_then(|json| serde_json::from_str(&json).ok())
            .filter(|ports: &Vec<v1beta1::AppPort>| !ports.is_empty());
    let pod_security: Option<v1beta1::PodSecurity> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_POD_SECURITY)
            .and_then(|json| serde_json::from_str(&json).ok());
    let rollout: Option<v1beta1::RolloutSpec> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_ROLLOUT)
            .and_then(|json| serde_json::from_str(&json).ok());
    let canary: Option<v1beta1::CanarySpec> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_CANARY)
            .and_then(|json| serde_json::from_str(&json).ok());
    let config: Vec<v1beta1::ConfigSource> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_CONFIG)
            .and_then(|json| serde_json::from_str(&json).ok())
            .unwrap_or_default();
    let autoscaling: Option<v1beta1::AutoscalingSpec> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_AUTOSCALING)
            .and_then(|json| serde_json::from_str(&json).ok());
    let expose = take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_EXPOSE)
        .and_then(|json| parse_expose(&json));
    // Never seen in v1alpha1; a copy written there by hand is not carried over.
    take_annotation(&mut metadata.annotations, ANNOTATION_V1ALPHA1_DATABASE);

    let ports = match (app.spec.port, saved_ports) {
        (None, None) => Vec::new(),
        (Some(port), None) => vec![v1beta1::AppPort::http(port)],
        // `port` is the first port: an edit of it by a v1alpha1 client wins, the rest of
        // the list survives. Removing `port` means the default, as it does in v1alpha1.
        (port, Some(mut saved)) => {
            saved[0].port = port.unwrap_or(DEFAULT_PORT);
            saved
        }
    };

    let database = database_to_v1beta1(app.spec.database.as_ref());
    if let Some(db) = &app.spec.database
        && database_to_v1alpha1(database.as_ref()).as_ref() != Some(db)
    {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1ALPHA1_DATABASE,
            to_json(db),
        );
    }
    normalize(&mut metadata.annotations);

    let spec = &app.spec;
    v1beta1::AppService {
        metadata,
        spec: v1beta1::AppServiceSpec {
            image: spec.image.clone(),
            replicas: spec.replicas,
            ports,
            pod_security,
            rollout,
            canary,
            config,
            autoscaling,
            expose,
            env: spec.env.clone(),
            resources: spec.resources.clone(),
            database,
        },
        status: app.status.clone(),
    }
}

/// The hub's `spec.expose` of a `v1alpha1` object, as [`to_v1beta1`] reads it from
/// [`ANNOTATION_V1BETA1_EXPOSE`], without converting the rest (the webhook judges the host
/// names of every write).
pub fn v1beta1_expose(app: &v1alpha1::AppService) -> Option<v1beta1::ExposeSpec> {
    app.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_V1BETA1_EXPOSE)
        .and_then(|json| parse_expose(json))
}

/// `expose` as its annotation carries it; `None` when it does not parse (edited by hand).
fn parse_expose(json: &str) -> Option<v1beta1::ExposeSpec> {
    serde_json::from_str(json).ok()
}

/// `v1beta1 → v1alpha1`.
pub fn to_v1alpha1(app: &v1beta1::AppService) -> v1alpha1::AppService {
    let mut metadata = app.metadata.clone();
    let saved_database: Option<v1alpha1::DatabaseSpec> =
        take_annotation(&mut metadata.annotations, ANNOTATION_V1ALPHA1_DATABASE)
            .and_then(|json| serde_json::from_str(&json).ok());
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_PORTS);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_POD_SECURITY);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_ROLLOUT);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_CANARY);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_CONFIG);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_AUTOSCALING);
    take_annotation(&mut metadata.annotations, ANNOTATION_V1BETA1_EXPOSE);
    if let Some(expose) = &app.spec.expose {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_EXPOSE,
            to_json(expose),
        );
    }
    if let Some(autoscaling) = &app.spec.autoscaling {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_AUTOSCALING,
            to_json(autoscaling),
        );
    }

    let spec = &app.spec;
    if !spec.config.is_empty() {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_CONFIG,
            to_json(&spec.config),
        );
    }
    if let Some(security) = &spec.pod_security {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_POD_SECURITY,
            to_json(security),
        );
    }
    if let Some(rollout) = &spec.rollout {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_ROLLOUT,
            to_json(rollout),
        );
    }
    if let Some(canary) = &spec.canary {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_CANARY,
            to_json(canary),
        );
    }
    let port = spec.ports.first().map(|p| p.port);
    if let Some(first) = spec.ports.first()
        && spec.ports != [v1beta1::AppPort::http(first.port)]
    {
        set_annotation(
            &mut metadata.annotations,
            ANNOTATION_V1BETA1_PORTS,
            to_json(&spec.ports),
        );
    }
    // The saved v1alpha1 value only while v1beta1's database is still what it became.
    let database = match saved_database {
        Some(saved) if database_to_v1beta1(Some(&saved)) == spec.database => Some(saved),
        _ => database_to_v1alpha1(spec.database.as_ref()),
    };
    normalize(&mut metadata.annotations);

    v1alpha1::AppService {
        metadata,
        spec: v1alpha1::AppServiceSpec {
            image: spec.image.clone(),
            replicas: spec.replicas,
            port,
            env: spec.env.clone(),
            resources: spec.resources.clone(),
            database,
        },
        status: app.status.clone(),
    }
}

fn database_to_v1beta1(db: Option<&v1alpha1::DatabaseSpec>) -> Option<v1beta1::DatabaseSpec> {
    db.filter(|db| db.enabled).map(|db| v1beta1::DatabaseSpec {
        // `enabled` without a class is invalid in both versions; validation says so.
        class: db.class.clone().unwrap_or_default(),
    })
}

fn database_to_v1alpha1(db: Option<&v1beta1::DatabaseSpec>) -> Option<v1alpha1::DatabaseSpec> {
    db.map(|db| v1alpha1::DatabaseSpec {
        enabled: true,
        class: Some(db.class.clone()),
    })
}

/// Converts one AppService, as the API server sends it in a ConversionReview, to
/// `desired`. Only `apiVersion`, `spec`, `status` and the conversion annotations change;
/// the rest of the object (metadata included) is returned exactly as it came.
pub fn convert_object(object: &Value, desired: Version) -> Result<Value, ConversionError> {
    let fields = object.as_object().ok_or(ConversionError::NotAnObject)?;
    let api_version = fields
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let from = Version::from_api_version(api_version)
        .ok_or_else(|| ConversionError::UnsupportedVersion(api_version.to_owned()))?;
    let kind = fields
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "AppService" {
        return Err(ConversionError::WrongKind(kind.to_owned()));
    }
    if from == desired {
        return Ok(object.clone());
    }
    let converted = match from {
        Version::V1alpha1 => {
            let app: v1alpha1::AppService = typed(object, from)?;
            serde_json::to_value(to_v1beta1(&app))
        }
        Version::V1beta1 => {
            let app: v1beta1::AppService = typed(object, from)?;
            serde_json::to_value(to_v1alpha1(&app))
        }
    }
    .map_err(|e| ConversionError::Invalid {
        version: from.as_str(),
        reason: e.to_string(),
    })?;
    let mut out = fields.clone();
    out.insert(
        "apiVersion".to_owned(),
        Value::String(desired.api_version().to_owned()),
    );
    for field in ["spec", "status"] {
        match converted.get(field) {
            Some(value) => out.insert(field.to_owned(), value.clone()),
            None => out.remove(field),
        };
    }
    if let Some(Value::Object(metadata)) = out.get_mut("metadata") {
        match converted.pointer("/metadata/annotations") {
            Some(annotations) => {
                metadata.insert("annotations".to_owned(), annotations.clone());
            }
            None => {
                metadata.remove("annotations");
            }
        }
    }
    Ok(Value::Object(out))
}

fn typed<T: DeserializeOwned>(object: &Value, version: Version) -> Result<T, ConversionError> {
    serde_path_to_error::deserialize(object).map_err(|e| ConversionError::Invalid {
        version: version.as_str(),
        reason: {
            let path = e.path().to_string();
            if path == "." {
                e.inner().to_string()
            } else {
                format!("{path}: {}", e.inner())
            }
        },
    })
}

fn take_annotation(
    annotations: &mut Option<BTreeMap<String, String>>,
    key: &str,
) -> Option<String> {
    annotations.as_mut().and_then(|a| a.remove(key))
}

fn set_annotation(annotations: &mut Option<BTreeMap<String, String>>, key: &str, value: String) {
    annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value);
}

/// An empty map is no map: the API server drops it, so the round trip must too.
fn normalize(annotations: &mut Option<BTreeMap<String, String>>) {
    if annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        *annotations = None;
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Plain data of strings, integers and booleans: serializing it cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1beta1::{AppPort, Protocol};
    use serde_json::json;

    fn beta(ports: Vec<AppPort>, database: Option<&str>) -> v1beta1::AppService {
        v1beta1::AppService::new(
            "checkout",
            v1beta1::AppServiceSpec {
                image: "nginx:1.27".into(),
                replicas: Some(2),
                ports,
                database: database.map(|c| v1beta1::DatabaseSpec { class: c.into() }),
                ..Default::default()
            },
        )
    }

    fn two_ports() -> Vec<AppPort> {
        vec![
            AppPort {
                name: "web".into(),
                port: 8080,
                protocol: Some(Protocol::Tcp),
            },
            AppPort {
                name: "metrics".into(),
                port: 9090,
                protocol: Some(Protocol::Tcp),
            },
        ]
    }

    #[test]
    fn the_default_port_needs_no_annotation() {
        let alpha = to_v1alpha1(&beta(vec![AppPort::http(8080)], Some("pg")));
        assert_eq!(alpha.spec.port, Some(8080));
        assert_eq!(alpha.metadata.annotations, None);
        assert_eq!(
            alpha.spec.database,
            Some(v1alpha1::DatabaseSpec {
                enabled: true,
                class: Some("pg".into())
            })
        );
        assert_eq!(
            to_v1beta1(&alpha),
            beta(vec![AppPort::http(8080)], Some("pg"))
        );
    }

    #[test]
    fn a_v1alpha1_edit_of_port_changes_the_first_port_and_keeps_the_rest() {
        let original = beta(two_ports(), None);
        let mut alpha = to_v1alpha1(&original);
        assert_eq!(alpha.spec.port, Some(8080));
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert!(saved[ANNOTATION_V1BETA1_PORTS].contains("metrics"));
        alpha.spec.port = Some(8081);
        alpha.spec.image = "nginx:1.28".into();
        let back = to_v1beta1(&alpha);
        let mut expected = original;
        expected.spec.ports[0].port = 8081;
        expected.spec.image = "nginx:1.28".into();
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
    }

    #[test]
    fn a_disabled_database_survives_v1beta1_and_a_v1beta1_edit_wins() {
        let mut alpha = to_v1alpha1(&beta(vec![], None));
        alpha.spec.database = Some(v1alpha1::DatabaseSpec {
            enabled: false,
            class: Some("small".into()),
        });
        let stored = to_v1beta1(&alpha);
        assert_eq!(stored.spec.database, None);
        assert_eq!(to_v1alpha1(&stored), alpha);
        // A v1beta1 client requests a database: its value wins over the saved one.
        let mut edited = stored.clone();
        edited.spec.database = Some(v1beta1::DatabaseSpec {
            class: "large".into(),
        });
        assert_eq!(
            to_v1alpha1(&edited).spec.database,
            Some(v1alpha1::DatabaseSpec {
                enabled: true,
                class: Some("large".into())
            })
        );
    }

    #[test]
    fn pod_security_survives_v1alpha1_and_a_plain_object_needs_no_annotation() {
        let mut original = beta(vec![AppPort::http(8080)], None);
        assert_eq!(to_v1alpha1(&original).metadata.annotations, None);
        original.spec.pod_security = Some(v1beta1::PodSecurity {
            profile: Some(v1beta1::SecurityProfile::Restricted),
            run_as_user: Some(10001),
            fs_group: Some(2000),
            ..Default::default()
        });
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_POD_SECURITY],
            r#"{"profile":"Restricted","runAsUser":10001,"fsGroup":2000}"#
        );
        // A v1alpha1 client edits what it sees; the ids survive.
        alpha.spec.replicas = Some(5);
        let back = to_v1beta1(&alpha);
        let mut expected = original.clone();
        expected.spec.replicas = Some(5);
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
        // Edited by hand into something else: ignored, the defaults apply.
        alpha
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                ANNOTATION_V1BETA1_POD_SECURITY.into(),
                "{\"runAsUser\":".into(),
            );
        assert_eq!(to_v1beta1(&alpha).spec.pod_security, None);
    }

    #[test]
    fn rollout_survives_v1alpha1_both_ways() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let mut original = beta(vec![AppPort::http(8080)], None);
        original.spec.rollout = Some(v1beta1::RolloutSpec {
            max_surge: Some(IntOrString::Int(0)),
            max_unavailable: Some(IntOrString::String("50%".into())),
        });
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_ROLLOUT],
            r#"{"maxSurge":0,"maxUnavailable":"50%"}"#
        );
        // v1alpha1 → v1beta1 → v1alpha1 is the identity too.
        assert_eq!(to_v1alpha1(&to_v1beta1(&alpha)), alpha);
        // A v1alpha1 client edits what it sees; the rollout survives, the annotation goes.
        alpha.spec.image = "nginx:1.28".into();
        let back = to_v1beta1(&alpha);
        let mut expected = original.clone();
        expected.spec.image = "nginx:1.28".into();
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
        // A v1beta1 edit that removes it removes it from v1alpha1's view as well.
        let mut removed = back;
        removed.spec.rollout = None;
        assert_eq!(to_v1alpha1(&removed).metadata.annotations, None);
        // Edited by hand into something else: ignored, the Deployment's defaults apply.
        alpha
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_V1BETA1_ROLLOUT.into(), "{\"maxSurge\":".into());
        assert_eq!(to_v1beta1(&alpha).spec.rollout, None);
    }

    #[test]
    fn a_canary_survives_v1alpha1_both_ways() {
        let mut original = beta(vec![AppPort::http(8080)], None);
        original.spec.replicas = Some(4);
        original.spec.canary = Some(v1beta1::CanarySpec {
            image: "nginx:1.28".into(),
            replicas: Some(1),
        });
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_CANARY],
            r#"{"image":"nginx:1.28","replicas":1}"#
        );
        assert_eq!(to_v1alpha1(&to_v1beta1(&alpha)), alpha);
        // A v1alpha1 client scales: the canary runs on, neither promoted nor aborted.
        alpha.spec.replicas = Some(6);
        let back = to_v1beta1(&alpha);
        let mut expected = original.clone();
        expected.spec.replicas = Some(6);
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
        // Aborted in v1beta1: gone from v1alpha1's annotations too.
        let mut aborted = back;
        aborted.spec.canary = None;
        assert_eq!(to_v1alpha1(&aborted).metadata.annotations, None);
    }

    #[test]
    fn autoscaling_survives_v1alpha1_both_ways() {
        let mut original = beta(vec![AppPort::http(8080)], None);
        original.spec.autoscaling = Some(v1beta1::AutoscalingSpec {
            min_replicas: Some(2),
            max_replicas: 8,
            target_cpu_utilization_percentage: Some(60),
        });
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_AUTOSCALING],
            r#"{"minReplicas":2,"maxReplicas":8,"targetCPUUtilizationPercentage":60}"#
        );
        // The autoscaler scales through v1alpha1's /scale: the bounds stay.
        alpha.spec.replicas = Some(5);
        let back = to_v1beta1(&alpha);
        let mut expected = original.clone();
        expected.spec.replicas = Some(5);
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
    }

    #[test]
    fn expose_survives_v1alpha1_both_ways() {
        let mut original = beta(vec![AppPort::http(8080)], None);
        original.spec.expose = Some(v1beta1::ExposeSpec {
            hostnames: vec!["shop.apps.example.com".into()],
            paths: vec!["/api".into()],
            port: Some("http".into()),
            tls: Some(v1beta1::ExposeTls {
                secret_name: Some("shop-tls".into()),
                issuer_ref: None,
            }),
        });
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_EXPOSE],
            r#"{"hostnames":["shop.apps.example.com"],"paths":["/api"],"port":"http","tls":{"secretName":"shop-tls"}}"#
        );
        assert_eq!(to_v1beta1(&alpha), original);
        assert_eq!(v1beta1_expose(&alpha), original.spec.expose);
        // A v1alpha1 client's edit of another field keeps it exposed.
        alpha.spec.replicas = Some(3);
        let back = to_v1beta1(&alpha);
        assert_eq!(back.spec.expose, original.spec.expose);
        assert_eq!(back.metadata.annotations, None);
        // Removed in v1beta1: gone from v1alpha1's annotations too.
        let mut hidden = back;
        hidden.spec.expose = None;
        assert_eq!(to_v1alpha1(&hidden).metadata.annotations, None);
        assert_eq!(v1beta1_expose(&to_v1alpha1(&hidden)), None);
        // An annotation edited by hand into something else is no expose, as in to_v1beta1.
        let mut edited = to_v1alpha1(&original);
        edited
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_V1BETA1_EXPOSE.to_owned(), "{".to_owned());
        assert_eq!(v1beta1_expose(&edited), None);
        assert_eq!(to_v1beta1(&edited).spec.expose, None);
    }

    #[test]
    fn config_survives_v1alpha1_both_ways() {
        let mut original = beta(vec![AppPort::http(8080)], None);
        original.spec.config = vec![
            v1beta1::ConfigSource {
                config_map: Some("settings".into()),
                ..Default::default()
            },
            v1beta1::ConfigSource {
                secret: Some("keys".into()),
                mount_path: Some("/etc/keys".into()),
                ..Default::default()
            },
        ];
        let mut alpha = to_v1alpha1(&original);
        let saved = alpha.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            saved[ANNOTATION_V1BETA1_CONFIG],
            r#"[{"configMap":"settings"},{"secret":"keys","mountPath":"/etc/keys"}]"#
        );
        assert_eq!(to_v1alpha1(&to_v1beta1(&alpha)), alpha);
        // A v1alpha1 client edits the image: the config survives.
        alpha.spec.image = "nginx:1.29".into();
        let back = to_v1beta1(&alpha);
        let mut expected = original.clone();
        expected.spec.image = "nginx:1.29".into();
        assert_eq!(back, expected);
        assert_eq!(back.metadata.annotations, None);
        let mut none = back;
        none.spec.config.clear();
        assert_eq!(to_v1alpha1(&none).metadata.annotations, None);
    }

    #[test]
    fn a_corrupt_annotation_is_ignored() {
        let mut alpha = to_v1alpha1(&beta(two_ports(), None));
        alpha
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_V1BETA1_PORTS.into(), "[{\"name\":".into());
        let back = to_v1beta1(&alpha);
        assert_eq!(back.spec.ports, vec![AppPort::http(8080)]);
        assert_eq!(back.metadata.annotations, None);
    }

    #[test]
    fn convert_object_keeps_metadata_and_reports_bad_input() {
        let object = json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "AppService",
            "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": "7",
                         "creationTimestamp": "2025-01-02T03:04:05Z", "generation": 3,
                         "annotations": {"team": "x"}},
            "spec": {"image": "nginx:1.27", "port": 9000, "database": {"enabled": false}},
            "status": {"observedGeneration": 3, "endpoint": "http://a.n.svc:9000"}
        });
        let beta = convert_object(&object, Version::V1beta1).unwrap();
        assert_eq!(beta["apiVersion"], "platform.example.com/v1beta1");
        assert_eq!(
            beta["spec"]["ports"],
            json!([{"name": "http", "port": 9000, "protocol": "TCP"}])
        );
        assert_eq!(beta["spec"].get("database"), None);
        assert_eq!(beta["metadata"]["uid"], "u-1");
        assert_eq!(
            beta["metadata"]["creationTimestamp"],
            "2025-01-02T03:04:05Z"
        );
        assert_eq!(beta["metadata"]["annotations"]["team"], "x");
        assert_eq!(beta["status"], object["status"]);
        let back = convert_object(&beta, Version::V1alpha1).unwrap();
        assert_eq!(back, object);
        // Same version: untouched.
        assert_eq!(convert_object(&object, Version::V1alpha1).unwrap(), object);

        let err = convert_object(
            &json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                    "metadata": {}, "spec": {"image": "x", "port": "eighty"}}),
            Version::V1beta1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("spec.port"), "{err}");
        assert_eq!(
            convert_object(&json!([]), Version::V1beta1),
            Err(ConversionError::NotAnObject)
        );
        assert!(matches!(
            convert_object(
                &json!({"apiVersion": "v1", "kind": "Pod"}),
                Version::V1beta1
            ),
            Err(ConversionError::UnsupportedVersion(_))
        ));
    }
}
