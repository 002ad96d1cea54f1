//! Is a live child what the controller wants? Decided without re-implementing the API
//! server's merge rules.
//!
//! Two facts settle it:
//!
//! 1. **What we last applied**: every child carries the annotation
//!    [`ANNOTATION_DESIRED_HASH`], a hash of the desired object the controller built. A
//!    different (or missing) hash means the AppService changed (or the object was never
//!    applied by this controller): apply.
//! 2. **What the controller is responsible for**, read from the live object: the values
//!    the AppService defines (image, replicas, ports, env, resources, probe, security
//!    contexts, selector, Service type, our labels). These are compared by meaning (an empty env value equals
//!    an absent one, `1000m` equals `1`), never by field-manager bookkeeping. What differs
//!    is listed as JSON-patch operations that put our value back, replacing whole lists
//!    and maps we own, so an entry another writer re-keyed or added cannot survive a
//!    merge.
//!
//! So a converged child costs no request, and one edited by someone else costs exactly
//! one (the repair patch), whatever the shape of the spec.

use std::collections::BTreeMap;

use common::names::{
    ANNOTATION_DESIRED_HASH, OWNED_SPREAD_KEYS, OWNED_TEMPLATE_ANNOTATIONS, is_owned_pod_volume,
};
use k8s_openapi::api::core::v1::{ContainerPort, ResourceRequirements, ServicePort};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::desired::{CONTAINER_NAME, HASHED_OWNER_API_VERSION};
use crate::owners::names_an_app;
pub use crate::view::Drift;
use crate::view::{
    AutoscalerView, BudgetView, CertificateView, ContainerView, DeploymentView, EnvVarView,
    GrantView, IngressView, LabelPairs, Named, RouteView, ServiceView,
};

/// A hash of `desired` (serialized with sorted map keys, so it is stable across runs
/// and releases as long as the desired object is the same). The version an owner
/// reference names is not part of it: it is how the AppService is named, not what it
/// asks for, and [`Drift`] repairs it on its own (so moving owner references to another
/// version costs a child one patch, not an apply and a new generation).
pub fn desired_hash<K: Serialize + Resource + Clone>(
    desired: &K,
) -> Result<String, serde_json::Error> {
    let mut hashed = desired.clone();
    for owner in hashed.meta_mut().owner_references.iter_mut().flatten() {
        if names_an_app(owner) {
            HASHED_OWNER_API_VERSION.clone_into(&mut owner.api_version);
        }
    }
    let bytes = serde_json::to_vec(&hashed)?;
    let digest = Sha256::digest(&bytes);
    // 128 bits are plenty to tell two desired objects apart.
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

/// Sets the desired-hash annotation on `meta`.
pub fn set_hash(meta: &mut ObjectMeta, hash: String) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_DESIRED_HASH.to_owned(), hash);
}

/// Puts back our labels on a child's metadata (other labels stay), and our owner
/// reference.
fn metadata_drift(
    desired: &ObjectMeta,
    want: &LabelPairs,
    live: &ObjectMeta,
    have: &LabelPairs,
) -> Vec<Value> {
    let mut ops = Vec::new();
    labels_subset("/metadata/labels", Some(want), Some(have), &mut ops);
    owner_drift(desired, live, &mut ops);
    ops
}

/// Our owner reference exactly as we build it. The live one with our uid may name
/// another version of the AppService (an earlier release wrote `v1alpha1`, which the
/// garbage collector cannot resolve once it is no longer served) or have lost its
/// `controller`/`blockOwnerDeletion` flags: it is replaced whole, guarded by a test of
/// its uid in case the list moved. Other owner references are someone else's.
fn owner_drift(desired: &ObjectMeta, live: &ObjectMeta, ops: &mut Vec<Value>) {
    let have = live.owner_references.as_deref().unwrap_or_default();
    for want in desired.owner_references.iter().flatten() {
        // Without our uid the child is not ours: reconcile never converges it.
        if let Some(i) = have.iter().position(|r| r.uid == want.uid)
            && have[i] != *want
        {
            let path = format!("/metadata/ownerReferences/{i}");
            ops.push(json!({"op": "test", "path": format!("{path}/uid"), "value": want.uid}));
            // `replace`: an `add` at an array index would insert a second entry.
            ops.push(json!({"op": "replace", "path": path, "value": want}));
        }
    }
}

