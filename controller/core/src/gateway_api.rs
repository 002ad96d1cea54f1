//! The Gateway API kind the controller writes, an `HTTPRoute` (`gateway.networking.k8s.io/v1`),
//! as much of it as the controller sets and reads. The project's Kubernetes types
//! (k8s-openapi) do not include the Gateway API, and its published Rust bindings follow
//! other kube releases; the handful of fields below are all an AppService needs.
//!
//! Every field the API server defaults is written explicitly (the parent's group and
//! kind, the match type, the backend's group, kind and weight): the route read back then
//! equals the route built, and a difference is someone else's edit.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The Gateway API's group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The version of the Gateway API kinds the controller writes (standard channel, v1.0+).
pub const VERSION: &str = "v1";

/// An `HTTPRoute`: requests for `hostnames` that reach the parent Gateways, matched by
/// path, sent to Services. Serialized with its `apiVersion` and `kind`, as the API
/// server wants a body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct HttpRoute {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RouteStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<RouteRule>,
}

/// A Gateway (or one of its listeners, by `sectionName`) a route attaches to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

impl ParentRef {
    /// The Gateway `namespace/name`, every listener of it that accepts the route.
    pub fn gateway(namespace: &str, name: &str) -> Self {
        ParentRef {
            group: GROUP.to_owned(),
            kind: "Gateway".to_owned(),
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            section_name: None,
        }
    }

    /// Whether `self` (as a route's status names it) is the Gateway `namespace/name`.
    /// A status written without `namespace` means the route's own namespace.
    pub fn is_gateway(&self, namespace: &str, name: &str, route_namespace: &str) -> bool {
        (self.group.is_empty() || self.group == GROUP)
            && (self.kind.is_empty() || self.kind == "Gateway")
            && self.name == name
            && self.namespace.as_deref().unwrap_or(route_namespace) == namespace
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRule {
    #[serde(default)]
    pub matches: Vec<RouteMatch>,
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteMatch {
    pub path: PathMatch,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub type_: String,
    pub value: String,
}

impl PathMatch {
    /// Every path that starts with `prefix` (by whole segments, as the Gateway API says).
    pub fn prefix(prefix: &str) -> Self {
        PathMatch {
            type_: "PathPrefix".to_owned(),
            value: prefix.to_owned(),
        }
    }
}

/// A Service (and its port) requests are sent to, with its share of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendRef {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

impl BackendRef {
    /// The Service `name` on `port`, weight 1 (the API's default, written out).
    pub fn service(name: &str, port: i32) -> Self {
        BackendRef {
            group: String::new(),
            kind: "Service".to_owned(),
            name: name.to_owned(),
            port: Some(port),
            weight: Some(1),
        }
    }
}

/// What the Gateways' implementations say of a route, one entry per parent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    #[serde(default)]
    pub parent_ref: ParentRef,
    #[serde(default)]
    pub conditions: Vec<RouteCondition>,
}

/// A condition of a route on one parent (`Accepted`, `ResolvedRefs`), as much as status
/// reports of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(
        default,
        rename = "observedGeneration",
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
}

/// A kind's JSON: `apiVersion` and `kind` first, then its fields.
#[derive(Serialize)]
pub(crate) struct Typed<'a, S: Serialize> {
    #[serde(rename = "apiVersion")]
    pub(crate) api_version: Cow<'a, str>,
    pub(crate) kind: Cow<'a, str>,
    pub(crate) metadata: &'a ObjectMeta,
    #[serde(flatten)]
    pub(crate) rest: S,
}

impl Serialize for HttpRoute {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Rest<'a> {
            spec: &'a RouteSpec,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<RouteStatus>,
        }
        Typed {
            api_version: Self::api_version(&()),
            kind: Self::kind(&()),
            metadata: &self.metadata,
            rest: Rest {
                spec: &self.spec,
                status: &self.status,
            },
        }
        .serialize(serializer)
    }
}

impl Serialize for ReferenceGrant {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Rest<'a> {
            spec: &'a GrantSpec,
        }
        Typed {
            api_version: Self::api_version(&()),
            kind: Self::kind(&()),
            metadata: &self.metadata,
            rest: Rest { spec: &self.spec },
        }
        .serialize(serializer)
    }
}

impl Resource for HttpRoute {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "HTTPRoute".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        format!("{GROUP}/{VERSION}").into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "httproutes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A `ReferenceGrant`: lets objects of the `from` kinds in other namespaces refer to the
/// `to` objects of its own namespace. The one an AppService with `spec.expose.tls` gets
/// lets the configured Gateway read its TLS Secret, and nothing else.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ReferenceGrant {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GrantSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrantSpec {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Resource for ReferenceGrant {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ReferenceGrant".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    // v1beta1: the only version of ReferenceGrant in the standard channel up to v1.4.
    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        format!("{GROUP}/v1beta1").into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "referencegrants".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the controller keeps of the configured Gateway: its listeners (as JSON), which
/// of them each AppService's field manager owns, and what the Gateway's controller says
/// of each listener.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "RawGateway")]
pub struct GatewayView {
    pub metadata: ObjectMeta,
    pub listeners: BTreeMap<String, Value>,
    /// Listener names by field manager, for the managers of AppServices only.
    pub owned: BTreeMap<String, Vec<String>>,
    pub status: BTreeMap<String, Vec<RouteCondition>>,
}

#[derive(Deserialize)]
struct RawGateway {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: RawGatewaySpec,
    #[serde(default)]
    status: Option<RawGatewayStatus>,
}

#[derive(Default, Deserialize)]
struct RawGatewaySpec {
    #[serde(default)]
    listeners: Vec<Value>,
}

#[derive(Deserialize)]
struct RawGatewayStatus {
    #[serde(default)]
    listeners: Vec<RawListenerStatus>,
}

#[derive(Deserialize)]
struct RawListenerStatus {
    name: String,
    #[serde(default)]
    conditions: Vec<RouteCondition>,
}

impl From<RawGateway> for GatewayView {
    fn from(mut raw: RawGateway) -> Self {
        let prefix = format!("{}/", common::names::FIELD_MANAGER);
        let mut owned = BTreeMap::new();
        for entry in raw.metadata.managed_fields.take().unwrap_or_default() {
            let Some(manager) = entry.manager.filter(|m| m.starts_with(&prefix)) else {
                continue;
            };
            let names = entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer("/f:spec/f:listeners"))
                .and_then(Value::as_object)
                .map(|keys| keys.keys().filter_map(|k| listener_key(k)).collect())
                .unwrap_or_default();
            owned.insert(manager, names);
        }
        let listeners = raw
            .spec
            .listeners
            .into_iter()
            .filter_map(|l| Some((l.get("name")?.as_str()?.to_owned(), l)))
            .collect();
        let status = raw
            .status
            .map(|s| {
                s.listeners
                    .into_iter()
                    .map(|l| (l.name, l.conditions))
                    .collect()
            })
            .unwrap_or_default();
        raw.metadata.annotations = None;
        GatewayView {
            metadata: raw.metadata,
            listeners,
            owned,
            status,
        }
    }
}

/// The name in a managedFields key of a listener (`k:{"name":"appsvc-..."}`).
fn listener_key(key: &str) -> Option<String> {
    let json = key.strip_prefix("k:")?;
    let value: Value = serde_json::from_str(json).ok()?;
    Some(value.get("name")?.as_str()?.to_owned())
}

impl Resource for GatewayView {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Gateway".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        VERSION.into()
    }
    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        format!("{GROUP}/{}", VERSION).into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "gateways".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
