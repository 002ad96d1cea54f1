//! AppServices on a real node: the harness's containerd, kubelet and kube-proxy run what
//! the controller asks for, from images built here (`hello`, which answers with its
//! version, its Pod and what its process runs with). Every test runs in a namespace that
//! enforces Pod Security `restricted`, with the controller at its shipped defaults
//! (resync 10 minutes, rollout requeue 10 s), and judges the result the way a platform
//! team would: by the answer of the application through its Service.
//!
//! One real node per machine: this binary's tests share it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::conditions::{READY, STALLED, TRUE, reasons};
use common::{AppService, CanarySpec, PodSecurity, RolloutSpec};
use harness::eventually;
use harness::real_node::{self, RealNode};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{EvictParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Fixture, condition, create};

/// Long enough for a cold image pull and a kubelet's first status on 2 busy cores.
const WAIT: Duration = Duration::from_secs(120);

/// Who uses the node: the tests share it, except the one that restarts its kubelet, which
/// every Pod on the node feels (tokio's lock is fair: it waits for the tests running,
/// and those starting meanwhile wait for it).
static NODE_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The shared node, held for a test's use while the guard lives.
struct Node {
    node: &'static RealNode,
    _use: tokio::sync::RwLockReadGuard<'static, ()>,
}

impl std::ops::Deref for Node {
    type Target = RealNode;
    fn deref(&self) -> &RealNode {
        self.node
    }
}

async fn shared_node() -> &'static RealNode {
    harness::shared_real_node()
        .await
        .expect("the shared control plane with a real node")
        .node()
        .expect("a real node")
}

async fn node() -> Node {
    let guard = NODE_USE.read().await;
    Node {
        node: shared_node().await,
        _use: guard,
    }
}

/// The node, with no other test using it until the guard is dropped.
async fn node_alone() -> (
    &'static RealNode,
    tokio::sync::RwLockWriteGuard<'static, ()>,
) {
    let guard = NODE_USE.write().await;
    (shared_node().await, guard)
}

/// The `hello` program answering v1, as the image `<repo>:v1`.
fn hello_v1(repo: &str) -> real_node::ImageSpec<'_> {
    real_node::ImageSpec {
        repo,
        tag: "v1",
        program: "hello",
        user: real_node::NONROOT,
        env: &[("APP_VERSION", "v1")],
    }
}

fn hello(name: &str, image: &str, replicas: i32) -> AppService {
    common::testing::app(name, image).replicas(replicas).build()
}

/// Waits until AppService `name` is Ready with `replicas` ready for its generation.
async fn ready(f: &Fixture, name: &str, replicas: i32) -> AppService {
    eventually(&format!("{name} Ready with {replicas}"), WAIT, || async {
        let a = f.apps.get(name).await?;
        let status = a.status.clone().unwrap_or_default();
        let ok = status.ready_replicas == Some(replicas)
            && status.observed_generation == a.metadata.generation
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        if ok {
            Ok(Some(a))
        } else {
            Err(format!(
                "generation {:?}, status {}",
                a.metadata.generation,
                serde_json::to_string(&status).unwrap()
            )
            .into())
        }
    })
    .await
    .unwrap()
}

/// `<ClusterIP>:<port>` of the AppService's Service.
async fn service_addr(f: &Fixture, name: &str) -> String {
    let service: Service = f.services.get(name).await.unwrap();
    let spec = service.spec.unwrap();
    format!(
        "{}:{}",
        spec.cluster_ip.unwrap(),
        spec.ports.unwrap()[0].port
    )
}

