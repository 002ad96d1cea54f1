//! `spec.expose` on a full control plane (the garbage collector runs), with the
//! controller at its shipped defaults and a Gateway named: the HTTPRoute it makes, healed
//! after edits and deletion, removed with `spec.expose` and collected with the
//! AppService; a host name kept by the oldest AppService that asks for it, and handed on
//! when that one goes; someone else's route in its name never adopted; and the status
//! that says where the application answers once the Gateway accepted the route. No
//! Gateway implementation runs here: the test writes the route's status as a Gateway's
//! controller would. Requests through a real one (Traefik) are in `real_pods.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::conditions::{READY, TRUE, reasons};
use common::{AppServiceSpec, ExposeSpec};
use controller::config::GatewayRef;
use controller::gateway_api::HttpRoute;
use harness::eventually;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::world::World;
use support::{Fixture, condition};

const IMAGE: &str = "registry.example.com/shop:v1";
/// How long healing may take: events, not the resync, must do it.
const HEAL: Duration = Duration::from_secs(10);
/// Pods ready on kwok, and the garbage collector.
const SETTLE: Duration = Duration::from_secs(60);

fn gateway() -> GatewayRef {
    GatewayRef {
        namespace: "gateways".into(),
        name: "public".into(),
    }
}

async fn world() -> anyhow::Result<World> {
    let fixture = Fixture::setup().full().config(|c| {
        c.expose_gateway = Some(gateway());
    });
    harness::gateway_api::install_crds(&harness::shared_full().await?.client()).await?;
    World::start(fixture).await
}

fn spec(hosts: &[&str]) -> AppServiceSpec {
    AppServiceSpec {
        image: IMAGE.to_owned(),
        replicas: Some(1),
        expose: Some(ExposeSpec {
            hostnames: hosts.iter().map(|h| (*h).to_owned()).collect(),
            paths: vec!["/shop".into()],
            ..ExposeSpec::default()
        }),
        ..AppServiceSpec::default()
    }
}

/// The route of `name` once it is ours and for `hosts`.
async fn our_route(w: &World, name: &str, hosts: &[&str]) -> anyhow::Result<HttpRoute> {
    let uid = w.apps.get(name).await?.uid().unwrap_or_default();
    let routes: Api<HttpRoute> = w.api();
    Ok(
        eventually(&format!("{name}'s route for {hosts:?}"), HEAL, || async {
            let route = routes.get_opt(name).await?;
            Ok(route.filter(|r| {
                let rule = r.spec.rules.first();
                r.owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.controller == Some(true))
                    && r.spec.hostnames == hosts
                    && r.spec.parent_refs.len() == 1
                    && r.spec.parent_refs[0].is_gateway("gateways", "public", "")
                    && rule.is_some_and(|rule| {
                        rule.matches.len() == 1
                            && rule.matches[0].path.value == "/shop"
                            && rule.backend_refs.len() == 1
                            && rule.backend_refs[0].name == name
                            && rule.backend_refs[0].port == Some(8080)
                    })
            }))
        })
        .await?,
    )
}

/// Writes what the Gateway's controller would: the route accepted (or not) for its
/// current generation.
async fn gateway_says(w: &World, name: &str, accepted: bool) -> anyhow::Result<()> {
    let routes: Api<HttpRoute> = w.api();
    let route = routes.get(name).await?;
    let status = json!({"status": {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateways", "name": "public"},
        "controllerName": "example.com/gateway-controller",
        "conditions": [{
            "type": "Accepted",
            "status": if accepted { "True" } else { "False" },
            "reason": if accepted { "Accepted" } else { "NotAllowedByListeners" },
            "message": if accepted { "" } else { "no listener of the Gateway admits routes from this namespace" },
            "observedGeneration": route.metadata.generation,
            "lastTransitionTime": "2026-12-07T00:00:00Z",
        }],
    }]}});
    routes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

