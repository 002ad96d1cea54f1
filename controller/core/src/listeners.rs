//! TLS for exposed AppServices: an HTTPS listener per host name on the configured
//! Gateway, with the certificate of the AppService's Secret.
//!
//! The Gateway is the cluster admin's, and shared: every AppService with
//! `spec.expose.tls` adds its own listeners to it by server-side apply, each AppService
//! as a field manager of its own (`appservice-controller/<uid>`). The listeners are a
//! map keyed by name, so each manager owns exactly its entries: an apply adds, changes or
//! removes only those, never the admin's listeners or another AppService's, and the
//! AppService's deletion (behind its finalizer) applies none, which removes them.
//!
//! A listener admits routes from its AppService's namespace only (a selector on
//! `kubernetes.io/metadata.name`), so no other tenant's route can take HTTPS traffic for
//! the host name; it reads the Secret through a ReferenceGrant in that namespace that
//! names the Secret alone. The Gateway API bounds a Gateway to 64 listeners: the admin's
//! and these together. A Gateway that is full refuses the apply, and the AppService says so.

use std::collections::BTreeMap;

use common::names::FIELD_MANAGER;
use common::types::ExposeSpec;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::gateway_api::{GROUP, GatewayView};

/// The prefix of every listener name the controller adds.
pub const LISTENER_PREFIX: &str = "appsvc-";

/// The field manager of one AppService's listeners.
pub fn field_manager(uid: &str) -> String {
    format!("{FIELD_MANAGER}/{uid}")
}

/// The listener of `hostname`: its name from a digest of the host name (a host name
/// belongs to one AppService, so the name does too), at most 7 + 20 characters.
pub fn listener_name(hostname: &str) -> String {
    let digest = Sha256::digest(hostname.as_bytes());
    let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    format!("{LISTENER_PREFIX}{hex}")
}

/// The HTTPS listeners an AppService in `namespace` asks for, by name: one per host name
/// on `port`, terminating TLS with its Secret, admitting HTTPRoutes of its namespace only.
/// Every field the API server defaults is written, so the listener read back equals it.
pub fn desired_listeners(
    (namespace, app): (&str, &str),
    expose: &ExposeSpec,
    port: i32,
) -> BTreeMap<String, Value> {
    let Some(tls) = expose.tls.as_ref() else {
        return BTreeMap::new();
    };
    let secret = tls.secret(app);
    expose
        .hostnames
        .iter()
        .map(|host| {
            let name = listener_name(host);
            let listener = json!({
                "name": name,
                "hostname": host,
                "port": port,
                "protocol": "HTTPS",
                "tls": {
                    "mode": "Terminate",
                    "certificateRefs": [{
                        "group": "", "kind": "Secret",
                        "namespace": namespace, "name": secret,
                    }],
                },
                "allowedRoutes": {
                    "namespaces": {
                        "from": "Selector",
                        "selector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    },
                    "kinds": [{"group": GROUP, "kind": "HTTPRoute"}],
                },
            });
            (name, listener)
        })
        .collect()
}

/// Makes the listeners of the AppService `app` on the configured Gateway what it asks
/// for (`want`: none when it asks for no TLS, or its host names are held by another),
/// by one server-side apply when the cached Gateway differs. Returns whether they serve
/// (`Ok(true)`: programmed; `Err`: the Gateway or the API server refused them, in their
/// words).
pub async fn converge(
    ctx: &crate::context::Context,
    app: &crate::subject::Subject<'_>,
    want: &BTreeMap<String, Value>,
) -> Result<bool, String> {
    let Some(gateway) = ctx.config().expose_gateway.as_ref() else {
        return Ok(want.is_empty());
    };
    let cached = ctx.caches().gateway.state().into_iter().next();
    let cached = cached.as_deref();
    // An apply would create a Gateway that is missing (and fail: it names no class).
    if cached.is_none() && !want.is_empty() {
        return Err(format!("Gateway {gateway} does not exist"));
    }
    if let Plan::Apply(listeners) = plan(cached, app.uid(), want) {
        let api: kube::Api<GatewayView> =
            kube::Api::namespaced(ctx.client().clone(), &gateway.namespace);
        let params = kube::api::PatchParams::apply(&field_manager(app.uid()));
        let body = apply_body(&gateway.namespace, &gateway.name, listeners);
        let result = api
            .patch(&gateway.name, &params, &kube::api::Patch::Apply(&body))
            .await;
        ctx.metrics().write(crate::metrics::Written::Gateways);
        match result {
            // Served once the Gateway's controller programs them: its status update wakes us.
            Ok(_) => return if want.is_empty() { Ok(true) } else { Ok(false) },
            Err(kube::Error::Api(status)) => {
                return Err(format!(
                    "Gateway {gateway} refused the HTTPS listeners: {}",
                    status.message
                ));
            }
            Err(e) => return Err(format!("the HTTPS listeners were not written: {e}")),
        }
    }
    serving(cached, want)
}

/// The AppServices in `apps` that ask for TLS: those with listeners on the Gateway.
pub fn with_tls(
    apps: &kube::runtime::reflector::Store<common::AppService>,
) -> Vec<kube::runtime::reflector::ObjectRef<common::AppService>> {
    apps.state()
        .iter()
        .filter(|app| app.spec.expose.as_ref().is_some_and(|e| e.tls.is_some()))
        .map(|app| kube::runtime::reflector::ObjectRef::from_obj(&**app))
        .collect()
}

/// What to do about an AppService's listeners on the Gateway as cached.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// They are as desired (none, or all with the desired content, and no other of ours).
    Converged,
    /// Apply exactly these (an empty list removes all of this AppService's).
    Apply(Vec<Value>),
}

