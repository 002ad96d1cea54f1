//! CPU cost of answering one review in-process, without TLS or HTTP: decode, rules,
//! policies, encode. For profiling (`valgrind --tool=callgrind`) and for the per-policy
//! cost, next to the cost of only parsing the body into generic JSON; and what judging
//! host names against the AppService cache (`--watch-appservices`) adds: `cached` with
//! `--appservices` AppServices exposing two host names each and a review exposing none,
//! `exposed16` with the review exposing 16 free host names (`exposed16-`: the same
//! review judged without the cache).
//!
//! ```text
//! cargo run --release -p appservice-webhook --example review-profile -- --iterations 20000
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use webhook::admission;
use webhook::appservices::{AppServiceCache, DEFAULT_CACHE_BYTES};
use webhook::policy::PolicySet;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const REVIEW: &str = include_str!("../tests/fixtures/update-realistic.json");
const EXAMPLE_POLICIES: &str = include_str!("../../examples/policies/no-latest-in-production.yaml");
const MORE: [&str; 7] = [
    "object.spec.image.startsWith('registry.example.com/')",
    "!has(object.spec.env) || object.spec.env.all(e, !e.name.startsWith('AWS_'))",
    "has(object.metadata.labels) && 'team' in object.metadata.labels",
    "!has(object.spec.resources) || !has(object.spec.resources.limits) || !('memory' in object.spec.resources.limits) || quantity(object.spec.resources.limits.memory).compareTo(quantity('4Gi')) <= 0",
    "!has(object.spec.port) || object.spec.port >= 1024",
    "size(object.metadata.name) <= 40",
    "!has(object.spec.replicas) || object.spec.replicas <= 50",
];

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 20_000)]
    iterations: u32,
    /// Only this part: parse, validate, cached, exposed16-, exposed16, mutate, policies3,
    /// policies10 (default: all).
    #[arg(long)]
    only: Option<String>,
    /// AppServices in the cache of `cached` and `exposed16`, each exposing two host names.
    #[arg(long, default_value_t = 20_000)]
    appservices: usize,
}

/// A cache of `n` AppServices in 50 namespaces, each exposing two host names.
fn cache(n: usize) -> AppServiceCache {
    let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
    for i in 0..n {
        cache.apply(
            serde_json::from_value(json!({
                "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                "metadata": {"name": format!("app-{i}"), "namespace": format!("team-{}", i % 50),
                             "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"image": "registry.example.com/app:v1",
                         "ports": [{"name": "http", "port": 8080}],
                         "expose": {"hostnames": [format!("app-{i}.example.com"), format!("www.app-{i}.example.com")]}}
            }))
            .unwrap(),
        );
    }
    cache
}

/// The review with its object exposing 16 host names nobody holds (the v1alpha1
/// annotation, as a v1alpha1 client's write carries them).
fn exposing_16() -> bytes::Bytes {
    let mut review: serde_json::Value = serde_json::from_str(REVIEW).unwrap();
    let hostnames: Vec<String> = (0..16)
        .map(|i| format!("h{i}.checkout.example.com"))
        .collect();
    review["request"]["object"]["metadata"]["annotations"]
        [common::names::ANNOTATION_V1BETA1_EXPOSE] =
        json!(json!({"hostnames": hostnames}).to_string());
    serde_json::to_vec(&review).unwrap().into()
}

fn policies(n: usize) -> PolicySet {
    let mut yaml = EXAMPLE_POLICIES.to_owned();
    for (i, expression) in MORE.iter().take(n.saturating_sub(3)).enumerate() {
        yaml.push_str(&format!(
            "\n  - name: more-{i}\n    expression: {expression:?}\n    message: m\n"
        ));
    }
    let set = PolicySet::from_yaml(Path::new("p.yaml"), &yaml).unwrap();
    assert_eq!(set.len(), n);
    println!("{n} policies: estimated worst-case cost {}", set.cost());
    set
}

fn main() {
    let args = Args::parse();
    let body = bytes::Bytes::from_static(REVIEW.as_bytes());
    let none = PolicySet::default();
    let three = policies(3);
    let ten = policies(10);
    let run = |name: &str, f: &dyn Fn()| {
        if args.only.as_deref().is_some_and(|o| o != name) {
            return None;
        }
        for _ in 0..args.iterations / 10 {
            f();
        }
        let started = Instant::now();
        for _ in 0..args.iterations {
            f();
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / f64::from(args.iterations);
        println!("{name:<12} {us:>8.2} µs per review");
        Some(us)
    };
    run("parse", &|| {
        black_box(serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap());
    });
    let judged = |body: &bytes::Bytes, set: &PolicySet, appservices: Option<&AppServiceCache>| {
        let review = admission::decode_review(black_box(body)).unwrap();
        let judge = admission::Judge {
            policies: set,
            namespace_object: None,
            appservices,
            metrics: None,
        };
        let response = admission::validate(&review, &judge);
        assert!(response.allowed, "{:?}", response.result);
        black_box(serde_json::to_vec(&response.into_review()).unwrap());
    };
    let validate = |set: &PolicySet| judged(&body, set, None);
    let base = run("validate", &|| validate(&none));
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| o == name);
    if ["cached", "exposed16-", "exposed16"]
        .into_iter()
        .any(wanted)
    {
        let cache = cache(args.appservices);
        println!(
            "{} AppServices cached, {} bytes accounted",
            cache.len(),
            cache.bytes()
        );
        run("cached", &|| judged(&body, &none, Some(&cache)));
        let exposing = exposing_16();
        // The same review without the cache: what validating the 16 host names costs.
        run("exposed16-", &|| judged(&exposing, &none, None));
        run("exposed16", &|| judged(&exposing, &none, Some(&cache)));
    }
    run("mutate", &|| {
        let review = admission::decode_review(black_box(&body)).unwrap();
        let response = admission::mutate(&review);
        black_box(serde_json::to_vec(&response.into_review()).unwrap());
    });
    for (name, set, n) in [("policies3", &three, 3.0), ("policies10", &ten, 10.0)] {
        if let (Some(with), Some(base)) = (run(name, &|| validate(set)), base) {
            println!("{:<12} {:>8.2} µs per policy", "", (with - base) / n);
        }
    }
}