/// Waits until `name`'s Ready condition has `reason`; returns its message.
async fn ready_reason(w: &World, name: &str, status: &str, reason: &str) -> anyhow::Result<String> {
    let message = eventually(
        &format!("{name} Ready={status} {reason}"),
        SETTLE,
        || async {
            let a = w.apps.get(name).await?;
            let observed =
                a.status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation;
            Ok(condition(&a, READY)
                .filter(|(s, r, _)| observed && s == status && r == reason)
                .map(|(_, _, m)| m))
        },
    )
    .await?;
    Ok(message)
}

async fn url(w: &World, name: &str) -> anyhow::Result<Option<String>> {
    Ok(w.apps.get(name).await?.status.and_then(|s| s.url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_is_made_healed_accepted_removed_and_collected() -> anyhow::Result<()> {
    let w = world().await?;
    let routes: Api<HttpRoute> = w.api();
    w.create("shop", spec(&["shop.example.test"])).await?;
    let route = our_route(&w, "shop", &["shop.example.test"]).await?;
    // Written, not yet accepted: not Ready, and no URL.
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSING).await?;
    assert!(message.contains("gateways/public"), "{message}");
    assert_eq!(url(&w, "shop").await?, None);

    // Accepted: Ready, and the URL.
    gateway_says(&w, "shop", true).await?;
    ready_reason(&w, "shop", TRUE, reasons::AVAILABLE).await?;
    assert_eq!(
        url(&w, "shop").await?.as_deref(),
        Some("http://shop.example.test/shop")
    );
    w.quiet(2).await?;

    // Edited by someone: put back whole. Deleted: made again.
    routes
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hostnames": ["stolen.example.test"]}})),
        )
        .await?;
    our_route(&w, "shop", &["shop.example.test"]).await?;
    routes.delete("shop", &DeleteParams::default()).await?;
    let again = our_route(&w, "shop", &["shop.example.test"]).await?;
    assert_ne!(again.uid(), route.uid());
    // A new route is not accepted until the Gateway says so.
    ready_reason(&w, "shop", "False", reasons::EXPOSING).await?;

    // Refused by the Gateway: stalled, with the Gateway's words.
    gateway_says(&w, "shop", false).await?;
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSURE_REFUSED).await?;
    assert!(message.contains("NotAllowedByListeners"), "{message}");

    // No longer exposed: the route goes, and with it the URL.
    w.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"expose": null}})),
        )
        .await?;
    eventually("the route gone", HEAL, || async {
        Ok(routes.get_opt("shop").await?.is_none().then_some(()))
    })
    .await?;
    ready_reason(&w, "shop", TRUE, reasons::AVAILABLE).await?;
    assert_eq!(url(&w, "shop").await?, None);

    // Collected with the AppService.
    w.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"expose": {"hostnames": ["shop.example.test"], "paths": ["/shop"]}}})),
        )
        .await?;
    our_route(&w, "shop", &["shop.example.test"]).await?;
    w.apps.delete("shop", &DeleteParams::foreground()).await?;
    eventually("shop and its route gone", SETTLE, || async {
        let gone =
            w.apps.get_opt("shop").await?.is_none() && routes.get_opt("shop").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    Ok(())
}

/// Two AppServices that both got a host name through (as two writes within the
/// webhook's cache lag would): the older keeps it, the newer makes no route and says
/// why, and gets it as soon as the older one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_appservice_keeps_a_host_name_and_hands_it_on() -> anyhow::Result<()> {
    let w = world().await?;
    let routes: Api<HttpRoute> = w.api();
    w.create("first", spec(&["shop.example.test", "first.example.test"]))
        .await?;
    our_route(&w, "first", &["shop.example.test", "first.example.test"]).await?;
    // Created later, or in the same second (timestamps have second precision) and then
    // ordered by name: `first` is the older either way.
    w.create(
        "second",
        spec(&["second.example.test", "shop.example.test"]),
    )
    .await?;
    let message = ready_reason(&w, "second", "False", reasons::EXPOSURE_CONFLICT).await?;
    assert!(
        message.contains("shop.example.test is already exposed by another AppService"),
        "{message}"
    );
    assert!(
        !message.contains("first"),
        "the other AppService is not named: {message}"
    );
    assert!(
        routes.get_opt("second").await?.is_none(),
        "no route for second"
    );
    // The holder keeps its route, untouched.
    our_route(&w, "first", &["shop.example.test", "first.example.test"]).await?;

    // Gone: its route's deletion wakes the one waiting, which takes the name.
    w.apps.delete("first", &DeleteParams::foreground()).await?;
    our_route(&w, "second", &["second.example.test", "shop.example.test"]).await?;
    ready_reason(&w, "second", "False", reasons::EXPOSING).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_route_in_its_name_blocks_it_and_is_never_adopted() -> anyhow::Result<()> {
    let w = world().await?;
    let routes: Api<HttpRoute> = w.api();
    let theirs: HttpRoute = serde_json::from_value(json!({
        "metadata": {"name": "shop", "labels": {"team": "theirs"}},
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "gateways"}],
            "hostnames": ["theirs.example.test"],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": "", "kind": "Service", "name": "theirs", "port": 80, "weight": 1}],
            }],
        },
    }))?;
    let theirs = routes.create(&PostParams::default(), &theirs).await?;
    w.create("shop", spec(&["shop.example.test"])).await?;
    let message = ready_reason(&w, "shop", "False", reasons::RESOURCE_CONFLICT).await?;
    assert!(
        message.contains(&format!("HTTPRoute {}/shop", w.ns.name())),
        "{message}"
    );
    let now = routes.get("shop").await?;
    assert_eq!(now.spec, theirs.spec, "their route untouched");
    assert!(now.owner_references().is_empty());
    routes.delete("shop", &DeleteParams::default()).await?;
    our_route(&w, "shop", &["shop.example.test"]).await?;
    Ok(())
}

