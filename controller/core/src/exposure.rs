//! Exposure (`spec.expose`): who holds a host name, whether the Gateway accepted an
//! AppService's route, and where the AppService then answers.
//!
//! A host name belongs to one AppService in the cluster. The webhook refuses a second
//! claim while the first is in its cache; two claims that both got through (written
//! within the webhook cache's lag, or before the webhook watched) are settled here the
//! way the Gateway API settles two routes for the same host: the oldest AppService (by
//! creation, then namespace and name) keeps it, and the other makes no route and says
//! so (`ExposureConflict`) until the name is free. Both sides decide alike from the
//! same cache, so the outcome does not depend on which one reconciles first.

use std::cmp::Ordering;

use common::AppService;
use common::types::ExposeSpec;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::config::GatewayRef;
use crate::view::{IngressView, RouteView};

/// What a pass found of an AppService's exposure; `None` in status when it asks for none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// No Gateway is configured (the chart's `controller.expose.gateway`).
    Unavailable,
    /// These host names are held by an older AppService: no route is made.
    Conflict(Vec<String>),
    /// The route is written and something it needs is not there yet: `waiting` says
    /// what, as in "waiting for ...".
    Pending { waiting: String },
    /// The Gateway (or cert-manager, or the API server) refused what exposure needs;
    /// `message` says who and quotes them.
    Refused { message: String },
    /// The Gateway accepted the route: the application answers at `url`.
    Accepted { url: String },
}

/// The host names of `app` that an older AppService in `apps` also asks for.
pub fn held_by_others(apps: &Store<AppService>, app: &AppService) -> Vec<String> {
    let Some(expose) = app.spec.expose.as_ref() else {
        return Vec::new();
    };
    let mut held: Vec<String> = Vec::new();
    for other in apps.state() {
        if other.metadata.uid == app.metadata.uid || other.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(theirs) = other.spec.expose.as_ref() else {
            continue;
        };
        if older(&other, app) != Ordering::Less {
            continue;
        }
        for host in &expose.hostnames {
            if theirs.hostnames.contains(host) && !held.contains(host) {
                held.push(host.clone());
            }
        }
    }
    held.sort();
    held
}

/// `Less` when `a` was created before `b` (ties: by namespace, then name).
fn older(a: &AppService, b: &AppService) -> Ordering {
    let created = |x: &AppService| x.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match (created(a), created(b)) {
        (Some(x), Some(y)) if x != y => x.cmp(&y),
        _ => (a.namespace(), a.name_any()).cmp(&(b.namespace(), b.name_any())),
    }
}

/// The AppServices in `apps` other than `owner` that ask for one of `hostnames`: an
/// event of `owner`'s route (deleted, or its host names changed) may free one for them.
pub fn waiting_for(
    apps: &Store<AppService>,
    hostnames: &[String],
    owner: Option<&ObjectRef<AppService>>,
) -> Vec<ObjectRef<AppService>> {
    if hostnames.is_empty() {
        return Vec::new();
    }
    apps.state()
        .iter()
        .filter(|app| {
            app.spec
                .expose
                .as_ref()
                .is_some_and(|e| e.hostnames.iter().any(|h| hostnames.contains(h)))
        })
        .map(|app| ObjectRef::from_obj(&**app))
        .filter(|key| Some(key) != owner)
        .collect()
}

