//! What one AppService costs in the webhook's AppService cache (`--watch-appservices`,
//! the one `/scale` writes are judged on), counted by an instrumented allocator, under a
//! bound; and that the cache's own accounting (what `--appservice-cache-bytes` limits)
//! does not undercount what it holds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use kube::api::DynamicObject;
use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use webhook::appservices::{AppServiceCache, DEFAULT_CACHE_BYTES, MAX_CACHED_OBJECT_BYTES};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// examples/appservice.yaml as the API server serves it: metadata with managedFields
/// (which the cache drops), the controller's status with its conditions.
fn stored(i: usize) -> DynamicObject {
    let condition = |kind: &str, reason: &str| {
        json!({"type": kind, "status": "True", "reason": reason, "observedGeneration": 3,
               "lastTransitionTime": "2026-01-01T00:00:00Z",
               "message": "2/2 replicas ready, database checkout ready"})
    };
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {
            "name": format!("checkout-{i}"), "namespace": format!("team-{}", i % 50),
            "uid": "0a4bd8b6-4b8f-4c59-9d4c-1f2c1f0e8a51", "resourceVersion": format!("{}", 100_000 + i),
            "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/name": "checkout", "team": "payments"},
            "finalizers": ["platform.example.com/cleanup"],
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "apiVersion": "platform.example.com/v1beta1",
                 "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:image": {}, "f:replicas": {}, "f:ports": {}, "f:env": {}, "f:resources": {}, "f:database": {}}}},
                {"manager": "appservice-controller", "operation": "Update", "subresource": "status",
                 "apiVersion": "platform.example.com/v1beta1", "time": "2026-01-01T00:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}, "f:endpoint": {}}}}
            ]
        },
        "spec": {
            "image": "registry.example.com/checkout:v3.4.0", "replicas": 2,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "metrics", "port": 9090, "protocol": "TCP"}],
            "env": [{"name": "LOG_LEVEL", "value": "info"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "database": {"class": "production-postgresql"}
        },
        "status": {
            "observedGeneration": 3, "endpoint": format!("checkout-{i}.team.svc:8080"),
            "conditions": [condition("Ready", "Available"), condition("DatabaseReady", "Provisioned"),
                           condition("Degraded", "AsExpected")]
        }
    }))
    .unwrap()
}

// One test in this binary: the allocator counts every thread.
#[test]
fn a_cached_appservice_stays_small_and_is_accounted_for() {
    const N: usize = 2000;
    let objects: Vec<DynamicObject> = (0..N).map(stored).collect();
    let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
    let region = Region::new(GLOBAL);
    for object in &objects {
        cache.apply(object.clone());
    }
    let change = region.change();
    assert_eq!(cache.len(), N);
    let held = change
        .bytes_allocated
        .saturating_sub(change.bytes_deallocated)
        / N;
    let accounted = cache.bytes() / N;
    // Measured: 1,593 bytes held per AppService like examples/appservice.yaml with its
    // status and two managedFields entries (dropped), 1,587 accounted.
    println!("a cached AppService holds {held} bytes; the cache accounts {accounted}");
    assert!(held < 2 * 1024, "a cached AppService holds {held} bytes");
    // The budget counts at least what is really held, up to the map's spare capacity.
    assert!(
        held <= accounted * 3 / 2,
        "held {held} bytes, accounted {accounted}"
    );
    // And the per-object bound caps the worst case.
    assert!(accounted < MAX_CACHED_OBJECT_BYTES);
}
