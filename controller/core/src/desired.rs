//! Desired state of an AppService's children, as pure functions of the AppService.
//!
//! The builders set only the fields the controller owns: server-side apply then leaves
//! everything else (defaults, other managers' fields) alone, and [`crate::drift`]
//! compares the live children with what they build.

use std::collections::BTreeMap;

use common::names::{
    canary_deployment_name, canary_labels, canary_selector_labels, child_labels, deployment_name,
    selector_labels, service_name,
};
use common::{AppService, Protocol};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec, Probe, Service, ServicePort,
    ServiceSpec, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::external::PodAdditions;
use crate::subject::Subject;

mod autoscaling;
mod config;
mod disruption;
mod exposure;
mod security;

pub use autoscaling::desired_autoscaler;
pub use disruption::desired_budget;
pub use exposure::{desired_certificate, desired_grant, desired_ingress, desired_route};

/// Name of the application container in the Pod template.
pub const CONTAINER_NAME: &str = "app";
/// `apiVersion` of the owner reference on children: the storage version (the hub).
///
/// The garbage collector resolves an owner reference through its `apiVersion`: one that
/// names a version the CRD no longer serves is never resolved, so the child is never
/// collected (and a foreground deletion of its owner never ends). Children therefore
/// name the version that stays served longest, the one every object is stored in.
/// Children made by earlier releases name `v1alpha1`; the controller re-points them with
/// one JSON patch the next time it looks at them ([`crate::drift`]), without touching
/// their hash or their Pod template. Which AppService a child belongs to is decided by
/// group, kind and uid, never by this string (`crate::owners`).
pub fn owner_api_version() -> String {
    format!("{}/{}", common::names::GROUP, common::crd::STORAGE_VERSION)
}

/// The owner `apiVersion` every release hashed its children with before owner
/// references moved to the storage version: [`crate::drift::desired_hash`] hashes with
/// it whatever the owner reference names, so the version is not part of "what the
/// AppService asks for" and the hashes of existing children stay valid.
pub const HASHED_OWNER_API_VERSION: &str = "platform.example.com/v1alpha1";

/// The controller owner reference children carry: `controller: true`, and
/// `blockOwnerDeletion` so foreground deletion of the AppService waits for them.
pub fn owner_reference(app: &Subject) -> OwnerReference {
    OwnerReference {
        api_version: owner_api_version(),
        kind: AppService::kind(&()).into_owned(),
        name: app.name().to_owned(),
        uid: app.uid().to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Metadata of a child named `name`: same namespace, child labels, our owner reference.
pub(crate) fn child_metadata(app: &Subject, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(app.namespace().to_owned()),
        labels: Some(child_labels(app.name())),
        owner_references: Some(vec![owner_reference(app)]),
        ..ObjectMeta::default()
    }
}

/// The Deployment that runs an AppService: `replicas` Pods of one container listening on
/// each of `ports`, ready once the first TCP port accepts connections, running as
/// `podSecurity` says (Pod Security `restricted` by default: `desired/security.rs`).
///
/// `pod` is what the providers add ([`PodAdditions`]: the database's `DATABASE_URL`,
/// libpq variables, CA and revision, say). With nothing added, the Deployment is what it
/// always was.
///
/// While a canary runs, this Deployment runs `replicas - canary.replicas` of the Pods.
pub fn desired_deployment(app: &Subject, pod: &PodAdditions) -> Deployment {
    let name = app.name();
    let spec = &app.spec;
    build_deployment(
        app,
        pod,
        Track {
            name: deployment_name(name),
            image: &spec.image,
            replicas: spec.stable_replicas(),
            labels: child_labels(name),
            selector: selector_labels(name),
        },
    )
}

/// The ChildKey slot of the canary Deployment in the controller's memory of its writes
/// (`crate::context`): the stable one is keyed by its kind, `Deployment`.
pub const CANARY_SLOT: &str = "Deployment/canary";

/// The canary Deployment `<name>-canary` while `spec.canary` asks for one: the Pods of
/// [`desired_deployment`] (security contexts, env and what the providers add, resources,
/// ports, probe) with the canary's image, `canary.replicas` of them, labelled and
/// selected by the stable labels plus `platform.example.com/track: canary`. The Service
/// selects the stable labels only, so it sends traffic to the Pods of both.
pub fn desired_canary_deployment(app: &Subject, pod: &PodAdditions) -> Option<Deployment> {
    let name = app.name();
    let canary = app.spec.canary.as_ref()?;
    let deployment = build_deployment(
        app,
        pod,
        Track {
            name: canary_deployment_name(name),
            image: &canary.image,
            replicas: canary.replicas(),
            labels: canary_labels(name),
            selector: canary_selector_labels(name),
        },
    );
    Some(deployment)
}

/// What differs between the stable and the canary Deployment.
struct Track<'a> {
    name: String,
    image: &'a str,
    replicas: i32,
    labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
}

