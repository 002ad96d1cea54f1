//! The Gateway API (v1.4.0, the standard channel) as the tests use it: its CRDs, which the
//! asset build copies from the module Traefik is built with, installed on any control
//! plane (a node or none); the API resources of the kinds the tests write; and the
//! conditions an implementation reports on a Gateway, its listeners and its routes.
//! [`crate::RealNode::gateway`] runs an implementation of it.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::crds::{FIELD_MANAGER, load_crd, wait_served};
use crate::error::{Error, Result, kube as kube_err};

/// The API group of the Gateway API.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// The directory of the CRDs (built with Traefik on first use; see
/// [`crate::assets::gateway_api_dir`]).
pub fn crd_dir() -> Result<PathBuf> {
    crate::assets::gateway_api_dir()
}

/// The CRDs of [`crd_dir`], sorted by file name, without the empty status the files carry.
pub fn load_crds() -> Result<Vec<CustomResourceDefinition>> {
    let dir = crd_dir()?;
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::Crd {
        path: dir.clone(),
        reason: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("gateway.networking.k8s.io_") && n.ends_with(".yaml")
            })
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let mut crd = load_crd(path)?;
            crd.status = None;
            Ok(crd)
        })
        .collect()
}

/// Server-side applies the Gateway API CRDs (idempotent) and waits until each is
/// `Established` and every served version lists. For any control plane: the plain and
/// full ones the controller's tests use as well as one with a real node. Fails naming
/// `build.sh --only traefik` when the CRDs are not built and cannot be.
pub async fn install_crds(client: &kube::Client) -> Result<()> {
    let crds = load_crds()?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(kube_err(format!("installing the Gateway API CRD {name}")))?;
    }
    for crd in &crds {
        wait_served(&api, crd).await?;
    }
    Ok(())
}

/// Server-side applies cert-manager's `Certificate` CRD (v1.21.2; idempotent) and waits
/// until it is served: the Certificates the controller writes are then checked against
/// its schema by the API server. No cert-manager controller runs (none can be built here).
pub async fn install_cert_manager_crds(client: &kube::Client) -> Result<()> {
    let path = crate::assets::cert_manager_dir()?.join("cert-manager.io_certificates.yaml");
    let mut crd = load_crd(&path)?;
    crd.status = None;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .map_err(kube_err(format!("installing the cert-manager CRD {name}")))?;
    wait_served(&api, &crd).await
}

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), plural)
}

/// `GatewayClass` (`v1`, cluster-scoped).
pub fn gateway_class() -> ApiResource {
    resource("v1", "GatewayClass", "gatewayclasses")
}

/// `Gateway` (`v1`).
pub fn gateway() -> ApiResource {
    resource("v1", "Gateway", "gateways")
}

/// `HTTPRoute` (`v1`).
pub fn http_route() -> ApiResource {
    resource("v1", "HTTPRoute", "httproutes")
}

/// `ReferenceGrant` (`v1beta1`, the version the standard channel serves).
pub fn reference_grant() -> ApiResource {
    resource("v1beta1", "ReferenceGrant", "referencegrants")
}

/// The condition `type_` among `conditions` (a JSON array of metav1 Conditions).
fn find(conditions: &Value, type_: &str) -> Option<Condition> {
    conditions
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| serde_json::from_value(c.clone()).ok())
}

/// The condition `type_` of an object's `status.conditions` (a Gateway, a GatewayClass).
pub fn condition(object: &DynamicObject, type_: &str) -> Option<Condition> {
    find(&object.data["status"]["conditions"], type_)
}

/// The condition `type_` of the Gateway's listener `listener` (`status.listeners[]`).
pub fn listener_condition(
    gateway: &DynamicObject,
    listener: &str,
    type_: &str,
) -> Option<Condition> {
    let listeners = gateway.data["status"]["listeners"].as_array()?;
    let status = listeners.iter().find(|l| l["name"] == listener)?;
    find(&status["conditions"], type_)
}

/// The condition `type_` an HTTPRoute reports for its parent reference to the Gateway
/// `namespace/name` at listener `section` (`status.parents[]`).
pub fn route_condition(
    route: &DynamicObject,
    (namespace, name, section): (&str, &str, &str),
    type_: &str,
) -> Option<Condition> {
    let parents = route.data["status"]["parents"].as_array()?;
    let parent = parents.iter().find(|p| {
        let r = &p["parentRef"];
        r["name"] == name && r["namespace"] == namespace && r["sectionName"] == section
    })?;
    find(&parent["conditions"], type_)
}

/// The names of the Gateway's listeners in its spec, in order.
pub fn listener_names(gateway: &DynamicObject) -> Vec<String> {
    gateway.data["spec"]["listeners"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(data: Value) -> DynamicObject {
        DynamicObject::new("public", &super::gateway()).data(data)
    }

    const TIME: &str = "2026-12-07T10:00:00Z";

    #[test]
    fn conditions_are_read_per_listener_and_per_parent() {
        let gw = gateway(serde_json::json!({
            "spec": {"listeners": [{"name": "http"}, {"name": "tenant-https"}]},
            "status": {
                "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed",
                                "message": "", "lastTransitionTime": TIME, "observedGeneration": 3}],
                "listeners": [
                    {"name": "http", "conditions": [{"type": "ResolvedRefs", "status": "True",
                        "reason": "ResolvedRefs", "message": "", "lastTransitionTime": TIME}]},
                    {"name": "tenant-https", "conditions": [{"type": "ResolvedRefs", "status": "False",
                        "reason": "RefNotPermitted", "message": "no grant", "lastTransitionTime": TIME}]},
                ],
            },
        }));
        let programmed = condition(&gw, "Programmed").map(|c| (c.status, c.observed_generation));
        assert_eq!(programmed, Some(("True".to_owned(), Some(3))));
        let refs = listener_condition(&gw, "tenant-https", "ResolvedRefs").map(|c| c.reason);
        assert_eq!(refs.as_deref(), Some("RefNotPermitted"));
        assert!(listener_condition(&gw, "tenant-https", "Programmed").is_none());
        assert!(listener_condition(&gw, "missing", "ResolvedRefs").is_none());
        assert_eq!(listener_names(&gw), ["http", "tenant-https"]);

        let route = DynamicObject::new("hello", &http_route()).data(serde_json::json!({
            "status": {"parents": [{
                "parentRef": {"name": "public", "namespace": "gw", "sectionName": "http"},
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                "message": "", "lastTransitionTime": TIME}],
            }]},
        }));
        let accepted = route_condition(&route, ("gw", "public", "http"), "Accepted");
        assert_eq!(accepted.map(|c| c.status).as_deref(), Some("True"));
        assert!(route_condition(&route, ("gw", "public", "https"), "Accepted").is_none());
    }
}
