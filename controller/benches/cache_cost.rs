//! What one AppService costs in the controller's caches (a command, not a test):
//!
//! ```text
//! cargo bench -p appservice-controller --bench cache_cost -- --n 10000
//! ```
//!
//! Builds N AppServices with their Deployment and Service as the API server returns
//! them (server defaults, a `managedFields` entry per writer, a Deployment status as
//! kube-controller-manager writes it), decodes each from JSON the way the watches do,
//! and puts it into a reflector store. A counting allocator reports the heap each
//! representation holds per object: the bytes requested, the allocations, and an
//! estimate of what malloc hands out for them (16 bytes of header and rounding per
//! allocation), which is what shows up in RSS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use clap::Parser;
use common::{AppService, AppServiceSpec};
use controller::desired::{desired_deployment, desired_service};
use controller::view::{self, DeploymentView, ServiceView};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Parser, Debug)]
struct Args {
    /// Number of AppServices.
    #[arg(long, default_value_t = 10_000)]
    n: usize,
    /// Environment variables per AppService (the benchmark's AppServices have none).
    #[arg(long, default_value_t = 0)]
    env: usize,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Heap held per object: bytes requested, allocations, and an estimate of what glibc's
/// malloc hands out for them (a 16-byte header-and-rounding overhead per allocation).
#[derive(Clone, Copy)]
struct Held {
    requested: isize,
    malloc: isize,
    count: isize,
}

fn managed_fields(manager: &str, operation: &str) -> Value {
    json!({
        "manager": manager, "operation": operation, "apiVersion": "v1",
        "time": "2026-11-30T12:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/instance": {},
            "f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/name": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"00000000-0000-0000-0000-000000000000\"}": {}}},
            "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}
    })
}

fn server_metadata(v: &mut Value, i: usize, hash: bool) {
    let m = &mut v["metadata"];
    m["uid"] = json!(format!("8d3f6a2e-0000-4000-8000-{i:012}"));
    m["resourceVersion"] = json!(format!("{}", 100_000 + i));
    m["generation"] = json!(1);
    m["creationTimestamp"] = json!("2026-11-30T12:00:00Z");
    m["managedFields"] = json!([
        managed_fields("appservice-controller", "Apply"),
        managed_fields("kube-controller-manager", "Update")
    ]);
    if hash {
        m["annotations"] = json!({
            "platform.example.com/desired-hash": "0123456789abcdef0123456789abcdef",
            "deployment.kubernetes.io/revision": "1",
        });
    }
}

fn app(i: usize, env: usize) -> AppService {
    let mut spec: AppServiceSpec = serde_json::from_value(json!({
        "image": format!("registry.example.com/bench/app-{i}:v1"),
        "replicas": 1,
        "env": (0..env).map(|e| json!({"name": format!("VAR_{e}"), "value": format!("value-{e}")})).collect::<Vec<_>>(),
    }))
    .unwrap();
    spec.ports.clear();
    let mut a = AppService::new(&format!("app-{i:05}"), spec);
    a.metadata.namespace = Some("scale".into());
    a.metadata.uid = Some(format!("00000000-0000-4000-8000-{i:012}"));
    a
}