impl Drift for DeploymentView {
    fn drift(desired: &Self, live: &Self) -> Vec<Value> {
        let mut ops = metadata_drift(
            &desired.metadata,
            &desired.labels,
            &live.metadata,
            &live.labels,
        );
        if desired.spec.replicas != live.spec.replicas {
            ops.push(add("/spec/replicas", json!(desired.spec.replicas)));
        }
        // The strategy is ours only when `spec.rollout` asks for one; then it is put back
        // whole (its type and both settings), as the API server stores it.
        if let Some(want) = &desired.spec.strategy
            && live.spec.strategy.as_ref() != Some(want)
        {
            ops.push(add("/spec/strategy", json!(want)));
        }
        let desired_template = &desired.spec.template;
        let live_template = &live.spec.template;
        if live_template.metadata.is_none() {
            ops.push(add(
                "/spec/template/metadata",
                json!({"labels": desired_template.metadata.as_ref().and_then(|m| m.labels.clone())}),
            ));
        } else {
            labels_subset(
                "/spec/template/metadata/labels",
                desired_template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.as_ref()),
                live_template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.as_ref()),
                &mut ops,
            );
        }
        // The template's annotations we own are put back (the others are not ours): a
        // rollout as any change of the template is, and what they say matters to the
        // Pods (the database's revision tells them which password and CA they have).
        let want_owned = desired_template
            .metadata
            .as_ref()
            .map(|m| &m.owned_annotations);
        let live_meta = live_template.metadata.as_ref();
        let mut has_map = live_meta.is_some_and(|m| m.has_annotations);
        let annotations = "/spec/template/metadata/annotations";
        for key in OWNED_TEMPLATE_ANNOTATIONS {
            let want = want_owned.and_then(|a| a.get(key));
            if want == live_meta.and_then(|m| m.owned_annotations.get(key)) {
                continue;
            }
            let path = format!("{annotations}/{}", escape(key));
            match want {
                Some(v) if has_map => ops.push(add(&path, json!(v))),
                Some(v) => {
                    ops.push(add(annotations, json!({key: v})));
                    has_map = true;
                }
                None => ops.push(json!({"op": "remove", "path": path})),
            }
        }
        // Of the Pod's volumes, the database CA's and `spec.config`'s are ours.
        owned_entries_drift(
            "/spec/template/spec/volumes",
            ("name", is_owned_pod_volume),
            desired_template
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_deref()),
            live_template
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_deref()),
            &mut ops,
        );
        // Of the spread constraints, the one over nodes is ours; a zone spread another
        // writer adds is theirs.
        owned_entries_drift(
            "/spec/template/spec/topologySpreadConstraints",
            ("topologyKey", |key| OWNED_SPREAD_KEYS.contains(&key)),
            desired_template
                .spec
                .as_ref()
                .and_then(|s| s.topology_spread_constraints.as_deref()),
            live_template
                .spec
                .as_ref()
                .and_then(|s| s.topology_spread_constraints.as_deref()),
            &mut ops,
        );
        // The Pod's security context is ours whole: a field another writer adds to it
        // (`runAsUser: 0`, say) would change who the process runs as, or get every Pod
        // refused by Pod Security admission.
        let desired_security = desired_template
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref());
        let live_security = live_template
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref());
        field_drift(
            "/spec/template/spec/securityContext",
            desired_security,
            live_security,
            &mut ops,
        );
        let desired_containers = desired_template
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        let live_containers = live_template
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        let want = desired_containers.iter().find(|c| c.name == CONTAINER_NAME);
        let have = live_containers
            .iter()
            .position(|c| c.name == CONTAINER_NAME);
        match (want, have) {
            (Some(want), Some(i)) => container_drift(want, &live_containers[i], i, &mut ops),
            // Our container is gone (renamed by someone): put the list back as we want it.
            (Some(_), None) => ops.push(add(
                "/spec/template/spec/containers",
                json!(desired_containers),
            )),
            (None, _) => {}
        }
        ops
    }
}

fn container_drift(want: &ContainerView, have: &ContainerView, index: usize, ops: &mut Vec<Value>) {
    let base = format!("/spec/template/spec/containers/{index}");
    let before = ops.len();
    if want.image != have.image {
        ops.push(add(&format!("{base}/image"), json!(want.image)));
    }
    if normalized_ports(want.ports.as_deref()) != normalized_ports(have.ports.as_deref()) {
        set_or_remove(
            &format!("{base}/ports"),
            want.ports.as_ref(),
            have.ports.is_some(),
            ops,
        );
    }
    if !same_env(want.env.as_deref(), have.env.as_deref()) {
        set_or_remove(
            &format!("{base}/env"),
            want.env.as_ref(),
            have.env.is_some(),
            ops,
        );
    }
    field_drift(
        &format!("{base}/envFrom"),
        want.env_from.as_ref(),
        have.env_from.as_ref(),
        ops,
    );
    if !same_resources(want.resources.as_ref(), have.resources.as_ref()) {
        match &want.resources {
            Some(r) => ops.push(add(&format!("{base}/resources"), json!(r))),
            // Nothing requested: the API server keeps `resources: {}`, clear what is in it.
            None => ops.push(add(&format!("{base}/resources"), json!({}))),
        }
    }
    let probe_port = |c: &ContainerView| {
        c.readiness_probe
            .as_ref()
            .and_then(|p| p.tcp_socket.as_ref())
            .map(|t| t.port.clone())
    };
    let probe_kind = |c: &ContainerView| {
        c.readiness_probe.as_ref().map(|p| {
            (
                p.exec.is_some(),
                p.grpc.is_some(),
                p.http_get.is_some(),
                p.tcp_socket.is_some(),
            )
        })
    };
    if probe_port(want) != probe_port(have) || probe_kind(want) != probe_kind(have) {
        set_or_remove(
            &format!("{base}/readinessProbe"),
            want.readiness_probe.as_ref(),
            have.readiness_probe.is_some(),
            ops,
        );
    }
    // Compared whole, like the Pod's (views keep both in canonical form).
    field_drift(
        &format!("{base}/securityContext"),
        want.security_context.as_ref(),
        have.security_context.as_ref(),
        ops,
    );
    owned_entries_drift(
        &format!("{base}/volumeMounts"),
        ("name", is_owned_pod_volume),
        want.volume_mounts.as_deref(),
        have.volume_mounts.as_deref(),
        ops,
    );
    if ops.len() > before {
        // The index came from the object we read; refuse the patch if the list moved.
        ops.insert(
            before,
            json!({"op": "test", "path": format!("{base}/name"), "value": CONTAINER_NAME}),
        );
    }
}