/// `tls.issuerRef`: a Certificate for the host names, written as cert-manager's CRD
/// accepts it (the API server checks it against the schema; no cert-manager runs here),
/// healed when edited; the AppService waits for it to be issued and says so, and serves
/// once it is (the test writes what cert-manager would: the Secret and `Ready`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issuer_gets_a_certificate_for_the_host_names() -> anyhow::Result<()> {
    use controller::cert_manager::Certificate;
    let fixture = Fixture::setup().full().config(|c| {
        c.expose_gateway = Some(gateway());
        c.expose_cert_manager = true;
    });
    let client = harness::shared_full().await?.client();
    harness::gateway_api::install_crds(&client).await?;
    harness::gateway_api::install_cert_manager_crds(&client).await?;
    let w = World::start(fixture).await?;
    let certificates: Api<Certificate> = w.api();
    let mut app = spec(&["shop.example.test", "www.shop.example.test"]);
    if let Some(expose) = app.expose.as_mut() {
        expose.tls = Some(common::ExposeTls {
            secret_name: None,
            issuer_ref: Some(common::IssuerRef {
                name: "letsencrypt".into(),
                kind: Some("ClusterIssuer".into()),
                group: None,
            }),
        });
    }
    w.create("shop", app).await?;
    let want = json!({
        "secretName": "shop-tls",
        "dnsNames": ["shop.example.test", "www.shop.example.test"],
        "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer", "group": "cert-manager.io"},
    });
    let ours = || async {
        let c = certificates.get_opt("shop").await?;
        Ok(c.filter(|c| serde_json::to_value(&c.spec).ok() == Some(want.clone())))
    };
    let certificate = eventually("the Certificate", HEAL, ours).await?;
    assert!(
        certificate
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o[0].controller == Some(true))
    );
    // The grant names the Secret cert-manager writes.
    let grants: Api<controller::gateway_api::ReferenceGrant> = w.api();
    let grant = grants.get("shop").await?;
    assert_eq!(grant.spec.to[0].name.as_deref(), Some("shop-tls"));
    // Not issued: the status waits for cert-manager, by name.
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSING).await?;
    assert!(
        message.contains(&format!(
            "cert-manager to issue Certificate {}/shop",
            w.ns.name()
        )),
        "{message}"
    );
    // Edited: put back.
    certificates
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dnsNames": ["evil.example.test"]}})),
        )
        .await?;
    eventually("the Certificate put back", HEAL, ours).await?;
    // Issued (as cert-manager would say it), the route accepted: what is left is the
    // Gateway's HTTPS listeners, and this control plane has no Gateway object at all.
    certificates
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "Ready", "message": "issued",
                "lastTransitionTime": "2026-12-07T00:00:00Z",
            }]}})),
        )
        .await?;
    our_route(&w, "shop", &["shop.example.test", "www.shop.example.test"]).await?;
    gateway_says(&w, "shop", true).await?;
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSURE_REFUSED).await?;
    assert!(
        message.contains("Gateway gateways/public does not exist"),
        "{message}"
    );
    Ok(())
}

