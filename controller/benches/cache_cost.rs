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
use common::AppService;
use controller::view::{self, DeploymentView, ServiceView};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::runtime::reflector;
use serde::de::DeserializeOwned;
use serde_json::Value;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[path = "support/objects.rs"]
mod objects;

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

/// The heap held per object in a store of `K` built from `docs` (see
/// [`objects::into_store`]).
fn measure<K>(docs: &[Value], modify: impl Fn(&mut K)) -> (reflector::Store<K>, Held)
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let (reader, change) = objects::into_store(GLOBAL, docs, modify);
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
        let (d, s, a) = objects::objects(i, args.env);
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
