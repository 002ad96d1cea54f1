//! A bound on what one AppService's children cost in the controller's caches.
//!
//! The children are kept as views (`controller::view`); this holds the heap per cached
//! child, counted by an instrumented allocator over real reflector stores, under a
//! bound, so a change that puts whole objects (or their `managedFields`) back into the
//! caches fails here rather than in a 10,000-object benchmark run. The figures of every
//! representation are in `benches/cache_cost.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use controller::view::{DeploymentView, ServiceView};
use kube::runtime::reflector;
use serde::de::DeserializeOwned;
use serde_json::Value;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[path = "../benches/support/objects.rs"]
mod objects;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes held per object after decoding `docs` into a reflector store of `K`.
fn held_per_object<K>(docs: &[Value]) -> (reflector::Store<K>, usize)
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let (reader, change) = objects::into_store(GLOBAL, docs, |_: &mut K| {});
    let held = change
        .bytes_allocated
        .saturating_sub(change.bytes_deallocated);
    (reader, held / docs.len())
}

// One test in this binary: the allocator counts every thread.
#[test]
fn cached_children_stay_small() {
    const N: usize = 2000;
    let (mut deployments, mut services) = (Vec::new(), Vec::new());
    for i in 0..N {
        let (d, s, _) = objects::objects(i, 10);
        deployments.push(d);
        services.push(s);
    }
    let (store, deployment) = held_per_object::<DeploymentView>(&deployments);
    assert_eq!(store.state().len(), N);
    let (store, service) = held_per_object::<ServiceView>(&services);
    assert_eq!(store.state().len(), N);
    // Measured: 3.0 KB per Deployment with 10 env vars (3,093 B, of which the two
    // security contexts of the restricted Pod template take 130 B), 1.5 KB per Service;
    // as whole objects without managedFields they took 12.3 KB and 3.4 KB, and as
    // decoded 24.6 KB and 15.7 KB.
    assert!(
        deployment < 7 * 1024,
        "a cached Deployment holds {deployment} bytes"
    );
    assert!(service < 2 * 1024, "a cached Service holds {service} bytes");
}