/// Without the Gateway API, an Ingress of the configured class: a rule per host name with
/// the paths as prefixes, the TLS Secret named, healed when edited, Ready once an ingress
/// controller admitted it (the test writes the address one would), removed with
/// `spec.expose`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gateway_an_ingress_of_the_configured_class() -> anyhow::Result<()> {
    use k8s_openapi::api::networking::v1::Ingress;
    let w = World::start(Fixture::setup().full().config(|c| {
        c.expose_ingress_class = Some("traefik".into());
    }))
    .await?;
    let ingresses: Api<Ingress> = w.api();
    let mut app = spec(&["shop.example.test", "www.shop.example.test"]);
    if let Some(expose) = app.expose.as_mut() {
        expose.tls = Some(common::ExposeTls {
            secret_name: Some("shop-tls".into()),
            issuer_ref: None,
        });
    }
    w.create("shop", app).await?;
    let path = json!({"path": "/shop", "pathType": "Prefix",
        "backend": {"service": {"name": "shop", "port": {"number": 8080}}}});
    let want = json!({
        "ingressClassName": "traefik",
        "rules": [
            {"host": "shop.example.test", "http": {"paths": [path.clone()]}},
            {"host": "www.shop.example.test", "http": {"paths": [path]}},
        ],
        "tls": [{"hosts": ["shop.example.test", "www.shop.example.test"], "secretName": "shop-tls"}],
    });
    let ours = || async {
        let i = ingresses.get_opt("shop").await?;
        Ok(i.filter(|i| serde_json::to_value(&i.spec).ok() == Some(want.clone())))
    };
    eventually("the Ingress", HEAL, ours).await?;
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSING).await?;
    assert!(message.contains("class traefik"), "{message}");
    // Edited: put back whole.
    ingresses
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingressClassName": "other"}})),
        )
        .await?;
    eventually("the Ingress put back", HEAL, ours).await?;
    // Admitted (as the ingress controller would write it): Ready, with the URL.
    ingresses
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await?;
    ready_reason(&w, "shop", TRUE, reasons::AVAILABLE).await?;
    assert_eq!(
        url(&w, "shop").await?.as_deref(),
        Some("https://shop.example.test/shop")
    );
    w.quiet(2).await?;
    // No longer exposed: the Ingress goes.
    w.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"expose": null}})),
        )
        .await?;
    eventually("the Ingress gone", HEAL, || async {
        Ok(ingresses.get_opt("shop").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

/// Without a Gateway configured, no route is made and the status says why; the
/// Deployment and Service run as always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gateway_exposure_is_unavailable() -> anyhow::Result<()> {
    let w = World::start(Fixture::setup().full()).await?;
    w.create("shop", spec(&["shop.example.test"])).await?;
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSURE_UNAVAILABLE).await?;
    assert!(message.contains("1/1 replicas ready"), "{message}");
    assert!(message.contains("controller.expose.gateway"), "{message}");
    assert_eq!(url(&w, "shop").await?, None);
    w.quiet(2).await?;
    Ok(())
}

/// The Gateway API bounds a Gateway to 64 listeners: an AppService whose HTTPS listener
/// does not fit says so in the Gateway's words and takes nothing of the admin's; once
/// the admin frees a slot, its listener is added (the Gateway's event wakes it) beside
/// the admin's, which stay as the admin applied them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_gateway_refuses_the_listener_and_takes_it_once_a_slot_is_free() -> anyhow::Result<()>
{
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    const NAMESPACE: &str = "exposure-full-gateway";
    let client = harness::shared_full().await?.client();
    harness::gateway_api::install_crds(&client).await?;
    let admin = PatchParams::apply("gateway-admin").force();
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            NAMESPACE,
            &admin,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            ),
        )
        .await?;
    let gateways: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        ),
    );
    let admins = |n: usize| -> serde_json::Value {
        let listeners: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                json!({"name": format!("admin-{i}"), "hostname": format!("h{i}.admin.test"),
                "port": 80, "protocol": "HTTP"})
            })
            .collect();
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "full", "namespace": NAMESPACE},
            "spec": {"gatewayClassName": "example", "listeners": listeners}})
    };
    gateways
        .patch("full", &admin, &Patch::Apply(admins(64)))
        .await?;
    let w = World::start(Fixture::setup().full().config(|c| {
        c.expose_gateway = Some(GatewayRef {
            namespace: NAMESPACE.into(),
            name: "full".into(),
        });
    }))
    .await?;
    let mut app = spec(&[&format!("shop.{}.example.test", w.ns.name())]);
    if let Some(expose) = app.expose.as_mut() {
        expose.tls = Some(common::ExposeTls {
            secret_name: Some("shop-tls".into()),
            issuer_ref: None,
        });
    }
    w.create("shop", app).await?;
    // The route must be accepted before listeners count: say so as the Gateway would.
    let routes: Api<HttpRoute> = w.api();
    eventually("the route", HEAL, || async {
        Ok(routes.get_opt("shop").await?)
    })
    .await?;
    let route = routes.get("shop").await?;
    routes
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"parents": [{
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NAMESPACE, "name": "full"},
                "controllerName": "example.com/gateway-controller",
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                    "observedGeneration": route.metadata.generation, "lastTransitionTime": "2026-12-07T00:00:00Z"}],
            }]}})),
        )
        .await?;
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSURE_REFUSED).await?;
    assert!(
        message.contains("refused the HTTPS listeners") && message.contains("64"),
        "{message}"
    );
    let names = |g: &DynamicObject| -> Vec<String> {
        g.data["spec"]["listeners"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|l| l["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(names(&gateways.get("full").await?).len(), 64);

    // A slot freed by the admin: ours is added, the admin's 63 stay.
    gateways
        .patch("full", &admin, &Patch::Apply(admins(63)))
        .await?;
    let gateway = eventually("our listener added", HEAL, || async {
        let g = gateways.get("full").await?;
        Ok(
            (names(&g).len() == 64 && names(&g).iter().any(|n| n.starts_with("appsvc-")))
                .then_some(g),
        )
    })
    .await?;
    let admin_left: Vec<String> = names(&gateway)
        .into_iter()
        .filter(|n| n.starts_with("admin-"))
        .collect();
    assert_eq!(admin_left.len(), 63, "{admin_left:?}");
    // No Gateway implementation programs it here: the AppService waits for it.
    let message = ready_reason(&w, "shop", "False", reasons::EXPOSING).await?;
    assert!(message.contains("HTTPS listeners"), "{message}");
    // Deleted: its listener goes with it (the finalizer), the admin's stay.
    w.apps.delete("shop", &DeleteParams::default()).await?;
    eventually("our listener removed", SETTLE, || async {
        let g = gateways.get("full").await?;
        Ok((names(&g).len() == 63).then_some(()))
    })
    .await?;
    Ok(())
}