/// A merge patch of AppService `name`.
async fn merge(f: &Fixture, name: &str, patch: Value) {
    f.apps
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// How many endpoints the EndpointSlices of Service `name` hold ready (`None` when they
/// cannot be listed).
async fn ready_endpoints(f: &Fixture, name: &str) -> Option<usize> {
    let slices = f
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .ok()?;
    Some(
        slices
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count(),
    )
}

/// PostgreSQL listening on the node's gateway for the Pods, its admin and CA Secrets in
/// the test's namespace, and a controller with the real database step.
async fn with_database(f: &Fixture) -> (harness::Postgres, support::Running) {
    let pg = harness::Postgres::start_also_on(real_node::NODE_GATEWAY, real_node::POD_CIDR)
        .await
        .unwrap();
    support::database_secrets(f, &pg, None).await.unwrap();
    let metrics = Arc::new(controller::metrics::Metrics::default());
    let ctl = support::start_controller_with(
        f.client.clone(),
        &f.ns,
        |_| {},
        Arc::new(support::databases(f, metrics)),
    );
    (pg, ctl)
}

/// The JSON answer of `GET path` through `addr`, once it answers 200.
async fn answer(addr: &str, path: &str) -> Value {
    eventually(&format!("GET {addr}{path} to answer 200"), WAIT, || async {
        let (status, body) = real_node::get(addr, path).await.ok()?;
        (status == 200).then(|| serde_json::from_str(&body).unwrap())
    })
    .await
    .unwrap()
}

async fn pods_of(f: &Fixture, name: &str) -> Vec<Pod> {
    f.api::<Pod>()
        .list(&ListParams::default().labels(&common::names::selector_string(name)))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

#[tokio::test]
async fn the_pods_run_as_the_non_root_image_user_with_no_capabilities_and_answer() {
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    let app = common::testing::app("web", &node.images().hello_v1.reference)
        .replicas(2)
        .spec(|s| {
            s.pod_security = Some(PodSecurity {
                read_only_root_filesystem: Some(true),
                ..PodSecurity::default()
            })
        })
        .build();
    create(&f.apps, &app).await.unwrap();
    let app = ready(&f, "web", 2).await;
    let addr = service_addr(&f, "web").await;

    // Every Pod answers through the ClusterIP, as the image's user, with no capability,
    // no privilege gain, seccomp filtering (mode 2) and a read-only root.
    let pods: BTreeMap<String, Pod> = pods_of(&f, "web")
        .await
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    assert_eq!(pods.len(), 2);
    let seen = std::sync::Mutex::new(BTreeMap::new());
    eventually("both Pods to answer through the Service", WAIT, || async {
        let (status, body) = real_node::get(&addr, "/").await.ok()?;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        let mut seen = seen.lock().unwrap();
        seen.insert(answer["pod"].as_str().unwrap().to_owned(), answer);
        (seen.len() == 2).then_some(())
    })
    .await
    .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        pods.keys().collect::<Vec<_>>()
    );
    for answer in seen.values() {
        assert_eq!(answer["version"], "v1", "{answer}");
        assert_eq!(answer["uid"], 65532, "{answer}");
        assert_eq!(answer["gid"], 65532, "{answer}");
        assert_eq!(answer["capEff"], "0000000000000000", "{answer}");
        assert_eq!(answer["noNewPrivs"], "1", "{answer}");
        assert_eq!(answer["seccomp"], "2", "{answer}");
        assert_eq!(answer["readOnlyRoot"], true, "{answer}");
    }
    // status.endpoint names the Service the answers came through.
    let endpoint = app.status.unwrap().endpoint.unwrap();
    assert_eq!(endpoint, format!("http://web.{}.svc:8080", &*f.ns));
}

#[tokio::test]
async fn an_image_whose_user_is_root_is_refused_by_the_kubelet_and_status_says_why() {
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    let app = hello("rooted", &node.images().hello_as_root.reference, 1);
    create(&f.apps, &app).await.unwrap();

    // The kubelet refuses it (runAsNonRoot and an image user 0); status names the Pod
    // and the kubelet's words, and says a human must act: not "RollingOut".
    let stalled = eventually("rooted to be stalled on its Pod", WAIT, || async {
        let a = f.apps.get("rooted").await.ok()?;
        let (status, reason, message) = condition(&a, READY)?;
        (status != TRUE && reason == reasons::PODS_FAILING).then_some((a, message))
    })
    .await
    .unwrap();
    let (a, message) = stalled;
    assert!(
        message.contains("CreateContainerConfigError") && message.contains("runAsNonRoot"),
        "{message}"
    );
    assert!(
        message.starts_with("0/1 replicas ready; Pod rooted-"),
        "{message}"
    );
    let (stalled, _, _) = condition(&a, STALLED).unwrap();
    assert_eq!(stalled, TRUE);

    // Fixing the image is all it takes.
    merge(
        &f,
        "rooted",
        json!({"spec": {"image": node.images().hello_v1.reference}}),
    )
    .await;
    ready(&f, "rooted", 1).await;
    let addr = service_addr(&f, "rooted").await;
    assert_eq!(answer(&addr, "/").await["uid"], 65532);
}

#[tokio::test]
async fn readiness_keeps_an_application_that_does_not_listen_out_of_its_service() {
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    let app = common::testing::app("mute", &node.images().hello_v1.reference)
        .replicas(1)
        .env("HELLO_LISTEN", "never")
        .build();
    create(&f.apps, &app).await.unwrap();

    // The container runs; its readiness probe (TCP on the port) fails, so the
    // EndpointSlice holds it as not ready, nothing answers, and status says so.
    eventually("mute's container to run, not ready", WAIT, || async {
        let pods = pods_of(&f, "mute").await;
        let status = pods.first()?.status.clone()?;
        let container = status.container_statuses?.first()?.clone();
        (container.state?.running.is_some() && !container.ready).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(ready_endpoints(&f, "mute").await, Some(0));
    let addr = service_addr(&f, "mute").await;
    let refused = real_node::get(&addr, "/").await;
    assert!(
        refused.is_err(),
        "a Service with no ready endpoint answered: {refused:?}"
    );
    let a = f.apps.get("mute").await.unwrap();
    let (status, reason, message) = condition(&a, READY).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        ("False", reasons::ROLLING_OUT, "0/1 replicas ready")
    );

    // Once it listens, it is ready and answers.
    merge(&f, "mute", json!({"spec": {"env": null}})).await;
    ready(&f, "mute", 1).await;
    assert_eq!(answer(&addr, "/").await["version"], "v1");
}

/// Sends requests through `addr` until `stop`, counting answers by version and failures.
struct Traffic {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    versions: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    last_failure: Arc<std::sync::Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(addr: String) -> Traffic {
        Traffic::start_on(addr, "/", 1)
    }

    /// `tasks` clients sending `GET path` one after another; answers are counted by
    /// their `version` (`-` when they have none).
    fn start_on(addr: String, path: &'static str, tasks: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicU64::new(0));
        let versions = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let last_failure = Arc::new(std::sync::Mutex::new(None));
        let clients: Vec<_> = (0..tasks)
            .map(|_| {
                let (stop, failed, versions, last_failure, addr) = (
                    stop.clone(),
                    failed.clone(),
                    versions.clone(),
                    last_failure.clone(),
                    addr.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        match real_node::get(&addr, path).await {
                            Ok((200, body)) => {
                                let answer: Value = serde_json::from_str(&body).unwrap();
                                let version = answer["version"].as_str().unwrap_or("-").to_owned();
                                *versions.lock().unwrap().entry(version).or_default() += 1;
                            }
                            other => {
                                failed.fetch_add(1, Ordering::SeqCst);
                                *last_failure.lock().unwrap() = Some(format!("{other:?}"));
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        let task = tokio::spawn(async move {
            for client in clients {
                client.await.unwrap();
            }
        });
        Traffic {
            stop,
            failed,
            versions,
            last_failure,
            task,
        }
    }

    /// Stops and returns (answers by version, failures, the last failure).
    async fn finish(self) -> (BTreeMap<String, u64>, u64, Option<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        let versions = self.versions.lock().unwrap().clone();
        let last = self.last_failure.lock().unwrap().clone();
        (versions, self.failed.load(Ordering::SeqCst), last)
    }
}

#[tokio::test]
async fn a_canary_takes_its_share_of_requests_and_promotion_and_abort_fail_none() {
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    let (v1, v2) = (&node.images().hello_v1, &node.images().hello_v2);
    let protected = Some(RolloutSpec {
        max_surge: Some(IntOrString::Int(1)),
        max_unavailable: Some(IntOrString::Int(0)),
    });
    // Four replicas, one of them the canary's.
    let app = common::testing::app("shop", &v1.reference)
        .replicas(4)
        .spec(|s| {
            s.rollout = protected.clone();
            s.canary = Some(CanarySpec {
                image: v2.reference.clone(),
                replicas: Some(1),
            });
        })
        .build();
    create(&f.apps, &app).await.unwrap();
    ready(&f, "shop", 4).await;
    let addr = service_addr(&f, "shop").await;

    // Ready counts the Pods; the Service's data path follows the EndpointSlice, which
    // kube-proxy programs a moment later: wait until it routes to all four.
    eventually(
        "the Service's EndpointSlice to hold 4 ready endpoints",
        WAIT,
        || async { (ready_endpoints(&f, "shop").await? == 4).then_some(()) },
    )
    .await
    .unwrap();
    // kube-proxy routes to all four once each has answered (its rules are replaced
    // whole at each sync, and a sync that saw all four keeps them).
    let answered = std::sync::Mutex::new(std::collections::BTreeSet::new());
    eventually("kube-proxy to route to all four Pods", WAIT, || async {
        let (_, body) = real_node::get(&addr, "/").await.ok()?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        let mut answered = answered.lock().unwrap();
        answered.insert(answer["pod"].as_str()?.to_owned());
        (answered.len() == 4).then_some(())
    })
    .await
    .unwrap();

    // Requests through the Service reach both images in about the ratio of their
    // replicas (kube-proxy picks an endpoint per connection at random: 1 in 4 is v2).
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..400 {
        let (status, body) = real_node::get(&addr, "/").await.unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        *counts
            .entry(answer["version"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let canary = counts.get("v2").copied().unwrap_or(0);
    // Binomial(400, 1/4): mean 100, standard deviation 8.7; 60..=140 is beyond 4.5 sigma.
    assert!(
        (60..=140).contains(&canary),
        "v2 answered {canary} of 400 (expected about 100): {counts:?}"
    );
    assert_eq!(counts.values().sum::<u64>(), 400);

    // Promote (one edit): v2 replaces v1 under steady traffic, nothing fails.
    let traffic = Traffic::start(addr.clone());
    merge(
        &f,
        "shop",
        json!({"spec": {"image": v2.reference, "canary": null}}),
    )
    .await;
    ready(&f, "shop", 4).await;
    eventually("only v2 Pods left", WAIT, || async {
        let pods = pods_of(&f, "shop").await;
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(&v2.reference))
            .then_some(())
    })
    .await
    .unwrap();
    let (versions, failed, last) = traffic.finish().await;
    assert_eq!(failed, 0, "requests failed during the promotion: {last:?}");
    assert!(versions.get("v2").copied().unwrap_or(0) > 0, "{versions:?}");

    // A new canary (v1), then abort it (one edit): v2 alone answers, nothing fails.
    merge(
        &f,
        "shop",
        json!({"spec": {"canary": {"image": v1.reference, "replicas": 1}}}),
    )
    .await;
    ready(&f, "shop", 4).await;
    answer(&addr, "/").await;
    let traffic = Traffic::start(addr.clone());
    merge(&f, "shop", json!({"spec": {"canary": null}})).await;
    ready(&f, "shop", 4).await;
    // Gone, not only terminating: a terminating Pod serves while it drains.
    eventually("the canary's Pod to be gone", WAIT, || async {
        let pods = f
            .api::<Pod>()
            .list(&ListParams::default().labels(&common::names::selector_string("shop")))
            .await
            .ok()?
            .items;
        (pods.len() == 4
            && pods.iter().all(|p| {
                p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(&v2.reference)
            }))
        .then_some(())
    })
    .await
    .unwrap();
    let (_, failed, last) = traffic.finish().await;
    assert_eq!(failed, 0, "requests failed during the abort: {last:?}");
    let mut after = BTreeMap::<String, u64>::new();
    for _ in 0..50 {
        let (_, body) = real_node::get(&addr, "/").await.unwrap();
        let answer: Value = serde_json::from_str(&body).unwrap();
        *after
            .entry(answer["version"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(after, BTreeMap::from([("v2".to_owned(), 50)]));
}

#[tokio::test]
async fn the_pods_outlive_a_controller_restart_and_a_kubelet_restart() {
    let (node, _alone) = node_alone().await;
    let (f, ctl) = Fixture::setup().real_node().start().await.unwrap();
    create(
        &f.apps,
        &hello("steady", &node.images().hello_v1.reference, 2),
    )
    .await
    .unwrap();
    ready(&f, "steady", 2).await;
    let addr = service_addr(&f, "steady").await;
    answer(&addr, "/").await;
    let before = identities(&f, "steady").await;

    // The controller stops and starts again: nothing is recreated or restarted.
    ctl.stop().await.unwrap();
    let (client, _) = harness::recording(f.client.clone(), &f.ns);
    let _ctl = support::start_controller(client, &f.ns, |_| {});
    ready(&f, "steady", 2).await;
    assert_eq!(identities(&f, "steady").await, before);

    // The kubelet is killed and started again: the containers keep running (same Pods,
    // no restart), the Node and the AppService stay Ready, and the app answers.
    let traffic = Traffic::start(addr.clone());
    node.restart_kubelet().await.unwrap();
    let a = ready(&f, "steady", 2).await;
    assert_eq!(condition(&a, READY).unwrap().1, reasons::AVAILABLE);
    let (versions, failed, last) = traffic.finish().await;
    assert_eq!(
        failed, 0,
        "requests failed across the kubelet restart: {last:?}"
    );
    assert!(versions.get("v1").copied().unwrap_or(0) > 0, "{versions:?}");
    assert_eq!(identities(&f, "steady").await, before);
}

/// Each Pod's name, uid and its container's restart count.
async fn identities(f: &Fixture, name: &str) -> Vec<(String, String, i32)> {
    let mut ids: Vec<_> = pods_of(f, name)
        .await
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().map(|c| c.restart_count))
                .unwrap_or(-1);
            (p.metadata.name.unwrap(), p.metadata.uid.unwrap(), restarts)
        })
        .collect();
    ids.sort();
    ids
}

/// A DatabaseClass `<namespace>-<mode>` for `pg` reached at the real node's gateway (the
/// host as Pods see it), in TLS `mode`, with the admin and CA Secrets of the test's
/// namespace.
async fn gateway_class(f: &Fixture, pg: &harness::Postgres, mode: &str) -> String {
    let name = format!("{}-{mode}", &*f.ns);
    let tls = match mode {
        "disable" => json!({"mode": "disable", "insecureAcknowledged": true}),
        _ => json!({"mode": mode, "ca": {"secretRef": {"name": "pg-ca"}}}),
    };
    let class: common::DatabaseClass = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "DatabaseClass",
        "metadata": {"name": name},
        "spec": {
            "host": real_node::NODE_GATEWAY,
            "port": pg.port(),
            "tls": tls,
            "adminCredentials": {"secretName": "pg-admin"},
            "deletionPolicy": "Delete",
        }
    }))
    .unwrap();
    kube::Api::<common::DatabaseClass>::all(f.client.clone())
        .create(&Default::default(), &class)
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn the_application_reaches_its_database_in_each_tls_mode_with_only_what_its_pod_gets() {
    let node = node().await;
    let f = Fixture::setup()
        .real_node()
        .without_controller()
        .await
        .unwrap();
    let (pg, _ctl) = with_database(&f).await;

    let modes = ["verify-full", "require", "disable"];
    for mode in modes {
        let class = gateway_class(&f, &pg, mode).await;
        let app = common::testing::app(&format!("db-{mode}"), &node.images().hello_v1.reference)
            .replicas(1)
            .database(&class)
            .build();
        create(&f.apps, &app).await.unwrap();
    }
    for mode in modes {
        let name = format!("db-{mode}");
        ready(&f, &name, 1).await;
        let addr = service_addr(&f, &name).await;
        // From inside the container, with its environment and mounted files only.
        let db = answer(&addr, "/db").await;
        assert_eq!(db["ok"], true, "{mode}: {db}");
        assert_eq!(db["via"], "DATABASE_URL", "{mode}: {db}");
        assert_eq!(db["tls"], mode != "disable", "{mode}: {db}");
        let user = db["user"].as_str().unwrap();
        assert_ne!(user, harness::postgres::SUPERUSER, "{mode}: {db}");
    }
}

#[tokio::test]
async fn containerd_pulls_the_digest_the_controller_verified_and_never_an_unsigned_image() {
    use common::conditions::IMAGE_VERIFIED;
    let node = node().await;
    let f = Fixture::setup()
        .real_node()
        .without_controller()
        .await
        .unwrap();
    let registry = node.registry();
    // Repositories of this test's own, so that nothing else pulls or signs them.
    let signed_repo = format!("signed-{}", &*f.ns);
    let unsigned_repo = format!("unsigned-{}", &*f.ns);
    let signed = node.push_image(hello_v1(&signed_repo)).await.unwrap();
    let unsigned = node.push_image(hello_v1(&unsigned_repo)).await.unwrap();
    let key = harness::KeyPair::generate().await.unwrap();
    registry.sign(&key, &signed.pinned()).await.unwrap();
    // What the registry served so far (the pushes' own requests included).
    let served_before = registry.requests().unwrap().len();

    let images = controller::images::ImageConfig {
        registry_ca_file: Some(registry.ca_file()),
        ..controller::images::ImageConfig::defaults()
    };
    let (_ctl, _metrics) = support::verifying(&f, images).unwrap();
    let policies: kube::Api<common::image_policy::ImagePolicy> = kube::Api::all(f.client.clone());
    let policy_name = format!("{}-enforce", &*f.ns);
    let policy: common::image_policy::ImagePolicy = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": policy_name},
        "spec": {
            "images": [{"glob": format!("{}/**", registry.host())}],
            "mode": "Enforce",
            "keys": [{"name": "release", "publicKey": key.public_pem()}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": &*f.ns}},
        },
    }))
    .unwrap();
    policies.create(&Default::default(), &policy).await.unwrap();
    eventually("the policy observed by the controller", WAIT, || async {
        let p = policies.get(&policy_name).await.ok()?;
        let observed = p.status.as_ref().and_then(|s| s.observed_generation);
        (observed.is_some() && observed == p.metadata.generation).then_some(())
    })
    .await
    .unwrap();

    create(&f.apps, &hello("signed", &signed.reference, 1))
        .await
        .unwrap();
    create(&f.apps, &hello("unsigned", &unsigned.reference, 1))
        .await
        .unwrap();
    ready(&f, "signed", 1).await;
    let addr = service_addr(&f, "signed").await;
    assert_eq!(answer(&addr, "/").await["version"], "v1");

    // The Pod runs the digest the controller verified, and containerd's own record of
    // what it pulled for that repository is that digest and nothing else.
    let deployment = f.deployments.get("signed").await.unwrap();
    // (`<repo>:<tag>@<digest>`: the tag kept for people, the digest for the runtime.)
    assert_eq!(
        support::image_of(&deployment),
        Some(format!("{}@{}", signed.reference, signed.digest))
    );
    let pulled = node.pulled_images().await.unwrap();
    let of_repo: Vec<&(String, String)> = pulled
        .iter()
        .filter(|(reference, _)| reference.starts_with(&signed.repository))
        .collect();
    assert!(
        !of_repo.is_empty(),
        "containerd pulled nothing of {}: {pulled:?}",
        signed.repository
    );
    for (reference, digest) in &of_repo {
        assert_eq!(digest, &signed.digest, "{reference}");
    }
    let pod = pods_of(&f, "signed").await.remove(0);
    let image_id = &pod.status.unwrap().container_statuses.unwrap()[0].image_id;
    assert!(image_id.ends_with(&signed.digest), "{image_id}");

    // The unsigned image is refused before any Pod exists: no Deployment, and nothing of
    // it in containerd or among the registry's blob downloads.
    let refused = eventually("unsigned to be refused", WAIT, || async {
        let a = f.apps.get("unsigned").await.ok()?;
        let (status, reason, _) = condition(&a, IMAGE_VERIFIED)?;
        (status == "False" && reason == reasons::IMAGE_UNSIGNED).then_some(a)
    })
    .await
    .unwrap();
    assert_eq!(condition(&refused, STALLED).unwrap().0, TRUE);
    assert!(f.deployments.get_opt("unsigned").await.unwrap().is_none());
    let pulled = node.pulled_images().await.unwrap();
    assert!(
        pulled
            .iter()
            .all(|(reference, _)| !reference.starts_with(&unsigned.repository)),
        "{pulled:?}"
    );
    let blobs = registry
        .requests()
        .unwrap()
        .into_iter()
        .skip(served_before)
        .filter(|r| r.method == "GET" && r.path.starts_with(&format!("/v2/{unsigned_repo}/blobs/")))
        .count();
    assert_eq!(blobs, 0, "layers of the unsigned image were downloaded");
    policies
        .delete(&policy_name, &Default::default())
        .await
        .unwrap();
}

/// The database revision on the Pods of `name` that are not terminating, once they all
/// carry the same one other than `not`, are ready, and number `replicas`.
async fn rolled_to_new_revision(f: &Fixture, name: &str, not: &str, replicas: usize) -> String {
    eventually(
        &format!("{name}'s Pods rolled past revision {not}"),
        WAIT,
        || async {
            let pods = pods_of(f, name).await;
            let revisions: std::collections::BTreeSet<String> = pods
                .iter()
                .filter_map(|p| {
                    p.metadata
                        .annotations
                        .as_ref()?
                        .get(common::names::ANNOTATION_DATABASE_REVISION)
                        .cloned()
                })
                .collect();
            let ready = pods.iter().all(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| c.iter().all(|c| c.ready))
            });
            let revision = revisions.iter().next()?.clone();
            (pods.len() == replicas && revisions.len() == 1 && revision != not && ready)
                .then_some(revision)
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn after_a_password_and_a_ca_rotation_the_rolled_pods_connect_and_an_old_one_cannot() {
    let node = node().await;
    let f = Fixture::setup()
        .real_node()
        .without_controller()
        .await
        .unwrap();
    let (mut pg, _ctl) = with_database(&f).await;
    let secrets = f.api::<k8s_openapi::api::core::v1::Secret>();
    let class = gateway_class(&f, &pg, "verify-full").await;
    let app = common::testing::app("shop", &node.images().hello_v1.reference)
        .replicas(1)
        .database(&class)
        .build();
    create(&f.apps, &app).await.unwrap();
    ready(&f, "shop", 1).await;
    let addr = service_addr(&f, "shop").await;
    assert_eq!(answer(&addr, "/db").await["ok"], true);

    // An old Pod: the first revision's Pod template as a Pod of its own (labels the
    // Deployment does not select), started before the rotation, as a Pod of the old
    // ReplicaSet still running during a rollout is.
    let first = pods_of(&f, "shop").await.remove(0);
    let first_revision = first.metadata.annotations.as_ref().unwrap()
        [common::names::ANNOTATION_DATABASE_REVISION]
        .clone();
    let mut spec = first.spec.clone().unwrap();
    spec.node_name = None;
    let old: Pod = serde_json::from_value(json!({
        "metadata": {"name": "shop-old", "labels": {"test": "old-revision"}},
        "spec": spec,
    }))
    .unwrap();
    let pods = f.api::<Pod>();
    pods.create(&Default::default(), &old).await.unwrap();
    let old_addr = eventually("the old Pod to be ready", WAIT, || async {
        let pod = pods.get("shop-old").await.ok()?;
        let status = pod.status?;
        let ready = status.container_statuses?.iter().all(|c| c.ready);
        ready.then(|| format!("{}:8080", status.pod_ip.unwrap()))
    })
    .await
    .unwrap();
    assert_eq!(answer(&old_addr, "/db").await["ok"], true);

    // A password rotation (the Secret deleted): the role gets a new password, the
    // Deployment rolls, the new Pod connects; the old Pod's password is refused.
    secrets
        .delete("shop-database", &Default::default())
        .await
        .unwrap();
    let second_revision = rolled_to_new_revision(&f, "shop", &first_revision, 1).await;
    assert_eq!(answer(&addr, "/db").await["ok"], true);
    let (status, body) = real_node::get(&old_addr, "/db").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("password authentication failed"), "{body}");

    // A CA rotation: the server serves a new CA's certificate and the admin puts the new
    // CA in the class's Secret; the change reaches the AppService at its next reconcile
    // (an annotation here, the resync otherwise). The rolled Pod verifies the server.
    pg.rotate_ca().await.unwrap();
    secrets
        .patch(
            "pg-ca",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"ca.crt": pg.ca_pem()}})),
        )
        .await
        .unwrap();
    merge(
        &f,
        "shop",
        json!({"metadata": {"annotations": {"real-pods-test/poke": "1"}}}),
    )
    .await;
    rolled_to_new_revision(&f, "shop", &second_revision, 1).await;
    let db = answer(&addr, "/db").await;
    assert_eq!(
        (db["ok"].clone(), db["tls"].clone()),
        (json!(true), json!(true)),
        "{db}"
    );
}

/// How many evictions the budget of `name` allows now, once the disruption controller
/// has counted `pods` healthy Pods of it.
async fn evictions_allowed(f: &Fixture, name: &str, pods: i32) -> i32 {
    let budgets = f.api::<PodDisruptionBudget>();
    eventually(
        &format!("{name}'s budget counting {pods} healthy Pods"),
        WAIT,
        || async {
            let b = budgets.get(name).await?;
            let status = b.status.unwrap_or_default();
            let counted = status.current_healthy == Some(pods)
                && status.expected_pods == Some(pods)
                && status.observed_generation == b.metadata.generation;
            Ok(counted.then_some(status.disruptions_allowed.unwrap_or(0)))
        },
    )
    .await
    .unwrap()
}

/// A drain as `kubectl drain` does it: the `pods/eviction` subresource, Pod by Pod. The
/// real API server lets the budget's one disruption through, refuses the next while the
/// replacement is not ready (429), and lets it through once it is; the application
/// answers every request meanwhile.
#[tokio::test]
async fn a_drain_evicts_one_pod_at_a_time_and_the_application_answers_throughout() {
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    create(
        &f.apps,
        &hello("drained", &node.images().hello_v1.reference, 2),
    )
    .await
    .unwrap();
    ready(&f, "drained", 2).await;
    let addr = service_addr(&f, "drained").await;
    answer(&addr, "/").await;
    assert_eq!(evictions_allowed(&f, "drained", 2).await, 1);
    // A client that reports a refusal (kube's default one retries a 429 until it passes,
    // as `kubectl drain` would, only quietly).
    let mut config = harness::shared_real_node().await.unwrap().admin_config();
    config.default_retry = false;
    let pods: kube::Api<Pod> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), &f.ns);
    let names: Vec<String> = pods_of(&f, "drained")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let traffic = Traffic::start(addr.clone());
    pods.evict(&names[0], &EvictParams::default())
        .await
        .expect("the first eviction is within the budget");
    match pods.evict(&names[1], &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429, "{status:?}");
            assert!(status.message.contains("disruption budget"), "{status:?}");
        }
        other => panic!(
            "the second eviction must be refused while the first Pod's replacement is not ready: {other:?}"
        ),
    }
    // The replacement ready, the budget allows one again: the second Pod may go.
    ready(&f, "drained", 2).await;
    assert_eq!(evictions_allowed(&f, "drained", 2).await, 1);
    pods.evict(&names[1], &EvictParams::default())
        .await
        .expect("the second eviction once the replacement is ready");
    ready(&f, "drained", 2).await;
    eventually("both first Pods gone, two new ones ready", WAIT, || async {
        let now: Vec<String> = pods_of(&f, "drained")
            .await
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        (now.len() == 2 && !now.iter().any(|n| names.contains(n))).then_some(())
    })
    .await
    .unwrap();
    answer(&addr, "/").await;
    let (versions, failed, last) = traffic.finish().await;
    assert_eq!(failed, 0, "requests failed during the drain: {last:?}");
    assert!(versions.get("v1").copied().unwrap_or(0) > 0, "{versions:?}");
}