/// The three objects of AppService `i` as JSON, as a watch delivers them.
fn objects(i: usize, env: usize) -> (Value, Value, Value) {
    let a = app(i, env);
    let mut d = serde_json::to_value(desired_deployment(&a).unwrap()).unwrap();
    server_metadata(&mut d, i, true);
    let spec = d["spec"].as_object_mut().unwrap();
    spec.insert("revisionHistoryLimit".into(), json!(10));
    spec.insert("progressDeadlineSeconds".into(), json!(600));
    spec.insert(
        "strategy".into(),
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
    );
    let pod = &mut d["spec"]["template"]["spec"];
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
    ] {
        pod[k] = v;
    }
    let c = &mut pod["containers"][0];
    c["terminationMessagePath"] = json!("/dev/termination-log");
    c["terminationMessagePolicy"] = json!("File");
    c["imagePullPolicy"] = json!("IfNotPresent");
    c["resources"] = json!({});
    for (k, v) in [
        ("timeoutSeconds", 1),
        ("periodSeconds", 10),
        ("successThreshold", 1),
        ("failureThreshold", 3),
    ] {
        c["readinessProbe"][k] = json!(v);
    }
    d["status"] = json!({
        "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
        "availableReplicas": 1,
        "conditions": [
            {"type": "Available", "status": "True", "lastUpdateTime": "2026-11-30T12:00:05Z",
             "lastTransitionTime": "2026-11-30T12:00:05Z", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability."},
            {"type": "Progressing", "status": "True", "lastUpdateTime": "2026-11-30T12:00:05Z",
             "lastTransitionTime": "2026-11-30T12:00:01Z", "reason": "NewReplicaSetAvailable",
             "message": format!("ReplicaSet \"app-{i:05}-6d4cf56db6\" has successfully progressed.")}
        ]
    });

    let mut s = serde_json::to_value(desired_service(&a).unwrap()).unwrap();
    server_metadata(&mut s, i, true);
    let spec = s["spec"].as_object_mut().unwrap();
    let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
    for (k, v) in [
        ("clusterIP", json!(ip)),
        ("clusterIPs", json!([ip])),
        ("sessionAffinity", json!("None")),
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
        ("internalTrafficPolicy", json!("Cluster")),
    ] {
        spec.insert(k.into(), v);
    }
    s["status"] = json!({"loadBalancer": {}});

    let mut av = serde_json::to_value(&a).unwrap();
    server_metadata(&mut av, i, false);
    av["metadata"]["finalizers"] = json!(["platform.example.com/cleanup"]);
    av["status"] = json!({
        "observedGeneration": 1, "readyReplicas": 1,
        "selector": format!("app.kubernetes.io/name=app-{i:05}"),
        "endpoint": format!("http://app-{i:05}.scale.svc:8080"),
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "message": "1/1 replicas ready",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-30T12:00:05Z"},
            {"type": "Progressing", "status": "False", "reason": "Reconciled", "message": "rollout complete",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-30T12:00:05Z"},
            {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-30T12:00:01Z"}
        ]
    });
    (d, s, av)
}

/// Decodes each JSON document as `K`, passes it through `modify` and keeps it in a
/// reflector store; returns the heap held per object.
fn measure<K>(docs: &[Value], modify: impl Fn(&mut K)) -> (reflector::Store<K>, Held)
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let (reader, mut writer) = reflector::store::<K>();
    let region = Region::new(GLOBAL);
    for doc in docs {
        // As the watch does: bytes off the wire, decoded into `K`.
        let bytes = serde_json::to_vec(doc).unwrap();
        let mut obj: K = serde_json::from_slice(&bytes).unwrap();
        drop(bytes);
        modify(&mut obj);
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    let change = region.change();
    let n = docs.len() as isize;
    let requested = change.bytes_allocated as isize - change.bytes_deallocated as isize;
    let count = change.allocations as isize - change.deallocations as isize;
    let per = Held {
        requested: requested / n,
        malloc: (requested + 16 * count) / n,
        count: count / n,
    };
    (reader, per)
}

fn row(what: &str, h: Held) {
    println!(
        "  {what:<44} {:>7} B requested {:>7} B malloc {:>4} allocations",
        h.requested, h.malloc, h.count
    );
}

fn main() {
    let args = Args::parse();
    if !args.bench {
        eprintln!(
            "cache cost: run it with `cargo bench -p appservice-controller --bench cache_cost`"
        );
        return;
    }
    let n = args.n;
    let (mut ds, mut ss, mut avs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (d, s, a) = objects(i, args.env);
        ds.push(d);
        ss.push(s);
        avs.push(a);
    }
    println!(
        "heap per cached object, {n} objects, {} env vars each (store keys included):",
        args.env
    );
    let mut total_slim = 0;
    let mut total_view = 0;
    {
        let (_s, h) = measure::<Deployment>(&ds, |_| {});
        row("Deployment, as decoded", h);
    }
    {
        let (_s, h) = measure::<Deployment>(&ds, view::slim_meta_of::<Deployment>);
        row("Deployment, metadata slimmed (before)", h);
        total_slim += h.malloc;
    }
    {
        let (_s, h) = measure::<DeploymentView>(&ds, |_| {});
        row("DeploymentView (now)", h);
        total_view += h.malloc;
    }
    {
        let (_s, h) = measure::<Service>(&ss, |_| {});
        row("Service, as decoded", h);
    }
    {
        let (_s, h) = measure::<Service>(&ss, view::slim_meta_of::<Service>);
        row("Service, metadata slimmed (before)", h);
        total_slim += h.malloc;
    }
    {
        let (_s, h) = measure::<ServiceView>(&ss, |_| {});
        row("ServiceView (now)", h);
        total_view += h.malloc;
    }
    {
        let (_s, h) = measure::<AppService>(&avs, |_| {});
        row("AppService, as decoded", h);
    }
    {
        let (_s, h) = measure::<AppService>(&avs, view::slim_app);
        row("AppService, slimmed", h);
        total_slim += h.malloc;
        total_view += h.malloc;
    }
    println!(
        "  three caches per AppService: {:.2} KiB before, {:.2} KiB now (malloc bytes)",
        total_slim as f64 / 1024.0,
        total_view as f64 / 1024.0
    );
}
