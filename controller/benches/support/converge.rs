//! Timing convergence from the outside: when each AppService of a namespace first shows
//! `status.observedGeneration` equal to its generation, read from a watch of our own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::AppService;
use futures::{StreamExt, TryStreamExt};
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{app, wait_all};

/// When each AppService of a namespace first showed `status.observedGeneration` equal to
/// its generation (at least `min_generation`).
pub type Done = Arc<Mutex<HashMap<String, Instant>>>;

/// Starts a watch of `ns` recording [`Done`] for generations from `min_generation` on.
pub fn watch_status(client: Client, ns: &str, min_generation: i64) -> Done {
    watch_status_of(Api::namespaced(client, ns), min_generation)
}

/// [`watch_status`] of the AppServices `apps` reaches (every namespace's with
/// `Api::all`; names are then unique across namespaces in the benchmarks).
pub fn watch_status_of(apps: Api<AppService>, min_generation: i64) -> Done {
    let done: Done = Arc::default();
    let d = done.clone();
    tokio::spawn(async move {
        let stream = watcher(apps, watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(a)) = stream.next().await {
            let observed = a.status.as_ref().and_then(|s| s.observed_generation);
            let generation = a.metadata.generation;
            if observed.is_some()
                && observed == generation
                && generation.is_some_and(|g| g >= min_generation)
            {
                let now = Instant::now();
                if let Ok(mut map) = d.lock() {
                    map.entry(a.name_any()).or_insert(now);
                }
            }
        }
    });
    done
}

/// Creates N AppServices in a burst, returning when each create request started.
pub async fn burst(
    apps: &Api<AppService>,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    burst_over(std::slice::from_ref(apps), n, concurrency).await
}

/// [`burst`] spread over the namespaces of `apis`, the i-th AppService in the
/// `i % apis.len()`-th (names stay unique across them).
pub async fn burst_over(
    apis: &[Api<AppService>],
    n: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    anyhow::ensure!(!apis.is_empty(), "no namespace to create AppServices in");
    let started = futures::stream::iter(0..n)
        .map(|i| {
            let apps = apis[i % apis.len()].clone();
            async move {
                let a = app(i, 1);
                let at = Instant::now();
                apps.create(&PostParams::default(), &a).await?;
                anyhow::Ok((a.name_any(), at))
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<HashMap<_, _>>()
        .await?;
    Ok(started)
}

/// Every object as if started now: for a precreated burst, where times count from the
/// start of the controller.
pub fn started_now(created: HashMap<String, Instant>) -> HashMap<String, Instant> {
    let now = Instant::now();
    created.into_keys().map(|name| (name, now)).collect()
}

/// Per-object times from start to done, and the whole span.
pub struct Latencies {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub total: Duration,
}

/// The latencies of the objects of `started` that are [`Done`].
pub fn latencies(started: &HashMap<String, Instant>, done: &Done) -> Latencies {
    let done = done.lock().map(|m| m.clone()).unwrap_or_default();
    let mut each: Vec<Duration> = started
        .iter()
        .filter_map(|(name, at)| done.get(name).map(|d| d.saturating_duration_since(*at)))
        .collect();
    each.sort();
    let pick = |q: f64| {
        each.get(((each.len() as f64 * q) as usize).min(each.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let first = started.values().min().copied();
    let last = started
        .keys()
        .filter_map(|name| done.get(name))
        .max()
        .copied();
    Latencies {
        p50: pick(0.50),
        p99: pick(0.99),
        max: each.last().copied().unwrap_or_default(),
        total: match (first, last) {
            (Some(f), Some(l)) => l.saturating_duration_since(f),
            _ => Duration::ZERO,
        },
    }
}

/// Waits until `n` objects are [`Done`].
pub async fn wait_done(done: &Done, n: usize, timeout: Duration, what: &str) -> anyhow::Result<()> {
    wait_all(
        timeout,
        what,
        || async { Ok(done.lock().map(|m| m.len()).unwrap_or(0)) },
        n,
    )
    .await
    .map(|_| ())
}