/// `GET /config` through `addr` until every answer of `n` in a row is `want` (the
/// variable and the file the app read), from `pods` different Pods at least.
async fn config_everywhere(addr: &str, want: (&str, &str), pods: usize) {
    eventually(&format!("every Pod reading {want:?}"), WAIT, || async {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let (status, body) = real_node::get(addr, "/config").await.ok()?;
            let answer: Value = serde_json::from_str(&body).ok()?;
            let read = (
                answer["env"]["CFG_GREETING"].as_str()?,
                answer["files"]["token"].as_str()?,
            );
            if status != 200 || read != want {
                return None;
            }
            seen.insert(answer["pod"].as_str()?.to_owned());
        }
        (seen.len() >= pods).then_some(())
    })
    .await
    .unwrap();
}

/// The application reads a ConfigMap as variables and a Secret as files, with only what
/// its Pod gets; an edit of either reaches every Pod through a rollout, and no request
/// fails meanwhile.
#[tokio::test]
async fn the_application_reads_its_config_and_an_edit_reaches_every_pod_with_none_failing() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    let put_map = |greeting: &'static str| {
        let maps = f.api::<ConfigMap>();
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": "settings"},
                "data": {"CFG_GREETING": greeting, "app.properties": "level=info"},
            }))
            .unwrap();
            maps.patch(
                "settings",
                &PatchParams::apply("real-pods").force(),
                &Patch::Apply(&cm),
            )
            .await
            .unwrap();
        }
    };
    let put_secret = |token: &'static str| {
        let secrets = f.api::<Secret>();
        async move {
            let s: Secret = serde_json::from_value(json!({
                "metadata": {"name": "keys"},
                "stringData": {"token": token},
            }))
            .unwrap();
            secrets
                .patch(
                    "keys",
                    &PatchParams::apply("real-pods").force(),
                    &Patch::Apply(&s),
                )
                .await
                .unwrap();
        }
    };
    put_map("hello").await;
    put_secret("s1").await;
    let app = common::testing::app("configured", &node.images().hello_v1.reference)
        .replicas(2)
        .env("HELLO_CONFIG_DIR", "/etc/hello")
        .spec(|s| {
            s.rollout = Some(RolloutSpec {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            });
            s.config = vec![
                common::ConfigSource {
                    config_map: Some("settings".into()),
                    ..Default::default()
                },
                common::ConfigSource {
                    secret: Some("keys".into()),
                    mount_path: Some("/etc/hello".into()),
                    ..Default::default()
                },
            ];
        })
        .build();
    create(&f.apps, &app).await.unwrap();
    ready(&f, "configured", 2).await;
    let addr = service_addr(&f, "configured").await;
    config_everywhere(&addr, ("hello", "s1"), 2).await;

    let traffic = Traffic::start(addr.clone());
    put_map("bonjour").await;
    config_everywhere(&addr, ("bonjour", "s1"), 2).await;
    put_secret("s2").await;
    config_everywhere(&addr, ("bonjour", "s2"), 2).await;
    let (versions, failed, last) = traffic.finish().await;
    assert_eq!(
        failed, 0,
        "requests failed during the config rollouts: {last:?}"
    );
    assert!(versions.get("v1").copied().unwrap_or(0) > 0, "{versions:?}");
    ready(&f, "configured", 2).await;
}