fn build_deployment(app: &Subject, pod: &PodAdditions, track: Track<'_>) -> Deployment {
    let spec = &app.spec;
    let ports = spec.ports();
    let pod_security = spec.pod_security();

    let mut env: Vec<EnvVar> = spec
        .env
        .iter()
        .map(|e| EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
            value_from: e.value_from.clone(),
        })
        .collect();
    // What the providers add comes after the user's own variables; the user's setting
    // of one wins (it comes first and is not repeated).
    env.extend(
        pod.env
            .iter()
            .filter(|added| !spec.env.iter().any(|e| e.name == added.name))
            .cloned(),
    );
    // The providers' volumes first, then those of `spec.config`, each list in its order.
    let config = config::config_parts(&spec.config);
    let volumes: Vec<_> = pod.volumes.iter().cloned().chain(config.volumes).collect();
    let mounts: Vec<_> = pod.mounts.iter().cloned().chain(config.mounts).collect();

    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(track.image.to_owned()),
        ports: Some(
            ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.clone()),
                    container_port: p.port,
                    // Explicit: it is part of the list key the API server tracks ownership by.
                    protocol: Some(p.protocol().as_str().to_owned()),
                    ..ContainerPort::default()
                })
                .collect(),
        ),
        env: (!env.is_empty()).then_some(env),
        env_from: (!config.env_from.is_empty()).then_some(config.env_from),
        resources: spec.resources.clone().filter(|r| {
            r.limits.as_ref().is_some_and(|l| !l.is_empty())
                || r.requests.as_ref().is_some_and(|l| !l.is_empty())
                || r.claims.as_ref().is_some_and(|l| !l.is_empty())
        }),
        // The first TCP port is the one the endpoint names when it is the first port;
        // an application with only UDP or SCTP ports has no TCP readiness to probe.
        readiness_probe: ports
            .iter()
            .find(|p| p.protocol() == Protocol::Tcp)
            .map(|p| Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(p.port),
                    ..TCPSocketAction::default()
                }),
                ..Probe::default()
            }),
        security_context: Some(security::container_security_context(&pod_security)),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Container::default()
    };

    let mut metadata = child_metadata(app, track.name);
    metadata.labels = Some(track.labels.clone());
    Deployment {
        metadata,
        spec: DeploymentSpec {
            replicas: Some(track.replicas),
            selector: LabelSelector {
                match_labels: Some(track.selector.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(track.labels),
                    annotations: (!pod.annotations.is_empty()).then(|| pod.annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    security_context: Some(security::pod_security_context(&pod_security)),
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    topology_spread_constraints: Some(vec![disruption::spread(&track.selector)]),
                    ..PodSpec::default()
                }),
            },
            strategy: rollout_strategy(spec.rollout.as_ref()),
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

/// The Deployment's strategy for `spec.rollout`: a rolling update with both settings
/// (defaults applied). Without `rollout`, none: the Deployment keeps the API server's
/// defaults, and its desired hash is what it was before `rollout` existed.
fn rollout_strategy(rollout: Option<&common::RolloutSpec>) -> Option<DeploymentStrategy> {
    rollout.map(|rollout| DeploymentStrategy {
        type_: Some("RollingUpdate".to_owned()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(rollout.max_surge()),
            max_unavailable: Some(rollout.max_unavailable()),
        }),
    })
}

/// The ClusterIP Service in front of an AppService's Pods, on each of `ports`.
pub fn desired_service(app: &Subject) -> Service {
    let name = app.name();
    let ports = app.spec.ports();
    Service {
        metadata: child_metadata(app, service_name(name)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(name)),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(p.name.clone()),
                        port: p.port,
                        target_port: Some(IntOrString::Int(p.port)),
                        protocol: Some(p.protocol().as_str().to_owned()),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            // Explicit, so a type changed by someone else is put back.
            type_: Some("ClusterIP".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Whether `owner` is the controller owner of an object with these owner references.
pub fn is_controlled_by(refs: Option<&[OwnerReference]>, owner_uid: &str) -> bool {
    refs.unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::subject;
    use common::names::{LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, MANAGED_BY};
    use common::testing::stored;
    use common::{AppPort, AppServiceSpec, EnvVar as AppEnvVar};
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use pretty_assertions::assert_eq;
    use std::collections::BTreeMap;

    fn container(d: &Deployment) -> &Container {
        &d.spec.template.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn deployment_carries_spec_with_defaults() {
        let d = desired_deployment(
            &subject(&stored(
                "checkout",
                AppServiceSpec {
                    image: "registry.example.com/checkout:v3".into(),
                    ..Default::default()
                },
            )),
            &PodAdditions::default(),
        );
        assert_eq!(d.metadata.name.as_deref(), Some("checkout"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("shop"));
        let spec = &d.spec;
        assert_eq!(spec.replicas, Some(1));
        let c = container(&d);
        assert_eq!(c.image.as_deref(), Some("registry.example.com/checkout:v3"));
        let ports = c.ports.as_ref().unwrap();
        assert_eq!(ports[0].container_port, 8080);
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .tcp_socket
                .as_ref()
                .unwrap()
                .port,
            IntOrString::Int(8080)
        );
        assert_eq!(c.env, None);
        assert_eq!(c.resources, None);
    }

    #[test]
    fn deployment_labels_selector_and_owner() {
        let d = desired_deployment(
            &subject(&stored(
                "checkout",
                AppServiceSpec {
                    image: "nginx:1.27".into(),
                    replicas: Some(4),
                    ..Default::default()
                },
            )),
            &PodAdditions::default(),
        );
        let labels = d.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_NAME], "checkout");
        assert_eq!(labels[LABEL_INSTANCE], "checkout");
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
        let spec = &d.spec;
        assert_eq!(spec.replicas, Some(4));
        assert_eq!(
            spec.selector.match_labels,
            Some(selector_labels("checkout"))
        );
        // The selector must select the template's Pods.
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        for (k, v) in selector_labels("checkout") {
            assert_eq!(pod_labels[&k], v);
        }
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "AppService");
        // The storage version, which stays served after v1alpha1 is unserved: the
        // garbage collector can always resolve it.
        assert_eq!(owner.api_version, "platform.example.com/v1beta1");
        assert_eq!(owner.api_version, AppService::api_version(&()));
        assert_eq!(owner.uid, common::testing::UID);
        assert_eq!(owner.controller, Some(true));
        assert!(is_controlled_by(
            d.metadata.owner_references.as_deref(),
            common::testing::UID
        ));
        assert!(!is_controlled_by(
            d.metadata.owner_references.as_deref(),
            "uid-2"
        ));
    }

    #[test]
    fn deployment_env_and_resources() {
        let resources = ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), Quantity("100m".into()))])),
            ..Default::default()
        };
        let d = desired_deployment(
            &subject(&stored(
                "checkout",
                AppServiceSpec {
                    image: "nginx:1.27".into(),
                    ports: vec![AppPort::http(9090)],
                    env: vec![AppEnvVar {
                        name: "LOG_LEVEL".into(),
                        value: Some("info".into()),
                        value_from: None,
                    }],
                    resources: Some(resources.clone()),
                    ..Default::default()
                },
            )),
            &PodAdditions::default(),
        );
        let c = container(&d);
        let env = c.env.as_ref().unwrap();
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].name, "LOG_LEVEL");
        assert_eq!(env[0].value.as_deref(), Some("info"));
        assert_eq!(c.resources, Some(resources));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 9090);
    }

    #[test]
    fn empty_resources_are_left_out() {
        let d = desired_deployment(
            &subject(&stored(
                "checkout",
                AppServiceSpec {
                    image: "nginx:1.27".into(),
                    resources: Some(ResourceRequirements::default()),
                    ..Default::default()
                },
            )),
            &PodAdditions::default(),
        );
        assert_eq!(container(&d).resources, None);
    }

    #[test]
    fn every_port_on_the_container_and_the_service_probe_on_the_first_tcp_one() {
        let spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            ports: vec![
                AppPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: Some(Protocol::Udp),
                },
                AppPort {
                    name: "metrics".into(),
                    port: 9090,
                    protocol: None,
                },
            ],
            ..Default::default()
        };
        let d = desired_deployment(
            &subject(&stored("checkout", spec.clone())),
            &PodAdditions::default(),
        );
        let ports: Vec<(Option<&str>, i32, Option<&str>)> = container(&d)
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref(), p.container_port, p.protocol.as_deref()))
            .collect();
        assert_eq!(
            ports,
            vec![
                (Some("dns"), 53, Some("UDP")),
                (Some("metrics"), 9090, Some("TCP"))
            ]
        );
        let probe = container(&d).readiness_probe.clone().unwrap();
        assert_eq!(probe.tcp_socket.unwrap().port, IntOrString::Int(9090));
        let s = desired_service(&subject(&stored("checkout", spec)));
        type Row<'a> = (Option<&'a str>, i32, Option<IntOrString>, Option<&'a str>);
        let ports: Vec<Row<'_>> = s
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p.name.as_deref(),
                    p.port,
                    p.target_port.clone(),
                    p.protocol.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (Some("dns"), 53, Some(IntOrString::Int(53)), Some("UDP")),
                (
                    Some("metrics"),
                    9090,
                    Some(IntOrString::Int(9090)),
                    Some("TCP")
                )
            ]
        );
    }

    #[test]
    fn service_selects_pods_on_port() {
        let s = desired_service(&subject(&stored(
            "checkout",
            AppServiceSpec {
                image: "nginx:1.27".into(),
                ports: vec![AppPort::http(9090)],
                ..Default::default()
            },
        )));
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.selector, Some(selector_labels("checkout")));
        let port = &spec.ports.as_ref().unwrap()[0];
        assert_eq!(port.port, 9090);
        assert_eq!(port.target_port, Some(IntOrString::Int(9090)));
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert!(is_controlled_by(
            s.metadata.owner_references.as_deref(),
            common::testing::UID
        ));
    }

    #[test]
    fn serialized_deployment_has_only_owned_fields() {
        let d = desired_deployment(
            &subject(&stored(
                "checkout",
                AppServiceSpec {
                    image: "nginx:1.27".into(),
                    ..Default::default()
                },
            )),
            &PodAdditions::default(),
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "Deployment");
        assert!(v.get("status").is_none());
        assert!(v["metadata"].get("resourceVersion").is_none());
        assert!(v["spec"].get("strategy").is_none());
    }

    #[test]
    fn rollout_becomes_the_rolling_update_with_its_defaults() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            rollout: Some(common::RolloutSpec {
                max_surge: Some(IntOrString::Int(0)),
                max_unavailable: None,
            }),
            ..Default::default()
        };
        let d = desired_deployment(
            &subject(&stored("checkout", spec.clone())),
            &PodAdditions::default(),
        );
        let strategy = d.spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        let rolling = strategy.rolling_update.unwrap();
        assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)));
        assert_eq!(
            rolling.max_unavailable,
            Some(IntOrString::String("25%".into()))
        );
        // Removing it gives the Deployment back to the API server's defaults.
        spec.rollout = None;
        let d = desired_deployment(
            &subject(&stored("checkout", spec)),
            &PodAdditions::default(),
        );
        assert_eq!(d.spec.strategy, None);
    }

    fn canary_spec() -> AppServiceSpec {
        AppServiceSpec {
            image: "registry.example.com/checkout:v3".into(),
            replicas: Some(5),
            env: vec![AppEnvVar {
                name: "LOG_LEVEL".into(),
                value: Some("info".into()),
                value_from: None,
            }],
            pod_security: Some(common::PodSecurity {
                run_as_user: Some(10001),
                ..Default::default()
            }),
            rollout: Some(common::RolloutSpec {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            }),
            canary: Some(common::CanarySpec {
                image: "registry.example.com/checkout:v4".into(),
                replicas: Some(2),
            }),
            ..with_database()
        }
    }

    #[test]
    fn the_canary_is_the_stable_pod_with_another_image_and_its_track() {
        let db = crate::external::testing::additions(true, "abc");
        let a = stored("checkout", canary_spec());
        let stable = desired_deployment(&subject(&a), &db);
        let canary = desired_canary_deployment(&subject(&a), &db).unwrap();
        assert_eq!(canary.metadata.name.as_deref(), Some("checkout-canary"));
        assert_eq!(canary.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            canary.metadata.owner_references,
            stable.metadata.owner_references
        );
        // Replicas split: 5 in all, 2 of them the canary's.
        assert_eq!(stable.spec.replicas, Some(3));
        assert_eq!(canary.spec.replicas, Some(2));
        // The stable selector is what it always was (it is immutable); the canary's
        // contains it and the track, and selects the canary's Pods only.
        assert_eq!(
            stable.spec.selector.match_labels,
            Some(selector_labels("checkout"))
        );
        let selector = canary.spec.selector.match_labels.clone().unwrap();
        for (k, v) in selector_labels("checkout") {
            assert_eq!(selector[&k], v);
        }
        assert_eq!(selector[common::names::LABEL_TRACK], "canary");
        let pod_labels = |d: &Deployment| {
            d.spec
                .template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .clone()
                .unwrap()
        };
        for (k, v) in &selector {
            assert_eq!(&pod_labels(&canary)[k], v);
        }
        assert!(!pod_labels(&stable).contains_key(common::names::LABEL_TRACK));
        // The Service's selector picks the Pods of both.
        let service = desired_service(&subject(&a))
            .spec
            .unwrap()
            .selector
            .unwrap();
        for d in [&stable, &canary] {
            for (k, v) in &service {
                assert_eq!(&pod_labels(d)[k], v);
            }
        }
        assert_eq!(
            canary.metadata.labels.as_ref().unwrap()[common::names::LABEL_TRACK],
            "canary"
        );
        // Everything of the Pod but the image and the track label is the stable one's.
        assert_eq!(
            container(&canary).image.as_deref(),
            Some("registry.example.com/checkout:v4")
        );
        let mut same = canary.spec.template.clone();
        same.spec.as_mut().unwrap().containers[0].image = container(&stable).image.clone();
        // Each spreads its own Pods (its selector, with the track).
        same.spec.as_mut().unwrap().topology_spread_constraints = stable
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .topology_spread_constraints
            .clone();
        same.metadata.as_mut().unwrap().labels = Some(pod_labels(&stable));
        assert_eq!(same, stable.spec.template);
        // Both roll out as spec.rollout says.
        assert_eq!(canary.spec.strategy, stable.spec.strategy);
        assert_eq!(
            canary
                .spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone()),
            Some(IntOrString::Int(0))
        );
    }

    #[test]
    fn no_canary_without_spec_canary_and_the_stable_runs_every_replica() {
        let mut spec = canary_spec();
        spec.canary = None;
        let a = stored("checkout", spec);
        assert_eq!(
            desired_canary_deployment(&subject(&a), &PodAdditions::default()),
            None
        );
        assert_eq!(
            desired_deployment(&subject(&a), &PodAdditions::default())
                .spec
                .replicas,
            Some(5)
        );
        // The canary's replicas default to one.
        let mut spec = canary_spec();
        spec.canary = Some(common::CanarySpec {
            image: "registry.example.com/checkout:v4".into(),
            replicas: None,
        });
        let a = stored("checkout", spec);
        assert_eq!(
            desired_deployment(&subject(&a), &PodAdditions::default())
                .spec
                .replicas,
            Some(4)
        );
        let canary = desired_canary_deployment(&subject(&a), &PodAdditions::default()).unwrap();
        assert_eq!(canary.spec.replicas, Some(1));
    }

    const PLAIN_DEPLOYMENT_JSON: &str = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"labels":{"app.kubernetes.io/instance":"checkout","app.kubernetes.io/managed-by":"appservice-operator","app.kubernetes.io/name":"checkout"},"name":"checkout","namespace":"shop","ownerReferences":[{"apiVersion":"platform.example.com/v1beta1","blockOwnerDeletion":true,"controller":true,"kind":"AppService","name":"checkout","uid":"uid-1"}]},"spec":{"replicas":3,"selector":{"matchLabels":{"app.kubernetes.io/instance":"checkout","app.kubernetes.io/managed-by":"appservice-operator"}},"template":{"metadata":{"labels":{"app.kubernetes.io/instance":"checkout","app.kubernetes.io/managed-by":"appservice-operator","app.kubernetes.io/name":"checkout"}},"spec":{"containers":[{"image":"nginx:1.27","name":"app","ports":[{"containerPort":8080,"name":"http","protocol":"TCP"}],"readinessProbe":{"tcpSocket":{"port":8080}},"securityContext":{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}}],"securityContext":{"runAsNonRoot":true,"seccompProfile":{"type":"RuntimeDefault"}},"topologySpreadConstraints":[{"labelSelector":{"matchLabels":{"app.kubernetes.io/instance":"checkout","app.kubernetes.io/managed-by":"appservice-operator"}},"matchLabelKeys":["pod-template-hash"],"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"ScheduleAnyway"}]}}}}"#;
    const PLAIN_DEPLOYMENT_HASH: &str = "635d436e91fa94bb7f6c8d5e3d9481ac";

    /// The desired hash of an AppService without the fields added since: the upgrade
    /// test's golden fixture holds the previous release's hashes; this one pins the
    /// Deployment of a plain AppService byte for byte. Adding `rollout` and `canary` left
    /// it as it was; the spread over nodes changed it (one rollout of every AppService
    /// at the upgrade, which docs/operators/upgrading.md announces).
    #[test]
    fn a_plain_appservice_builds_the_same_deployment_as_before() {
        // The uid these golden values were taken with (the owner reference is hashed).
        let app = common::testing::app("checkout", "nginx:1.27")
            .replicas(3)
            .stored()
            .uid("uid-1")
            .build();
        let d = desired_deployment(&subject(&app), &PodAdditions::default());
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, PLAIN_DEPLOYMENT_JSON);
        assert_eq!(
            crate::drift::desired_hash(&d).unwrap(),
            PLAIN_DEPLOYMENT_HASH
        );
    }

    fn with_database() -> AppServiceSpec {
        AppServiceSpec {
            image: "nginx:1.27".into(),
            database: Some(common::DatabaseSpec { class: "pg".into() }),
            env: vec![AppEnvVar {
                name: "PGPORT".into(),
                value: Some("6543".into()),
                value_from: None,
            }],
            ..Default::default()
        }
    }
}