impl Drift for ServiceView {
    fn drift(desired: &Self, live: &Self) -> Vec<Value> {
        let mut ops = metadata_drift(
            &desired.metadata,
            &desired.labels,
            &live.metadata,
            &live.labels,
        );
        let Some((want, have)) = specs(desired.spec.as_ref(), live.spec.as_ref(), &mut ops) else {
            return ops;
        };
        let want_type = want.type_.as_deref().unwrap_or("ClusterIP");
        let have_type = have.type_.as_deref().unwrap_or("ClusterIP");
        let ports_differ = normalized_service_ports(want.ports.as_deref())
            != normalized_service_ports(have.ports.as_deref());
        if want_type != have_type {
            ops.push(add("/spec/type", json!(want_type)));
        }
        // Ports are replaced whole on a type change too: node ports allocated for another
        // type must go with it.
        if ports_differ || want_type != have_type {
            set_or_remove(
                "/spec/ports",
                want.ports.as_ref(),
                have.ports.is_some(),
                &mut ops,
            );
        }
        field_drift(
            "/spec/selector",
            want.selector.as_ref(),
            have.selector.as_ref(),
            &mut ops,
        );
        ops
    }
}

impl Drift for AutoscalerView {
    /// Its target, bounds and metrics are ours whole, put back as we build them.
    fn drift(desired: &Self, live: &Self) -> Vec<Value> {
        let mut ops = metadata_drift(
            &desired.metadata,
            &desired.labels,
            &live.metadata,
            &live.labels,
        );
        let Some((want, have)) = specs(desired.spec.as_ref(), live.spec.as_ref(), &mut ops) else {
            return ops;
        };
        if want.scale_target_ref != have.scale_target_ref {
            ops.push(add("/spec/scaleTargetRef", json!(want.scale_target_ref)));
        }
        field_drift(
            "/spec/minReplicas",
            want.min_replicas.as_ref(),
            have.min_replicas.as_ref(),
            &mut ops,
        );
        if want.max_replicas != have.max_replicas {
            ops.push(add("/spec/maxReplicas", json!(want.max_replicas)));
        }
        field_drift(
            "/spec/metrics",
            want.metrics.as_ref(),
            have.metrics.as_ref(),
            &mut ops,
        );
        ops
    }
}

/// Children whose spec is ours whole (exposure's: route, grant, Certificate, Ingress):
/// their views keep the spec as JSON, and any difference puts all of it back.
macro_rules! whole_spec_drift {
    ($($view:ty),+) => {$(
        impl Drift for $view {
            fn drift(desired: &Self, live: &Self) -> Vec<Value> {
                let mut ops = metadata_drift(
                    &desired.metadata,
                    &desired.labels,
                    &live.metadata,
                    &live.labels,
                );
                if desired.spec != live.spec {
                    set_or_remove("/spec", desired.spec.as_ref(), live.spec.is_some(), &mut ops);
                }
                ops
            }
        }
    )+};
}

whole_spec_drift!(RouteView, GrantView, CertificateView, IngressView);

impl Drift for BudgetView {
    /// The budget's settings are ours whole: `maxUnavailable`, the selector and the
    /// eviction policy put back as we build them, and a `minAvailable` someone added
    /// removed (the API server refuses a budget with both).
    fn drift(desired: &Self, live: &Self) -> Vec<Value> {
        let mut ops = metadata_drift(
            &desired.metadata,
            &desired.labels,
            &live.metadata,
            &live.labels,
        );
        let Some((want, have)) = specs(desired.spec.as_ref(), live.spec.as_ref(), &mut ops) else {
            return ops;
        };
        if have.min_available.is_some() && want.min_available.is_none() {
            ops.push(json!({"op": "remove", "path": "/spec/minAvailable"}));
        }
        field_drift(
            "/spec/maxUnavailable",
            want.max_unavailable.as_ref(),
            have.max_unavailable.as_ref(),
            &mut ops,
        );
        field_drift(
            "/spec/selector",
            want.selector.as_ref(),
            have.selector.as_ref(),
            &mut ops,
        );
        field_drift(
            "/spec/unhealthyPodEvictionPolicy",
            want.unhealthy_pod_eviction_policy.as_ref(),
            have.unhealthy_pod_eviction_policy.as_ref(),
            &mut ops,
        );
        ops
    }
}

