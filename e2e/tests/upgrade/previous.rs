//! The previous release's controller (main at 3937d7b, API `v1alpha1` only), as
//! much of it as the upgrade test needs: the children it creates for an AppService read
//! in `v1alpha1`. Copied from that release's `controller/src/desired.rs` and
//! `drift::desired_hash` over the `v1alpha1` types (which are that release's types), and
//! self-contained on purpose: later changes to the current builders, names or hashing
//! must not change it. `previous_children_match_the_golden_fixture` checks it against
//! what that release's own code produced (`fixtures/upgrade/previous-children.json`,
//! made by running its `desired_deployment`/`desired_service`/`set_hash`).
//!
//! The old controller decides "nothing to do" when a child's desired-hash annotation
//! equals the hash of what it builds and the live object has not drifted; a converted
//! object for which it builds byte-identical children therefore costs it no write.

use std::collections::BTreeMap;

use common::v1alpha1::AppService;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, PodSpec, PodTemplateSpec, Probe,
    SecretKeySelector, Service, ServicePort, ServiceSpec, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

/// The field manager the previous controller created children with.
pub const FIELD_MANAGER: &str = "appservice-controller";
/// The annotation carrying the hash of what the controller last applied.
pub const HASH: &str = "platform.example.com/desired-hash";

fn selector_labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/instance".to_owned(), app.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "appservice-operator".to_owned(),
        ),
    ])
}

fn child_labels(app: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(app);
    labels.insert("app.kubernetes.io/name".to_owned(), app.to_owned());
    labels
}

fn metadata(app: &AppService, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: app.metadata.namespace.clone(),
        labels: Some(child_labels(name)),
        owner_references: Some(vec![OwnerReference {
            api_version: "platform.example.com/v1alpha1".to_owned(),
            kind: "AppService".to_owned(),
            name: name.to_owned(),
            uid: app.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    }
}

/// The hash of a desired object, as the previous release computed it.
pub fn desired_hash<K: serde::Serialize>(desired: &K) -> String {
    let bytes = serde_json::to_vec(desired).unwrap_or_default();
    Sha256::digest(&bytes)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn with_hash(mut meta: ObjectMeta, hash: String) -> ObjectMeta {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(HASH.to_owned(), hash);
    meta
}

/// The Deployment the previous controller creates, hash annotation included.
pub fn deployment(app: &AppService) -> Deployment {
    let name = app.metadata.name.clone().unwrap_or_default();
    let spec = &app.spec;
    let port = spec.port.unwrap_or(8080);
    let mut env: Vec<EnvVar> = spec
        .env
        .iter()
        .map(|e| EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
            value_from: e.value_from.clone(),
        })
        .collect();
    if spec.database_class().is_some() {
        env.push(EnvVar {
            name: "DATABASE_URL".to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: format!("{name}-database"),
                    key: "DATABASE_URL".to_owned(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
        });
    }
    let container = Container {
        name: "app".to_owned(),
        image: Some(spec.image.clone()),
        ports: Some(vec![ContainerPort {
            name: Some("http".to_owned()),
            container_port: port,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        env: (!env.is_empty()).then_some(env),
        resources: spec.resources.clone().filter(|r| {
            r.limits.as_ref().is_some_and(|l| !l.is_empty())
                || r.requests.as_ref().is_some_and(|l| !l.is_empty())
                || r.claims.as_ref().is_some_and(|l| !l.is_empty())
        }),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port),
                ..TCPSocketAction::default()
            }),
            ..Probe::default()
        }),
        ..Container::default()
    };
    let mut d = Deployment {
        metadata: metadata(app, &name),
        spec: DeploymentSpec {
            replicas: Some(spec.replicas.unwrap_or(1)),
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(child_labels(&name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    };
    let hash = desired_hash(&d);
    d.metadata = with_hash(d.metadata, hash);
    d
}

/// The Service the previous controller creates, hash annotation included.
pub fn service(app: &AppService) -> Service {
    let name = app.metadata.name.clone().unwrap_or_default();
    let port = app.spec.port.unwrap_or(8080);
    let mut s = Service {
        metadata: metadata(app, &name),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&name)),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port,
                target_port: Some(IntOrString::Int(port)),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            type_: Some("ClusterIP".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    let hash = desired_hash(&s);
    s.metadata = with_hash(s.metadata, hash);
    s
}