/// How long an autoscaler may take to act on a change of load: its 15 s sync period,
/// metrics-server's 15 s resolution, the kubelet's CPU window, and (down) the 20 s
/// stabilization the harness gives kube-controller-manager, on 2 busy cores.
const AUTOSCALED: Duration = Duration::from_secs(240);

/// `spec.autoscaling` on a real node with metrics-server: load sent at the application
/// through its Service makes the autoscaler scale the AppService up, no load brings it
/// back down, no request fails meanwhile, and the controller never writes `replicas`
/// (the autoscaler's, through the scale subresource).
#[tokio::test]
async fn the_autoscaler_scales_on_real_cpu_load_and_back_down() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let node = node().await;
    let (f, _ctl) = Fixture::setup().real_node().start().await.unwrap();
    node.metrics_server(&f.client).await.unwrap();
    let cpu = |q: &str| BTreeMap::from([("cpu".to_owned(), Quantity(q.to_owned()))]);
    let app = common::testing::app("elastic", &node.images().hello_v1.reference)
        .replicas(1)
        .spec(|s| {
            // Each Pod may use a tenth of a core: the load's bound on a machine the other
            // tests share.
            s.resources = Some(ResourceRequirements {
                requests: Some(cpu("20m")),
                limits: Some(cpu("100m")),
                ..ResourceRequirements::default()
            });
            s.autoscaling = Some(common::AutoscalingSpec {
                min_replicas: Some(1),
                max_replicas: 3,
                target_cpu_utilization_percentage: Some(50),
            });
            s.rollout = Some(RolloutSpec {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            });
        })
        .build();
    create(&f.apps, &app).await.unwrap();
    ready(&f, "elastic", 1).await;
    let hpas = f.api::<HorizontalPodAutoscaler>();
    let utilization = || async {
        let hpa = hpas.get("elastic").await.ok()?;
        hpa.status?
            .current_metrics?
            .first()?
            .resource
            .as_ref()?
            .current
            .average_utilization
    };
    eventually(
        "the autoscaler reading the Pod's CPU use",
        AUTOSCALED,
        || async {
            match utilization().await {
                Some(u) => Ok(Some(u)),
                None => {
                    let status = hpas.get("elastic").await?.status;
                    Err(format!(
                        "the autoscaler's status: {}",
                        serde_json::to_string(&status)?
                    )
                    .into())
                }
            }
        },
    )
    .await
    .unwrap();
    let addr = service_addr(&f, "elastic").await;

    // Load: two clients keeping a CPU busy 200 ms per request.
    let load = Traffic::start_on(addr.clone(), "/burn?ms=200", 2);
    let up = eventually("the autoscaler scaling up", AUTOSCALED, || async {
        let replicas = f.apps.get("elastic").await.ok()?.spec.replicas?;
        (replicas >= 2).then_some(replicas)
    })
    .await
    .unwrap();
    ready(&f, "elastic", up).await;
    let (_, failed, last) = load.finish().await;
    assert_eq!(failed, 0, "requests failed under load: {last:?}");
    let busy = utilization().await;

    // No load: back down to the least.
    eventually("the autoscaler scaling back down", AUTOSCALED, || async {
        let replicas = f.apps.get("elastic").await.ok()?.spec.replicas?;
        (replicas == 1).then_some(())
    })
    .await
    .unwrap();
    ready(&f, "elastic", 1).await;
    println!("autoscaled: up to {up} replicas at {busy:?}% of the CPU request, back to 1");

    // The replicas are the autoscaler's: no write of them is the controller's.
    let app = f.apps.get("elastic").await.unwrap();
    let writers: Vec<String> = app
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|v| v.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !writers.iter().any(|m| m == common::names::FIELD_MANAGER),
        "{writers:?}"
    );
}