/// The host names a route (as cached) is for.
pub fn route_hostnames(route: &RouteView) -> Vec<String> {
    route
        .spec
        .as_ref()
        .and_then(|spec| spec.get("hostnames"))
        .and_then(|h| h.as_array())
        .map(|hosts| {
            hosts
                .iter()
                .filter_map(|h| h.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The host names an Ingress (as cached) is for, from its rules.
pub fn ingress_hostnames(ingress: &IngressView) -> Vec<String> {
    ingress
        .spec
        .as_ref()
        .and_then(|spec| spec.get("rules"))
        .and_then(|r| r.as_array())
        .map(|rules| {
            rules
                .iter()
                .filter_map(|r| r.get("host")?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What the Gateway `gateway` says of `route` (our live route, as cached or as the
/// last write returned it): accepted for its current generation, refused, or not yet.
pub fn acceptance(route: &RouteView, gateway: &GatewayRef, expose: &ExposeSpec) -> Exposure {
    let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
    let generation = route.metadata.generation;
    let accepted = route
        .parents
        .iter()
        .filter(|p| {
            p.parent_ref
                .is_gateway(&gateway.namespace, &gateway.name, namespace)
        })
        .flat_map(|p| p.conditions.iter())
        .find(|c| {
            c.type_ == "Accepted"
                && (c.observed_generation.is_none() || c.observed_generation == generation)
        });
    match accepted {
        Some(c) if c.status == "True" => Exposure::Accepted { url: url(expose) },
        Some(c) if c.status == "False" => Exposure::Refused {
            message: if c.message.is_empty() {
                format!("Gateway {gateway} refused the route: {}", c.reason)
            } else {
                format!(
                    "Gateway {gateway} refused the route: {}: {}",
                    c.reason, c.message
                )
            },
        },
        _ => Exposure::Pending {
            waiting: accepting(gateway),
        },
    }
}

/// What a route not yet accepted waits for.
pub fn accepting(gateway: &GatewayRef) -> String {
    format!("for Gateway {gateway} to accept the route")
}

/// Where the application answers: its first host name and path, over HTTPS when the
/// Gateway terminates TLS for it.
pub fn url(expose: &ExposeSpec) -> String {
    let scheme = if expose.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let host = expose.hostnames.first().map_or("", String::as_str);
    let path = expose.paths().first().copied().unwrap_or("/");
    format!("{scheme}://{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_api::{ParentRef, RouteCondition, RouteParentStatus};
    use common::testing::stored;
    use common::{AppServiceSpec, ExposeTls};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn app(namespace: &str, name: &str, created: i64, hosts: &[&str]) -> AppService {
        let mut app = stored(
            name,
            AppServiceSpec {
                image: "registry.example.com/shop:1".into(),
                expose: Some(ExposeSpec {
                    hostnames: hosts.iter().map(|h| (*h).to_owned()).collect(),
                    ..ExposeSpec::default()
                }),
                ..AppServiceSpec::default()
            },
        );
        app.metadata.namespace = Some(namespace.into());
        app.metadata.uid = Some(format!("{namespace}-{name}"));
        app.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        app
    }

    fn store(apps: &[AppService]) -> Store<AppService> {
        let mut writer = Writer::<AppService>::default();
        writer.apply_watcher_event(&Event::Init);
        for a in apps {
            writer.apply_watcher_event(&Event::InitApply(a.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        writer.as_reader()
    }

    #[test]
    fn the_oldest_keeps_a_host_name_whoever_reconciles() {
        let first = app(
            "team-a",
            "shop",
            100,
            &["shop.example.com", "a.example.com"],
        );
        let second = app(
            "team-b",
            "shop",
            200,
            &["shop.example.com", "b.example.com"],
        );
        let apps = store(&[first.clone(), second.clone()]);
        assert!(held_by_others(&apps, &first).is_empty());
        assert_eq!(held_by_others(&apps, &second), ["shop.example.com"]);
        // Created in the same second: namespace, then name, decide.
        let twin = app("team-0", "shop", 100, &["a.example.com"]);
        let apps = store(&[first.clone(), twin.clone()]);
        assert_eq!(held_by_others(&apps, &first), ["a.example.com"]);
        assert!(held_by_others(&apps, &twin).is_empty());
        // A terminating holder frees it.
        let mut leaving = first.clone();
        leaving.metadata.deletion_timestamp = leaving.metadata.creation_timestamp.clone();
        assert!(held_by_others(&store(&[leaving, second.clone()]), &second).is_empty());
        // The route of `first` changing wakes `second` only.
        let waiting = waiting_for(
            &store(&[first.clone(), second]),
            &["shop.example.com".to_owned()],
            Some(&ObjectRef::from_obj(&first)),
        );
        assert_eq!(waiting, [ObjectRef::new("shop").within("team-b")]);
    }

    #[test]
    fn a_route_is_accepted_for_its_generation_by_our_gateway_only() {
        let gateway = GatewayRef {
            namespace: "gateways".into(),
            name: "public".into(),
        };
        let expose = ExposeSpec {
            hostnames: vec!["shop.example.com".into()],
            paths: vec!["/api".into()],
            port: None,
            tls: Some(ExposeTls {
                secret_name: Some("shop-tls".into()),
                issuer_ref: None,
            }),
        };
        let mut route: RouteView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shop", "namespace": "team", "generation": 2},
            "spec": {"hostnames": ["shop.example.com"]},
        }))
        .unwrap();
        assert_eq!(route_hostnames(&route), ["shop.example.com"]);
        let parent = |ns: &str, status: &str, generation: i64| RouteParentStatus {
            parent_ref: ParentRef::gateway(ns, "public"),
            conditions: vec![RouteCondition {
                type_: "Accepted".into(),
                status: status.into(),
                reason: "NotAllowedByListeners".into(),
                message: "no listener admits the route".into(),
                observed_generation: Some(generation),
            }],
        };
        assert!(matches!(
            acceptance(&route, &gateway, &expose),
            Exposure::Pending { .. }
        ));
        route.parents = vec![parent("elsewhere", "True", 2)];
        assert!(matches!(
            acceptance(&route, &gateway, &expose),
            Exposure::Pending { .. }
        ));
        route.parents = vec![parent("gateways", "True", 1)];
        assert!(
            matches!(
                acceptance(&route, &gateway, &expose),
                Exposure::Pending { .. }
            ),
            "accepted for an older generation"
        );
        route.parents = vec![parent("gateways", "True", 2)];
        assert_eq!(
            acceptance(&route, &gateway, &expose),
            Exposure::Accepted {
                url: "https://shop.example.com/api".into()
            }
        );
        route.parents = vec![parent("gateways", "False", 2)];
        assert_eq!(
            acceptance(&route, &gateway, &expose),
            Exposure::Refused {
                message: "Gateway gateways/public refused the route: NotAllowedByListeners: no listener admits the route".into()
            }
        );
    }
}
