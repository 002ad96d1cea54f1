//! AppServices with their Deployment and Service as the API server returns them (server
//! defaults, a `managedFields` entry per writer, a Deployment status as
//! kube-controller-manager writes it), as JSON: the input of `benches/cache_cost.rs` and
//! of `tests/cache_size.rs`, and the measurement both make of them.

use controller::subject::Subject;
use std::alloc::System;

use common::AppService;
use controller::desired::{desired_deployment, desired_service};
use kube::runtime::{reflector, watcher};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use stats_alloc::{Region, Stats, StatsAlloc};

/// Decodes each JSON document as `K` (bytes off the wire, as the watch does), passes it
/// through `modify` and keeps it in a reflector store; returns the store and what
/// `alloc` (the binary's instrumented global allocator) counted meanwhile.
pub fn into_store<K>(
    alloc: &'static StatsAlloc<System>,
    docs: &[Value],
    modify: impl Fn(&mut K),
) -> (reflector::Store<K>, Stats)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let bytes: Vec<Vec<u8>> = docs
        .iter()
        .map(|d| serde_json::to_vec(d).unwrap())
        .collect();
    let (reader, mut writer) = reflector::store::<K>();
    let region = Region::new(alloc);
    for b in &bytes {
        let mut obj: K = serde_json::from_slice(b).unwrap();
        modify(&mut obj);
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    (reader, region.change())
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
    let mut builder = common::testing::app(
        &format!("app-{i:05}"),
        &format!("registry.example.com/bench/app-{i}:v1"),
    )
    .replicas(1)
    .namespace("scale")
    .uid(&format!("00000000-0000-4000-8000-{i:012}"));
    for e in 0..env {
        builder = builder.env(&format!("VAR_{e}"), &format!("value-{e}"));
    }
    builder.build()
}

/// The three objects of AppService `i` as JSON, as a watch delivers them.
pub fn objects(i: usize, env: usize) -> (Value, Value, Value) {
    let a = app(i, env);
    let mut d = serde_json::to_value(desired_deployment(
        &Subject::of(&a).expect("the AppService has its identity"),
        &controller::external::PodAdditions::default(),
    ))
    .unwrap();
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
        ("schedulerName", json!("default-scheduler")),
    ] {
        pod[k] = v;
    }
    // The API server's default when the template has none; ours has one.
    if pod.get("securityContext").is_none() {
        pod["securityContext"] = json!({});
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

    let mut s = serde_json::to_value(desired_service(
        &Subject::of(&a).expect("the AppService has its identity"),
    ))
    .unwrap();
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