/// `spec.expose` through a real Gateway implementation (Traefik, on the node's host): the
/// HTTPRoute the controller makes and the HTTPS listener it adds to the shared Gateway
/// carry requests by host name to the Pods. Before the Secret exists the Gateway refuses
/// the listener and the AppService says so; once it exists, HTTPS answers with its
/// certificate, `status.url` says where, and a rollout under HTTPS traffic fails no
/// request; removing `tls` removes the listener and leaves plain HTTP.
#[tokio::test]
async fn an_exposed_appservice_answers_https_by_host_name_through_the_gateway() {
    use controller::config::GatewayRef;
    use k8s_openapi::api::core::v1::Secret;
    let node = node().await;
    let client = harness::shared_real_node().await.unwrap().client();
    let gateway = node.gateway(&client).await.unwrap();
    let (name, https_port) = (gateway.name.clone(), i32::from(gateway.https_port()));
    let gateway_ref = GatewayRef {
        namespace: gateway.namespace.clone(),
        name,
    };
    let (f, ctl) = Fixture::setup()
        .real_node()
        .config(move |c| {
            c.expose_gateway = Some(gateway_ref);
            c.expose_https_port = https_port;
        })
        .start()
        .await
        .unwrap();
    // A host name of this namespace's own: the Gateway is shared by every test.
    let host = format!("site.{}.example.test", f.ns.name());
    let app = common::testing::app("site", &node.images().hello_v1.reference)
        .replicas(2)
        .spec(|s| {
            s.expose = Some(common::ExposeSpec {
                hostnames: vec![host.clone()],
                tls: Some(common::ExposeTls {
                    secret_name: Some("site-tls".into()),
                    issuer_ref: None,
                }),
                ..common::ExposeSpec::default()
            });
            s.rollout = Some(RolloutSpec {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            });
        })
        .build();
    create(&f.apps, &app).await.unwrap();

    // No Secret yet: the Gateway refuses the listener, and the status quotes it.
    let refused = eventually("the listener refused without its Secret", WAIT, || async {
        let a = f.apps.get("site").await.ok()?;
        condition(&a, READY)
            .filter(|(s, r, _)| s != TRUE && r == reasons::EXPOSURE_REFUSED)
            .map(|(_, _, m)| m)
    })
    .await
    .unwrap();
    assert!(refused.contains(&host), "{refused}");

    let ca = certs::Ca::new("exposure test CA").unwrap();
    let serving = ca.serving_cert(&[host.as_str()]).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "site-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem},
    }))
    .unwrap();
    f.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let app = ready(&f, "site", 2).await;
    assert_eq!(
        app.status.and_then(|s| s.url),
        Some(format!("https://{host}/"))
    );

    // HTTPS by host name, verified against the Secret's CA alone; plain HTTP too (the
    // admin's listener admits every namespace's routes).
    let https = gateway.https_client(&host, ca.cert_pem()).unwrap();
    let url = format!("https://{host}/");
    let body = eventually("HTTPS through the Gateway", WAIT, || async {
        let response = https.get(&url).send().await.ok()?;
        (response.status() == 200).then_some(response.text().await.ok()?)
    })
    .await
    .unwrap();
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["version"], "v1", "{answer}");
    let http = gateway.http_client(&host).unwrap();
    let plain = http
        .get(format!("http://{host}/"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(plain, 200);

    // At rest, nothing is written, the shared Gateway included: its status updates wake
    // the AppService, which finds its listeners as it applied them.
    let names = support::settle(&f, &ctl.metrics).await.unwrap();
    let writes = support::writes_by_resource(&ctl.metrics);
    support::poke(&f, &ctl.metrics, &names, 2).await.unwrap();
    assert_eq!(support::writes_by_resource(&ctl.metrics), writes);

    // A rollout under HTTPS traffic: every request answered.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, https, url) = (stop.clone(), https.clone(), url.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed, mut versions, mut last) =
                (0u64, 0u64, BTreeMap::<String, u64>::new(), None);
            while !stop.load(Ordering::Relaxed) {
                match https.get(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        ok += 1;
                        let body: Value = serde_json::from_str(&r.text().await.unwrap_or_default())
                            .unwrap_or_default();
                        let version = body["version"].as_str().unwrap_or("-").to_owned();
                        *versions.entry(version).or_default() += 1;
                    }
                    Ok(r) => {
                        failed += 1;
                        last = Some(format!("HTTP {}", r.status()));
                    }
                    Err(e) => {
                        failed += 1;
                        last = Some(e.to_string());
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ok, failed, versions, last)
        })
    };
    f.apps
        .patch(
            "site",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": node.images().hello_v2.reference}})),
        )
        .await
        .unwrap();
    eventually("every HTTPS answer from v2", WAIT, || async {
        let response = https.get(&url).send().await.ok()?;
        let body: Value = serde_json::from_str(&response.text().await.ok()?).ok()?;
        (body["version"] == "v2").then_some(())
    })
    .await
    .unwrap();
    ready(&f, "site", 2).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed, versions, last) = traffic.await.unwrap();
    println!("HTTPS during the rollout: {ok} answered {versions:?}, {failed} failed");
    assert_eq!(failed, 0, "requests failed during the rollout: {last:?}");
    assert!(
        versions.contains_key("v1") && versions.contains_key("v2"),
        "{versions:?}"
    );

    // No more TLS: the listener goes (the admin's stays), plain HTTP remains.
    f.apps
        .patch(
            "site",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"expose": {"tls": null}}})),
        )
        .await
        .unwrap();
    let listener = controller::listeners::listener_name(&host);
    let gateways: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        client.clone(),
        &gateway.namespace,
        &harness::gateway_api::gateway(),
    );
    eventually("the HTTPS listener removed", WAIT, || async {
        let g = gateways.get(&gateway.name).await.ok()?;
        let names = harness::gateway_api::listener_names(&g);
        (!names.contains(&listener) && names.iter().any(|n| n == real_node::HTTP_LISTENER))
            .then_some(())
    })
    .await
    .unwrap();
    let app = eventually("the URL back to plain HTTP", WAIT, || async {
        let a = f.apps.get("site").await.ok()?;
        (a.status.as_ref()?.url.as_deref() == Some(&format!("http://{host}/"))).then_some(a)
    })
    .await
    .unwrap();
    assert!(condition(&app, READY).is_some_and(|(s, _, _)| s == TRUE));
    let plain = http
        .get(format!("http://{host}/"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(plain, 200);
}