/// The entries of a list keyed by name (volumes, volume mounts; spread constraints by
/// topology key: the entry's `key` field) that `owned` says are ours: as `want` has them, or absent when it has none; every
/// other entry is someone else's and left where it is. Replacements and removals go from
/// the last index down, so no index a later operation names has moved; each is guarded
/// by a test of the entry's name.
fn owned_entries_drift(
    path: &str,
    (key, owned): (&str, fn(&str) -> bool),
    want: Option<&[Named]>,
    have: Option<&[Named]>,
    ops: &mut Vec<Value>,
) {
    let entries = have.unwrap_or_default();
    let wanted = |name: &str| want.unwrap_or_default().iter().find(|e| e.name == name);
    // The first live entry of each owned name (the API server refuses two of one name).
    let mut found: Vec<(usize, &str)> = entries
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            owned(&e.name) && entries.iter().position(|f| f.name == e.name) == Some(*i)
        })
        .map(|(i, e)| (i, e.name.as_str()))
        .collect();
    found.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    for (i, name) in found {
        let test = json!({"op": "test", "path": format!("{path}/{i}/{key}"), "value": name});
        match wanted(name) {
            Some(w) if entries[i] == *w => {}
            Some(w) => {
                ops.push(test);
                ops.push(json!({"op": "replace", "path": format!("{path}/{i}"), "value": w}));
            }
            None => {
                ops.push(test);
                ops.push(json!({"op": "remove", "path": format!("{path}/{i}")}));
            }
        }
    }
    let missing: Vec<&Named> = want
        .unwrap_or_default()
        .iter()
        .filter(|w| !entries.iter().any(|e| e.name == w.name))
        .collect();
    match (missing.is_empty(), have.is_some()) {
        (true, _) => {}
        (false, true) => {
            for w in missing {
                ops.push(add(&format!("{path}/-"), json!(w)));
            }
        }
        (false, false) => ops.push(add(path, json!(missing))),
    }
}

/// A JSON-patch `add`, which also replaces an existing member of an object.
fn add(path: &str, value: Value) -> Value {
    json!({"op": "add", "path": path, "value": value})
}

/// Our value of a field we own put back where the live one differs (the field removed
/// when we set none).
fn field_drift<T: PartialEq + Serialize>(
    path: &str,
    want: Option<&T>,
    have: Option<&T>,
    ops: &mut Vec<Value>,
) {
    if want != have {
        set_or_remove(path, want, have.is_some(), ops);
    }
}

/// Both specs, to be compared field by field; or, when the live object has none, ours
/// added whole.
fn specs<'a, S: Serialize>(
    want: Option<&'a S>,
    have: Option<&'a S>,
    ops: &mut Vec<Value>,
) -> Option<(&'a S, &'a S)> {
    match (want, have) {
        (Some(want), Some(have)) => Some((want, have)),
        (Some(want), None) => {
            ops.push(add("/spec", json!(want)));
            None
        }
        (None, _) => None,
    }
}

fn set_or_remove<T: Serialize>(path: &str, want: Option<&T>, present: bool, ops: &mut Vec<Value>) {
    match want {
        Some(v) => ops.push(add(path, json!(v))),
        None if present => ops.push(json!({"op": "remove", "path": path})),
        None => {}
    }
}

/// Our labels must be present with our values; labels others add are theirs to keep.
fn labels_subset(
    path: &str,
    want: Option<&LabelPairs>,
    have: Option<&LabelPairs>,
    ops: &mut Vec<Value>,
) {
    let Some(want) = want.filter(|w| !w.is_empty()) else {
        return;
    };
    let Some(have) = have else {
        ops.push(add(path, json!(want)));
        return;
    };
    // An empty live map is absent for a JSON patch as much as a missing one.
    if have.is_empty() {
        ops.push(add(path, json!(want)));
        return;
    }
    for (k, v) in want.iter() {
        if have.get(k) != Some(v) {
            ops.push(add(&format!("{path}/{}", escape(k)), json!(v)));
        }
    }
}

/// Escapes a map key for a JSON pointer (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The protocol the API server gives a container or Service port without one.
const SERVER_DEFAULT_PROTOCOL: &str = "TCP";

fn normalized_ports(ports: Option<&[ContainerPort]>) -> Vec<(Option<&str>, i32, &str)> {
    ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p.name.as_deref(),
                p.container_port,
                p.protocol.as_deref().unwrap_or(SERVER_DEFAULT_PROTOCOL),
            )
        })
        .collect()
}

/// A Service port as compared: name, port, target port, protocol, app protocol.
type PortKey<'a> = (Option<&'a str>, i32, IntOrString, &'a str, Option<&'a str>);

fn normalized_service_ports(ports: Option<&[ServicePort]>) -> Vec<PortKey<'_>> {
    ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p.name.as_deref(),
                p.port,
                // The API server defaults an absent targetPort to the port.
                p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
                p.protocol.as_deref().unwrap_or(SERVER_DEFAULT_PROTOCOL),
                p.app_protocol.as_deref(),
            )
        })
        .collect()
}

/// Whether the live env is the one we want. An empty `value` is dropped on the wire,
/// and the API server fills in defaults inside `valueFrom` (`fieldRef.apiVersion`), so
/// a live `valueFrom` matches when it holds everything ours says.
fn same_env(want: Option<&[EnvVarView]>, have: Option<&[EnvVarView]>) -> bool {
    let want = want.unwrap_or_default();
    let have = have.unwrap_or_default();
    want.len() == have.len()
        && want.iter().zip(have).all(|(w, h)| {
            w.name == h.name
                && w.value.as_deref().filter(|v| !v.is_empty())
                    == h.value.as_deref().filter(|v| !v.is_empty())
                && match (&w.value_from, &h.value_from) {
                    (None, None) => true,
                    (Some(w), Some(h)) => contains(&json!(w), &json!(h)),
                    _ => false,
                }
        })
}

/// Whether `have` holds every member `want` has, with the same value (objects compared
/// member by member, everything else by equality).
fn contains(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(wv, hv))),
        _ => want == have,
    }
}

