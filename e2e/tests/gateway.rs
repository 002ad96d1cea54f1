//! The real node's Gateway on its own, without the operator: Traefik routes a host name
//! to the Pods of a Deployment over HTTP, and over HTTPS through a listener a tenant adds
//! to the shared Gateway with its own field manager, its certificate in a Secret of its
//! own namespace that a ReferenceGrant there lets the Gateway read. What `spec.expose`
//! will do for each AppService, done by hand.
//!
//! One real node per machine: this binary shares one with its tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use harness::eventually;
use harness::gateway_api::{self, listener_condition, listener_names, route_condition};
use harness::real_node::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(90);
const HOST: &str = "hello.example.test";

fn hello_deployment(image: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hello"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "hello"}},
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "app",
                        "image": image,
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": true},
                    }],
                },
            },
        },
    }))
    .unwrap()
}

/// A Gateway API object of `kind` (`apiVersion` from its resource) as `manager` would
/// apply it.
fn object(resource: &kube::core::ApiResource, name: &str, ns: &str, rest: Value) -> Value {
    let mut object = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name, "namespace": ns},
    });
    if let (Some(object), Some(rest)) = (object.as_object_mut(), rest.as_object()) {
        object.extend(rest.clone());
    }
    object
}

/// Applies `listeners` to the shared Gateway as `manager`: its own entries of the
/// Gateway's listener map (keyed by name), nothing else.
async fn apply_listeners(
    gateways: &Api<DynamicObject>,
    gateway: &Gateway,
    manager: &str,
    listeners: Value,
) -> Result<DynamicObject, kube::Error> {
    let patch = object(
        &gateway_api::gateway(),
        &gateway.name,
        &gateway.namespace,
        json!({"spec": {"listeners": listeners}}),
    );
    gateways
        .patch(
            &gateway.name,
            &PatchParams::apply(manager),
            &Patch::Apply(&patch),
        )
        .await
}

