//! What the controller watches: each cache is a reflector over a watch with our backoff,
//! trimmed to what reconcile reads, and flagged once its initial list is in; a trigger
//! is a metadata-only watch with the same backoff and no cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tracing::info;

use crate::config::Config;
use crate::context::CacheSync;
use crate::following::{following, per_scope};
use crate::share::Share;

/// Starts the caches of one controller: the client, the watched namespace (or all) and
/// the flags their initial lists set.
pub(crate) struct Watch<'a> {
    client: &'a Client,
    config: &'a Config,
    synced: &'a Arc<CacheSync>,
    /// With sharding: every watch follows what this member serves, a new list for each
    /// change of it.
    share: Option<Arc<dyn Share>>,
}

impl<'a> Watch<'a> {
    pub(crate) fn new(client: &'a Client, config: &'a Config, synced: &'a Arc<CacheSync>) -> Self {
        Watch {
            client,
            config,
            synced,
            share: None,
        }
    }

    pub(crate) fn following(mut self, share: Option<Arc<dyn Share>>) -> Self {
        self.share = share;
        self
    }

    /// The watch of `K` selected by `watch`, with our backoff: one watch, or with
    /// sharding one per scope of the share (selected by the API server with
    /// `--sharded-watch`, filtered here otherwise).
    fn watcher<K>(
        &self,
        watch: watcher::Config,
        listed: &Arc<AtomicU64>,
    ) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let namespace = self.config.watch_namespace.clone();
        let make = move |client: Client, watch: &watcher::Config| {
            watcher(
                scoped_api::<K>(&client, namespace.as_deref()),
                watch.clone(),
            )
            .backoff(WatchBackoff::default())
            .boxed()
        };
        match &self.share {
            Some(share) => following(
                share.clone(),
                per_scope(self.client.clone(), move |c| make(c, &watch)),
                listed.clone(),
            )
            .boxed(),
            None => make(self.client.clone(), &watch),
        }
    }

    /// A cache of `K` selected by `watch`, each object trimmed by `trim` before it is
    /// stored; `flag` is set once the initial list is in the store. Returns the store and
    /// the stream that feeds it (and the controller).
    pub(crate) fn cached<K, T>(
        &self,
        watch: watcher::Config,
        trim: T,
        flag: fn(&CacheSync) -> &AtomicBool,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K, T>,
    )
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        T: FnMut(&mut K) + Send + 'static,
    {
        let (store, writer) = reflector::store::<K>();
        let listed = Arc::new(AtomicU64::new(0));
        let cache = std::any::type_name::<K>();
        if let Some(share) = &self.share {
            share.register(cache);
        }
        let share = self.share.clone();
        let stream = reflector::reflector(writer, self.watcher(watch, &listed).modify(trim))
            // Marked after the reflector: the store holds the list once the flag says so.
            .inspect(mark_synced(self.synced.clone(), flag))
            .inspect(move |event| {
                if let (Some(share), Ok(watcher::Event::InitDone)) = (&share, event) {
                    share.listed(cache, listed.load(Ordering::Acquire));
                }
            });
        (store, stream)
    }
}

impl Watch<'_> {
    /// The objects of `K` selected by `watch`, as their metadata only, each time one is
    /// added, changed or deleted: a trigger, with no store behind it. The API server
    /// sends metadata only, so nothing else of the object (a Secret's data) ever reaches
    /// the controller through it.
    pub(crate) fn triggers<K>(
        &self,
        watch: watcher::Config,
    ) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + use<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.watcher::<PartialObjectMeta<K>>(watch, &Arc::new(AtomicU64::new(0)))
            .touched_objects()
    }
}

/// The cache of the configured Gateway, one object selected by name in its namespace
/// (the RBAC grants this one Gateway only), whatever namespace the controller watches
/// and with or without sharding. Its `managedFields` are read (which listeners each
/// AppService's field manager owns) before the view drops them.
pub(crate) fn gateway(
    client: &Client,
    gateway: &crate::config::GatewayRef,
    synced: &Arc<CacheSync>,
) -> (
    Store<crate::gateway_api::GatewayView>,
    impl Stream<Item = Result<watcher::Event<crate::gateway_api::GatewayView>, watcher::Error>>
    + Send
    + use<>,
) {
    let (store, writer) = reflector::store();
    let api: Api<crate::gateway_api::GatewayView> =
        Api::namespaced(client.clone(), &gateway.namespace);
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={}", gateway.name))
        .any_semantic();
    let stream = reflector::reflector(
        writer,
        watcher(api, config).backoff(WatchBackoff::default()),
    )
    .inspect(mark_synced(synced.clone(), |s| &s.gateway));
    (store, stream)
}

/// A watch-stream observer that records when the initial list is complete. (Awaiting
/// `Store::wait_until_ready` here instead would steal the wake-up the controller itself
/// waits for: that future wakes only its latest waiter.)
fn mark_synced<K>(
    synced: Arc<CacheSync>,
    flag: fn(&CacheSync) -> &std::sync::atomic::AtomicBool,
) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
    move |event| {
        if let Ok(watcher::Event::InitDone) = event
            && !flag(&synced).swap(true, Ordering::Relaxed)
            && synced.all()
        {
            info!("caches synced");
        }
    }
}

/// An Api scoped to the watched namespace, or to all namespaces.
fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Backoff of the watches. kube-runtime's default grows to 30 s and forgets its errors
/// only after two quiet minutes, so after an API server restart (a few connection
/// errors, then "too old resource version") the caches stayed stale for half a minute.
/// This one starts at 100 ms, doubles to at most 5 s (so an outage costs one request
/// every few seconds per watch) and is reset by the first event that comes through.
#[derive(Clone, Debug)]
pub(crate) struct WatchBackoff {
    next: std::time::Duration,
}

impl WatchBackoff {
    const MIN: std::time::Duration = std::time::Duration::from_millis(100);
    const MAX: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        let nominal = self.next;
        self.next = (nominal * 2).min(Self::MAX);
        // Half to all of the nominal delay, so many watches do not retry in step.
        Some(nominal.mul_f64(0.5 + rand::random::<f64>() / 2.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// Keeps only the name and namespace of an object that is not ours (all reconcile needs
/// to know is that the name is taken), and the resourceVersion the reflector tracks.
pub(crate) fn name_only<K>(obj: &mut PartialObjectMeta<K>) {
    let meta = std::mem::take(&mut obj.metadata);
    obj.metadata = kube::api::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        ..kube::api::ObjectMeta::default()
    };
}

/// No pause beyond a yield: for a stream whose parts back off on their own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct YieldBackoff;

impl Iterator for YieldBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(1))
    }
}

impl kube::runtime::utils::Backoff for YieldBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn watch_backoff_is_bounded_and_resets() {
        let mut b = WatchBackoff::default();
        let delays: Vec<_> = (&mut b).take(12).collect();
        assert!(delays[0] <= WatchBackoff::MIN && delays[0] >= WatchBackoff::MIN / 2);
        assert!(delays.iter().all(|d| *d <= WatchBackoff::MAX));
        assert!(delays[11] >= WatchBackoff::MAX / 2);
        b.reset();
        assert!(b.next().is_some_and(|d| d <= WatchBackoff::MIN));
    }
}