fn same_resources(
    want: Option<&ResourceRequirements>,
    have: Option<&ResourceRequirements>,
) -> bool {
    let empty = ResourceRequirements::default();
    let want = want.unwrap_or(&empty);
    let have = have.unwrap_or(&empty);
    same_quantities(want.limits.as_ref(), have.limits.as_ref())
        && same_quantities(want.requests.as_ref(), have.requests.as_ref())
        && want.claims.as_deref().unwrap_or_default() == have.claims.as_deref().unwrap_or_default()
}

/// Quantity maps equal by value (`1000m` is `1`): the API server canonicalizes them.
fn same_quantities(
    want: Option<&BTreeMap<String, Quantity>>,
    have: Option<&BTreeMap<String, Quantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let want = want.unwrap_or(&empty);
    let have = have.unwrap_or(&empty);
    want.len() == have.len()
        && want
            .iter()
            .all(|(k, w)| have.get(k).is_some_and(|h| common::quantity::same(w, h)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{desired_deployment, desired_service};
    use crate::external::PodAdditions;
    use crate::external::testing::additions as pod_db;
    use crate::subject::subject;
    use crate::view::of;
    use common::names::ANNOTATION_DATABASE_REVISION;
    use common::testing::stored;
    use common::{AppServiceSpec, EnvVar as AppEnvVar};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{EnvVar, Service};
    use pretty_assertions::assert_eq;

    #[test]
    fn a_strategy_is_put_back_only_when_the_appservice_sets_one() {
        use k8s_openapi::api::apps::v1::DeploymentStrategy;
        let recreate = |mut d: Deployment| {
            d.spec.strategy = Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            });
            d
        };
        let mut with = spec();
        with.rollout = Some(common::RolloutSpec {
            max_surge: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)),
            max_unavailable: None,
        });
        let desired = desired_deployment(&subject(&stored("web", with)), &PodAdditions::default());
        assert!(deployment_drift(&desired, &as_stored(desired.clone())).is_empty());
        let ops = deployment_drift(&desired, &as_stored(recreate(desired.clone())));
        assert_eq!(
            ops,
            vec![json!({"op": "add", "path": "/spec/strategy", "value": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}}})]
        );
        // Without `spec.rollout` the strategy is the API server's (and anyone's) to set.
        let plain = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        assert!(deployment_drift(&plain, &as_stored(recreate(plain.clone()))).is_empty());
    }

    /// The drift between two full objects, compared as the controller compares them.
    fn deployment_drift(desired: &Deployment, live: &Deployment) -> Vec<Value> {
        DeploymentView::drift(&of(desired).unwrap(), &of(live).unwrap())
    }

    fn service_drift(desired: &Service, live: &Service) -> Vec<Value> {
        ServiceView::drift(&of(desired).unwrap(), &of(live).unwrap())
    }

    fn spec() -> AppServiceSpec {
        AppServiceSpec {
            image: "nginx:1.27".into(),
            replicas: Some(2),
            env: vec![
                AppEnvVar {
                    name: "EMPTY".into(),
                    value: Some(String::new()),
                    value_from: None,
                },
                AppEnvVar {
                    name: "LEVEL".into(),
                    value: Some("info".into()),
                    value_from: None,
                },
            ],
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("1000m".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The Deployment as the API server returns it: empty env values dropped,
    /// quantities canonicalized, defaults filled in, labels added by others.
    fn as_stored(mut d: Deployment) -> Deployment {
        let mut v = serde_json::to_value(&d).unwrap();
        let c = &mut v["spec"]["template"]["spec"]["containers"][0];
        for e in c["env"].as_array_mut().unwrap() {
            if e["value"] == "" {
                e.as_object_mut().unwrap().remove("value");
            }
        }
        c["resources"]["requests"]["cpu"] = json!("1");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["readinessProbe"]["periodSeconds"] = json!(10);
        d = serde_json::from_value(v).unwrap();
        d.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "payments".into());
        d.spec.revision_history_limit = Some(10);
        d
    }

    #[test]
    fn stored_form_of_every_shape_is_converged() {
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        assert_eq!(
            deployment_drift(&d, &as_stored(d.clone())),
            Vec::<Value>::new()
        );
        let s = desired_service(&subject(&stored("web", spec())));
        let mut stored = s.clone();
        stored.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.1".into());
        stored.spec.as_mut().unwrap().session_affinity = Some("None".into());
        assert_eq!(service_drift(&s, &stored), Vec::<Value>::new());
    }

    #[test]
    fn edits_by_others_are_put_back() {
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        let mut live = as_stored(d.clone());
        let c = &mut live.spec.template.spec.as_mut().unwrap().containers[0];
        c.image = Some("evil:1".into());
        c.ports.as_mut().unwrap()[0].container_port = 9999;
        live.spec.replicas = Some(7);
        live.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(common::names::LABEL_INSTANCE);
        let ops = deployment_drift(&d, &live);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/metadata/labels/app.kubernetes.io~1instance",
                "/spec/replicas",
                "/spec/template/spec/containers/0/name",
                "/spec/template/spec/containers/0/image",
                "/spec/template/spec/containers/0/ports",
            ]
        );
        // Applying the operations gives back a converged object.
        let mut v = serde_json::to_value(&live).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
        let repaired: Deployment = serde_json::from_value(v).unwrap();
        assert!(deployment_drift(&d, &repaired).is_empty());
    }

    #[test]
    fn security_contexts_changed_by_others_are_put_back_whole() {
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        // The API server stores what we wrote; an empty Pod context is none.
        assert!(deployment_drift(&d, &as_stored(d.clone())).is_empty());

        let mut live = as_stored(d.clone());
        let pod = live.spec.template.spec.as_mut().unwrap();
        let pod_context = pod.security_context.as_mut().unwrap();
        pod_context.run_as_non_root = None;
        pod_context.run_as_user = Some(0);
        let c = &mut pod.containers[0];
        c.security_context.as_mut().unwrap().privileged = Some(true);
        let ops = deployment_drift(&d, &live);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/spec/template/spec/securityContext",
                "/spec/template/spec/containers/0/name",
                "/spec/template/spec/containers/0/securityContext",
            ]
        );
        let mut v = serde_json::to_value(&live).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
        assert_eq!(
            v["spec"]["template"]["spec"]["securityContext"],
            json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["securityContext"],
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
        );
        let repaired: Deployment = serde_json::from_value(v).unwrap();
        assert!(deployment_drift(&d, &repaired).is_empty());

        // Removed altogether (an older controller's template): put back too.
        let mut live = as_stored(d.clone());
        let pod = live.spec.template.spec.as_mut().unwrap();
        pod.security_context = Some(Default::default());
        pod.containers[0].security_context = None;
        let ops = deployment_drift(&d, &live);
        assert_eq!(ops.len(), 3, "{ops:#?}");
        assert!(ops.iter().all(|o| o["op"] != "remove"), "{ops:#?}");
    }

    #[test]
    fn extra_env_and_removed_resources_are_drift() {
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        let mut live = as_stored(d.clone());
        let c = &mut live.spec.template.spec.as_mut().unwrap().containers[0];
        c.env.as_mut().unwrap().push(EnvVar {
            name: "EXTRA".into(),
            value: Some("1".into()),
            value_from: None,
        });
        c.resources = None;
        let ops = deployment_drift(&d, &live);
        assert_eq!(ops.len(), 3, "{ops:#?}");
    }

    #[test]
    fn value_from_defaults_are_not_drift_but_another_source_is() {
        let mut s = spec();
        s.env = vec![AppEnvVar {
            name: "POD".into(),
            value: None,
            value_from: Some(
                serde_json::from_value(json!({"fieldRef": {"fieldPath": "metadata.name"}}))
                    .unwrap(),
            ),
        }];
        let d = desired_deployment(&subject(&stored("web", s)), &PodAdditions::default());
        let with_source = |source: Value| {
            let mut live = d.clone();
            let c = &mut live.spec.template.spec.as_mut().unwrap().containers[0];
            c.env.as_mut().unwrap()[0].value_from = Some(serde_json::from_value(source).unwrap());
            live
        };
        let live =
            with_source(json!({"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}));
        assert!(deployment_drift(&d, &live).is_empty());
        let live =
            with_source(json!({"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}));
        assert_eq!(deployment_drift(&d, &live).len(), 2);
    }

    #[test]
    fn service_port_type_and_selector_drift() {
        let s = desired_service(&subject(&stored("web", spec())));
        let mut live = s.clone();
        let spec = live.spec.as_mut().unwrap();
        spec.type_ = Some("NodePort".into());
        spec.ports.as_mut().unwrap()[0].node_port = Some(30080);
        spec.selector
            .as_mut()
            .unwrap()
            .insert("extra".into(), "x".into());
        let ops = service_drift(&s, &live);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["/spec/type", "/spec/ports", "/spec/selector"]);
        // The replacement ports carry no node port.
        assert!(ops[1]["value"][0].get("nodePort").is_none());
    }

    /// Every port counts: a live child missing one of several ports, or with one whose
    /// protocol changed, is repaired with the whole list (in order: the first port is
    /// the endpoint).
    #[test]
    fn every_port_of_several_is_compared() {
        let mut several = spec();
        several.ports = serde_json::from_value(json!([
            {"name": "http", "port": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "metrics", "port": 9090}
        ]))
        .unwrap();
        let d = desired_deployment(
            &subject(&stored("web", several.clone())),
            &PodAdditions::default(),
        );
        let s = desired_service(&subject(&stored("web", several)));
        assert!(deployment_drift(&d, &as_stored(d.clone())).is_empty());
        assert!(service_drift(&s, &s.clone()).is_empty());

        let mut live = as_stored(d.clone());
        let c = &mut live.spec.template.spec.as_mut().unwrap().containers[0];
        c.ports.as_mut().unwrap().pop();
        let ops = deployment_drift(&d, &live);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        // The first operation tests that container 0 is still ours.
        assert_eq!(
            paths,
            [
                "/spec/template/spec/containers/0/name",
                "/spec/template/spec/containers/0/ports"
            ]
        );
        assert_eq!(ops[1]["value"].as_array().unwrap().len(), 3);

        let mut live = s.clone();
        live.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("TCP".into());
        let ops = service_drift(&s, &live);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["/spec/ports"]);
        assert_eq!(ops[0]["value"][1]["protocol"], "UDP");
    }

    #[test]
    fn hash_is_stable_and_sensitive() {
        let a = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        let h1 = desired_hash(&a).unwrap();
        // The value a release computes is the value every later release computes for
        // the same AppService (children made before an upgrade are not rewritten): a
        // golden value, so a change of the hash or of what it covers fails here.
        assert_eq!(h1, "fa5a9dc2cb78ef7866279d9aa56faf37");
        let svc = desired_service(&subject(&stored("web", spec())));
        assert_eq!(
            desired_hash(&svc).unwrap(),
            "1d513e4066d6814622242b32fcd6e36e"
        );
        let mut s = spec();
        s.image = "nginx:1.28".into();
        let b = desired_deployment(&subject(&stored("web", s)), &PodAdditions::default());
        assert_ne!(h1, desired_hash(&b).unwrap());
    }

    /// A child an earlier release made names its owner through `v1alpha1`: the same hash
    /// (nothing the AppService asks for changed), and one patch re-points it at the
    /// storage version, whole, guarded by its uid. Other owners' references stay.
    #[test]
    fn an_owner_reference_through_another_version_is_re_pointed() {
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        let mut old = d.clone();
        let mut foreign = old.metadata.owner_references.as_ref().unwrap()[0].clone();
        foreign.uid = "someone-else".into();
        foreign.controller = None;
        foreign.kind = "Team".into();
        let refs = old.metadata.owner_references.as_mut().unwrap();
        refs[0].api_version = "platform.example.com/v1alpha1".into();
        refs.insert(0, foreign.clone());
        // The foreign reference is part of the object; without it the hashes are equal.
        let mut same_owner = old.clone();
        same_owner
            .metadata
            .owner_references
            .as_mut()
            .unwrap()
            .remove(0);
        assert_eq!(
            desired_hash(&same_owner).unwrap(),
            desired_hash(&d).unwrap()
        );
        let ops = deployment_drift(&d, &old);
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/metadata/ownerReferences/1/uid", "value": common::testing::UID}),
                json!({"op": "replace", "path": "/metadata/ownerReferences/1",
                       "value": d.metadata.owner_references.as_ref().unwrap()[0]}),
            ]
        );
        let mut v = serde_json::to_value(&old).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
        let repointed: Deployment = serde_json::from_value(v).unwrap();
        assert!(deployment_drift(&d, &repointed).is_empty());
        let refs = repointed.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0], foreign);
        assert_eq!(refs[1].api_version, "platform.example.com/v1beta1");

        // Lost flags are drift too, on the Service as on the Deployment.
        let s = desired_service(&subject(&stored("web", spec())));
        let mut live = s.clone();
        live.metadata.owner_references.as_mut().unwrap()[0].block_owner_deletion = None;
        let ops = service_drift(&s, &live);
        assert_eq!(ops.len(), 2, "{ops:#?}");
        assert_eq!(ops[1]["value"]["blockOwnerDeletion"], true);
    }

    fn with_database(spec: AppServiceSpec) -> AppServiceSpec {
        AppServiceSpec {
            database: Some(common::DatabaseSpec { class: "pg".into() }),
            ..spec
        }
    }

    fn patched(live: &Deployment, ops: &[Value]) -> Deployment {
        let mut v = serde_json::to_value(live).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
        serde_json::from_value(v).unwrap()
    }

    /// The database CA's volume, its mount and the revision annotation are ours; others'
    /// volumes, mounts and annotations stay; each repair converges in one patch.
    #[test]
    fn the_database_ca_mount_and_revision_are_put_back_and_others_kept() {
        let a = stored("web", with_database(spec()));
        let d = desired_deployment(&subject(&a), &pod_db(true, "r1"));
        let stored = as_stored(d.clone());
        assert!(deployment_drift(&d, &stored).is_empty());

        // Others' entries next to ours are no drift.
        let mut shared = stored.clone();
        let template = &mut shared.spec.template;
        template
            .metadata
            .as_mut()
            .unwrap()
            .annotations
            .as_mut()
            .unwrap()
            .insert("kubectl.kubernetes.io/restartedAt".into(), "now".into());
        let pod = template.spec.as_mut().unwrap();
        let theirs = k8s_openapi::api::core::v1::Volume {
            name: "cache".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        };
        pod.volumes.as_mut().unwrap().insert(0, theirs.clone());
        assert!(deployment_drift(&d, &shared).is_empty());

        // Ours removed, edited or moved: put back, theirs kept.
        let mut broken = shared.clone();
        let template = &mut broken.spec.template;
        template.metadata.as_mut().unwrap().annotations = None;
        let pod = template.spec.as_mut().unwrap();
        pod.volumes.as_mut().unwrap()[1]
            .secret
            .as_mut()
            .unwrap()
            .secret_name = Some("someone-elses".into());
        pod.containers[0].volume_mounts = None;
        let ops = deployment_drift(&d, &broken);
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/spec/template/metadata/annotations",
                "/spec/template/spec/volumes/1/name",
                "/spec/template/spec/volumes/1",
                "/spec/template/spec/containers/0/name",
                "/spec/template/spec/containers/0/volumeMounts",
            ]
        );
        let repaired = patched(&broken, &ops);
        assert!(deployment_drift(&d, &repaired).is_empty());
        let pod = repaired.spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.volumes.as_ref().unwrap()[0], theirs);

        // A revision edited by hand is put back, next to others' annotations.
        let mut edited = shared.clone();
        edited
            .spec
            .template
            .metadata
            .as_mut()
            .unwrap()
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_DATABASE_REVISION.into(), "forged".into());
        let ops = deployment_drift(&d, &edited);
        assert_eq!(ops.len(), 1, "{ops:#?}");
        let repaired = patched(&edited, &ops);
        assert!(deployment_drift(&d, &repaired).is_empty());
        let annotations = repaired
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap();
        assert_eq!(annotations["kubectl.kubernetes.io/restartedAt"], "now");

        // Without a CA (require, disable), ours goes and theirs stays.
        let no_ca = desired_deployment(&subject(&a), &pod_db(false, "r1"));
        let ops = deployment_drift(&no_ca, &shared);
        let repaired = patched(&shared, &ops);
        assert!(deployment_drift(&no_ca, &repaired).is_empty());
        let pod = repaired.spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.volumes.as_deref(), Some(&[theirs][..]));
        assert_eq!(pod.containers[0].volume_mounts.as_deref(), Some(&[][..]));
    }

    /// A new revision (a rotated password or CA) is a new desired object: the hash
    /// changes, so the Deployment is applied and rolls; the same revision hashes alike.
    #[test]
    fn a_new_database_revision_changes_the_hash_and_only_then() {
        let a = stored("web", with_database(spec()));
        let hash = |db: &PodAdditions| desired_hash(&desired_deployment(&subject(&a), db)).unwrap();
        assert_eq!(hash(&pod_db(true, "r1")), hash(&pod_db(true, "r1")));
        assert_ne!(hash(&pod_db(true, "r1")), hash(&pod_db(true, "r2")));
        assert_ne!(hash(&pod_db(true, "r1")), hash(&pod_db(false, "r1")));
        // Nothing added is another object again (`desired.rs` pins its hash to what
        // earlier releases built).
        assert_ne!(hash(&pod_db(false, "r1")), hash(&PodAdditions::default()));
    }

    /// Our node spread is put back as we build it; a spread another writer adds stays,
    /// and each repair converges in one patch.
    #[test]
    fn the_node_spread_is_ours_and_other_spreads_are_kept() {
        use k8s_openapi::api::core::v1::TopologySpreadConstraint;
        let d = desired_deployment(&subject(&stored("web", spec())), &PodAdditions::default());
        let live = as_stored(d.clone());
        assert!(deployment_drift(&d, &live).is_empty());
        fn spreads(d: &mut Deployment) -> &mut Vec<TopologySpreadConstraint> {
            d.spec
                .template
                .spec
                .as_mut()
                .unwrap()
                .topology_spread_constraints
                .get_or_insert_with(Vec::new)
        }
        // A zone spread added before ours: theirs, no drift.
        let mut zoned = live.clone();
        spreads(&mut zoned).insert(
            0,
            TopologySpreadConstraint {
                max_skew: 2,
                topology_key: "topology.kubernetes.io/zone".into(),
                when_unsatisfiable: "DoNotSchedule".into(),
                ..TopologySpreadConstraint::default()
            },
        );
        assert!(deployment_drift(&d, &zoned).is_empty());
        // Ours made a hard rule: replaced at its index, guarded by its key.
        let mut hard = zoned.clone();
        spreads(&mut hard)[1].when_unsatisfiable = "DoNotSchedule".into();
        let ops = deployment_drift(&d, &hard);
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/spec/template/spec/topologySpreadConstraints/1/topologyKey", "value": "kubernetes.io/hostname"})
        );
        assert_eq!(ops.len(), 2);
        let fixed = patched(&hard, &ops);
        assert!(deployment_drift(&d, &fixed).is_empty());
        assert_eq!(spreads(&mut fixed.clone()).len(), 2);
        // Ours removed (the list gone): added back.
        let mut none = live.clone();
        none.spec
            .template
            .spec
            .as_mut()
            .unwrap()
            .topology_spread_constraints = None;
        let ops = deployment_drift(&d, &none);
        assert_eq!(ops.len(), 1);
        assert!(deployment_drift(&d, &patched(&none, &ops)).is_empty());
    }

    #[test]
    fn a_budget_loosened_by_another_writer_is_put_back_in_one_patch() {
        use crate::desired::desired_budget;
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let budget_drift = |desired: &PodDisruptionBudget, live: &PodDisruptionBudget| {
            BudgetView::drift(&of(desired).unwrap(), &of(live).unwrap())
        };
        let want = desired_budget(&subject(&stored("web", spec()))).unwrap();
        assert!(budget_drift(&want, &want).is_empty());
        let mut loose = want.clone();
        let spec = loose.spec.as_mut().unwrap();
        spec.max_unavailable = None;
        spec.min_available = Some(IntOrString::Int(0));
        spec.unhealthy_pod_eviction_policy = None;
        spec.selector.as_mut().unwrap().match_labels =
            Some(BTreeMap::from([("app".into(), "other".into())]));
        loose.metadata.labels = None;
        let ops = budget_drift(&want, &loose);
        let mut v = serde_json::to_value(&loose).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
        let fixed: PodDisruptionBudget = serde_json::from_value(v).unwrap();
        assert!(budget_drift(&want, &fixed).is_empty(), "{ops:?}");
        assert_eq!(fixed.spec.unwrap().min_available, None);
    }
}