/// Compares the desired listeners of the AppService `uid` with the Gateway.
pub fn plan(gateway: Option<&GatewayView>, uid: &str, desired: &BTreeMap<String, Value>) -> Plan {
    let manager = field_manager(uid);
    let owned: &[String] = gateway
        .and_then(|g| g.owned.get(&manager))
        .map_or(&[], Vec::as_slice);
    let same_names = owned.len() == desired.len() && owned.iter().all(|n| desired.contains_key(n));
    let same_content = desired
        .iter()
        .all(|(name, want)| gateway.and_then(|g| g.listeners.get(name)) == Some(want));
    if same_names && same_content {
        Plan::Converged
    } else {
        Plan::Apply(desired.values().cloned().collect())
    }
}

/// The server-side apply body that makes this AppService's listeners `listeners`.
pub fn apply_body(namespace: &str, name: &str, listeners: Vec<Value>) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{}", crate::gateway_api::VERSION),
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"listeners": listeners},
    })
}

/// Why a desired listener does not serve yet, from the Gateway's status: `Err` with the
/// Gateway's words when it refused one (a Secret missing or not a certificate, a
/// conflict with another listener), `Ok(false)` while one is not programmed yet.
pub fn serving(
    gateway: Option<&GatewayView>,
    desired: &BTreeMap<String, Value>,
) -> Result<bool, String> {
    let mut all = true;
    for name in desired.keys() {
        let conditions = gateway.and_then(|g| g.status.get(name));
        let Some(conditions) = conditions else {
            all = false;
            continue;
        };
        for c in conditions {
            let bad = match c.type_.as_str() {
                "ResolvedRefs" | "Accepted" | "Programmed" => c.status == "False",
                "Conflicted" => c.status == "True",
                _ => false,
            };
            if bad && c.type_ != "Programmed" {
                let host = desired
                    .get(name)
                    .and_then(|l| l.get("hostname"))
                    .and_then(Value::as_str)
                    .unwrap_or(name);
                return Err(format!("listener for {host}: {}: {}", c.reason, c.message));
            }
        }
        let programmed = conditions
            .iter()
            .any(|c| c.type_ == "Programmed" && c.status == "True");
        all &= programmed;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::types::ExposeTls;

    fn expose(hosts: &[&str], tls: bool) -> ExposeSpec {
        ExposeSpec {
            hostnames: hosts.iter().map(|h| (*h).to_owned()).collect(),
            tls: tls.then(|| ExposeTls {
                secret_name: Some("shop-tls".into()),
                issuer_ref: None,
            }),
            ..ExposeSpec::default()
        }
    }

    fn gateway(
        listeners: Vec<Value>,
        managed: Vec<(&str, Vec<&str>)>,
        status: Value,
    ) -> GatewayView {
        let managed_fields: Vec<Value> = managed
            .into_iter()
            .map(|(manager, names)| {
                let keys: serde_json::Map<String, Value> = names
                    .into_iter()
                    .map(|n| (format!("k:{{\"name\":\"{n}\"}}"), json!({})))
                    .collect();
                json!({"manager": manager, "operation": "Apply", "apiVersion": "gateway.networking.k8s.io/v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:listeners": keys}}})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "public", "namespace": "gateways", "managedFields": managed_fields},
            "spec": {"listeners": listeners},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn one_https_listener_per_host_name_admitting_its_namespace_only() {
        assert!(
            desired_listeners(("team", "shop"), &expose(&["a.example.com"], false), 443).is_empty()
        );
        let listeners = desired_listeners(
            ("team", "shop"),
            &expose(&["a.example.com", "b.example.com"], true),
            443,
        );
        assert_eq!(listeners.len(), 2);
        let a = &listeners[&listener_name("a.example.com")];
        assert_eq!(a["hostname"], "a.example.com");
        assert_eq!(a["protocol"], "HTTPS");
        assert_eq!(
            a["tls"]["certificateRefs"][0],
            json!({"group": "", "kind": "Secret", "namespace": "team", "name": "shop-tls"})
        );
        assert_eq!(
            a["allowedRoutes"]["namespaces"]["selector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "team"
        );
        let name = listener_name("a.example.com");
        assert!(
            name.starts_with(LISTENER_PREFIX) && name.len() == 27,
            "{name}"
        );
        assert_ne!(name, listener_name("b.example.com"));
    }

    #[test]
    fn the_plan_applies_only_what_differs_and_removes_what_is_no_longer_asked() {
        let desired = desired_listeners(("team", "shop"), &expose(&["a.example.com"], true), 443);
        let ours = desired.values().next().unwrap().clone();
        let name = listener_name("a.example.com");
        let manager = field_manager("uid-1");
        let admin = json!({"name": "http", "port": 80, "protocol": "HTTP"});
        // Nothing there yet: apply.
        let empty = gateway(
            vec![admin.clone()],
            vec![("admin", vec!["http"])],
            json!({}),
        );
        assert_eq!(
            plan(Some(&empty), "uid-1", &desired),
            Plan::Apply(vec![ours.clone()])
        );
        // There, ours, as desired: nothing to do.
        let there = gateway(
            vec![admin.clone(), ours.clone()],
            vec![("admin", vec!["http"]), (&manager, vec![&name])],
            json!({}),
        );
        assert_eq!(there.owned.get("admin"), None, "only our managers are kept");
        assert_eq!(plan(Some(&there), "uid-1", &desired), Plan::Converged);
        // Edited by someone: apply again.
        let mut edited = ours.clone();
        edited["port"] = json!(8443);
        let edited = gateway(vec![edited], vec![(&manager, vec![&name])], json!({}));
        assert_eq!(
            plan(Some(&edited), "uid-1", &desired),
            Plan::Apply(vec![ours])
        );
        // No longer asked for: apply none, which removes ours.
        assert_eq!(
            plan(Some(&there), "uid-1", &BTreeMap::new()),
            Plan::Apply(vec![])
        );
        assert_eq!(
            plan(Some(&empty), "uid-1", &BTreeMap::new()),
            Plan::Converged
        );
    }

    #[test]
    fn a_listener_serves_once_programmed_and_a_refusal_is_quoted() {
        let desired = desired_listeners(("team", "shop"), &expose(&["a.example.com"], true), 443);
        let name = listener_name("a.example.com");
        let status =
            |conditions: Value| json!({"listeners": [{"name": name, "conditions": conditions}]});
        assert_eq!(serving(None, &desired), Ok(false));
        let pending = gateway(
            vec![],
            vec![],
            status(
                json!([{"type": "Programmed", "status": "False", "reason": "Pending", "message": ""}]),
            ),
        );
        assert_eq!(serving(Some(&pending), &desired), Ok(false));
        let ok = gateway(
            vec![],
            vec![],
            status(json!([
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
                {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": ""},
                {"type": "Programmed", "status": "True", "reason": "Programmed", "message": ""},
            ])),
        );
        assert_eq!(serving(Some(&ok), &desired), Ok(true));
        let refused = gateway(
            vec![],
            vec![],
            status(json!([
                {"type": "ResolvedRefs", "status": "False", "reason": "InvalidCertificateRef", "message": "secret team/shop-tls not found"},
            ])),
        );
        assert_eq!(
            serving(Some(&refused), &desired),
            Err(
                "listener for a.example.com: InvalidCertificateRef: secret team/shop-tls not found"
                    .into()
            )
        );
        assert_eq!(serving(Some(&refused), &BTreeMap::new()), Ok(true));
    }
}