/// `GET url` with `client`: the status and the body, or why there was none.
async fn get(client: &reqwest::Client, url: &str) -> Result<(u16, String), reqwest::Error> {
    let response = client.get(url).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// hello (two replicas) and its Service `hello:80` in `ns`, ready; the Pods' names.
async fn run_hello(
    cp: &harness::ControlPlane,
    ns: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let node = cp.node().expect("a real node");
    let deployments: Api<Deployment> = Api::namespaced(cp.client(), ns);
    let services: Api<Service> = Api::namespaced(cp.client(), ns);
    let pods: Api<Pod> = Api::namespaced(cp.client(), ns);
    deployments
        .create(
            &PostParams::default(),
            &hello_deployment(&node.images().hello_v1.reference),
        )
        .await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "hello"},
        "spec": {"selector": {"app": "hello"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?;
    services.create(&PostParams::default(), &service).await?;
    eventually("2 ready replicas of hello", WAIT, || async {
        let status = deployments.get("hello").await.ok()?.status?;
        (status.ready_replicas == Some(2)).then_some(())
    })
    .await?;
    let listed = pods
        .list(&ListParams::default().labels("app=hello"))
        .await?;
    Ok(listed
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect())
}

/// An HTTPRoute for [`HOST`] to `hello:80`, a Secret with a certificate for it, and an
/// HTTPS listener for it on the shared Gateway, added by a field manager of the test's own
/// and refused until a ReferenceGrant in the test's namespace lets the Gateway read the
/// Secret; then HTTPS answers with that certificate, and the Gateway's `http` listener
/// is still there and still routes.
#[tokio::test]
async fn traefik_routes_a_host_to_the_pods_over_http_and_https() -> TestResult {
    let cp = harness::shared_real_node().await?;
    let node = cp.node().expect("a real node");
    let client = cp.client();
    let gateway = node.gateway(&client).await?;
    let test_ns = cp.namespace().await?;
    let ns: &str = &test_ns;
    let pods = run_hello(cp, ns).await?;

    // HTTP: a route on the listener `http`, open to every namespace.
    let routes: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &gateway_api::http_route());
    let route = |parents: Vec<Value>| {
        object(
            &gateway_api::http_route(),
            "hello",
            ns,
            json!({"spec": {
                "parentRefs": parents,
                "hostnames": [HOST],
                "rules": [{"backendRefs": [{"name": "hello", "port": 80}]}],
            }}),
        )
    };
    let route_manager = PatchParams::apply("gateway-test-route");
    let started = Instant::now();
    routes
        .patch(
            "hello",
            &route_manager,
            &Patch::Apply(&route(vec![gateway.parent_ref("http")])),
        )
        .await?;
    let http = gateway.http_client(HOST)?;
    let url = format!("http://{HOST}/");
    let answer: Value = eventually(
        "hello to answer through the http listener",
        WAIT,
        || async {
            let (status, body) = get(&http, &url).await.ok()?;
            (status == 200).then(|| serde_json::from_str(&body).unwrap())
        },
    )
    .await?;
    eprintln!(
        "gateway test: the route answered over HTTP {:.1?} after it was applied",
        started.elapsed()
    );
    // Traefik forwarded to a Pod address of the node (hello names the Pod that answered).
    let pod = answer["pod"].as_str().unwrap();
    assert!(
        pods.iter().any(|p| p == pod),
        "{pod} is not one of {pods:?}"
    );
    let accepted = routes.get("hello").await?;
    let parent = (gateway.namespace.as_str(), gateway.name.as_str(), "http");
    assert_eq!(
        route_condition(&accepted, parent, "Accepted")
            .map(|c| c.status)
            .as_deref(),
        Some("True")
    );
    // Another host name is not routed.
    let other = gateway.http_client("other.example.test")?;
    let (status, _) = get(&other, "http://other.example.test/").await?;
    assert_eq!(status, 404);

    // HTTPS: the certificate in a Secret of the test's namespace.
    let ca = certs::Ca::new("gateway test CA")?;
    let serving = ca.serving_cert(&[HOST])?;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hello-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;

    // The listener, added by the test's own field manager; no grant yet.
    let gateways: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &gateway.namespace, &gateway_api::gateway());
    let listener = format!("{ns}-https");
    let manager = format!("gateway-test-{ns}");
    let applied = apply_listeners(
        &gateways,
        &gateway,
        &manager,
        json!([{
            "name": listener,
            "protocol": "HTTPS",
            "port": gateway.https_port(),
            "hostname": HOST,
            "tls": {
                "mode": "Terminate",
                "certificateRefs": [{"kind": "Secret", "group": "", "namespace": ns, "name": "hello-tls"}],
            },
            "allowedRoutes": {"namespaces": {
                "from": "Selector",
                "selector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            }},
        }]),
    )
    .await?;
    assert_eq!(
        listener_names(&applied),
        ["http".to_owned(), listener.clone()],
        "the apply kept the harness's listener"
    );
    let generation = applied.metadata.generation;
    let refused = eventually(
        "the listener to report its certificate reference not permitted",
        WAIT,
        || async {
            let gw = gateways.get(&gateway.name).await.ok()?;
            let c = listener_condition(&gw, &listener, "ResolvedRefs")?;
            (c.observed_generation >= generation).then_some(c)
        },
    )
    .await?;
    assert_eq!(
        (refused.status.as_str(), refused.reason.as_str()),
        ("False", "RefNotPermitted"),
        "{refused:?}"
    );
    // One tenant's refused listener leaves the others routed.
    let (status, _) = get(&http, &url).await?;
    assert_eq!(status, 200);

    // The grant: Gateways of the gateway's namespace may read that Secret.
    let grants: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &gateway_api::reference_grant());
    let grant = object(
        &gateway_api::reference_grant(),
        "gateway-reads-hello-tls",
        ns,
        json!({"spec": {
            "from": [{"group": gateway_api::GROUP, "kind": "Gateway", "namespace": gateway.namespace}],
            "to": [{"group": "", "kind": "Secret", "name": "hello-tls"}],
        }}),
    );
    grants
        .patch(
            "gateway-reads-hello-tls",
            &route_manager,
            &Patch::Apply(&grant),
        )
        .await?;
    eventually("the listener to resolve its certificate", WAIT, || async {
        let gw = gateways.get(&gateway.name).await.ok()?;
        let refs = listener_condition(&gw, &listener, "ResolvedRefs")?;
        let programmed = listener_condition(&gw, &listener, "Programmed")?;
        (refs.status == "True" && programmed.status == "True").then_some(())
    })
    .await?;

    // The route on that listener too, by section name.
    let started = Instant::now();
    routes
        .patch(
            "hello",
            &route_manager,
            &Patch::Apply(&route(vec![
                gateway.parent_ref("http"),
                gateway.parent_ref(&listener),
            ])),
        )
        .await?;
    let https = gateway.https_client(HOST, ca.cert_pem())?;
    let secure_url = format!("https://{HOST}/");
    let answer: Value = eventually("hello to answer over HTTPS", WAIT, || async {
        let (status, body) = get(&https, &secure_url).await.ok()?;
        (status == 200).then(|| serde_json::from_str(&body).unwrap())
    })
    .await?;
    eprintln!(
        "gateway test: the route answered over HTTPS {:.1?} after its listener was added to it",
        started.elapsed()
    );
    let pod = answer["pod"].as_str().unwrap();
    assert!(
        pods.iter().any(|p| p == pod),
        "{pod} is not one of {pods:?}"
    );
    // The certificate is the one of the Secret: a client trusting another CA refuses it.
    let stranger = certs::Ca::new("another CA")?;
    let refusing = gateway.https_client(HOST, stranger.cert_pem())?;
    assert!(get(&refusing, &secure_url).await.is_err());
    // The harness's listener still routes.
    let (status, _) = get(&http, &url).await?;
    assert_eq!(status, 200);

    // Removing its listener: an empty list by the same manager removes its entry only.
    let removed = apply_listeners(&gateways, &gateway, &manager, json!([])).await?;
    assert_eq!(listener_names(&removed), ["http"]);
    Ok(())
}

/// Two field managers each apply their own listener to the shared Gateway: both entries
/// are kept beside the harness's `http`, each owned by its manager alone, and an empty
/// `listeners` applied by one removes only its own entry.
#[tokio::test]
async fn listeners_of_two_field_managers_are_kept_apart() -> TestResult {
    let cp = harness::shared_real_node().await?;
    let node = cp.node().expect("a real node");
    let client = cp.client();
    let gateway = node.gateway(&client).await?;
    let test_ns = cp.namespace().await?;
    let ns: &str = &test_ns;
    let gateways: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &gateway.namespace, &gateway_api::gateway());
    let listener = |name: &str| {
        json!([{
            "name": format!("{ns}-{name}"),
            "protocol": "HTTP",
            "port": gateway.http_port(),
            "hostname": format!("{name}.{ns}.example.test"),
        }])
    };
    let (a, b) = (format!("{ns}-a"), format!("{ns}-b"));
    let (manager_a, manager_b) = (
        format!("gateway-test-{ns}-a"),
        format!("gateway-test-{ns}-b"),
    );
    apply_listeners(&gateways, &gateway, &manager_a, listener("a")).await?;
    let both = apply_listeners(&gateways, &gateway, &manager_b, listener("b")).await?;
    let names = listener_names(&both);
    for name in ["http", &a, &b] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
    // Each entry is owned by its manager alone.
    let owners = |name: &str| -> Vec<String> {
        let key = format!("k:{{\"name\":\"{name}\"}}");
        both.metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.fields_v1.as_ref().is_some_and(|f| {
                    f.0.pointer("/f:spec/f:listeners")
                        .and_then(|l| l.get(&key))
                        .is_some()
                })
            })
            .filter_map(|m| m.manager.clone())
            .collect()
    };
    assert_eq!(owners(&a), [manager_a.as_str()]);
    assert_eq!(owners(&b), [manager_b.as_str()]);
    assert_eq!(owners("http"), ["appservice-harness"]);

    // B withdraws: its entry goes, A's and the harness's stay.
    let after_b = apply_listeners(&gateways, &gateway, &manager_b, json!([])).await?;
    let names = listener_names(&after_b);
    assert!(!names.contains(&b), "{names:?}");
    for name in ["http", &a] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
    // A withdraws too.
    let after_a = apply_listeners(&gateways, &gateway, &manager_a, json!([])).await?;
    let names = listener_names(&after_a);
    assert!(
        !names.contains(&a) && names.iter().any(|n| n == "http"),
        "{names:?}"
    );
    Ok(())
}
