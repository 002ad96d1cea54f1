//! The one shared context of reconcile, error policy and the ops server: what a pass
//! reads (client, configuration, caches, leadership) and what the controller remembers
//! between passes (failures, its own status writes, children it created).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{AppService, AppServiceStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::Hooks;
use crate::config::Config;
use crate::error::BackoffPolicy;
use crate::external::External;
use crate::metrics::Metrics;
use crate::status::Clock;
use crate::view::{DeploymentView, ServiceView};

/// Initial-list completion of the caches, set from their watch streams.
#[derive(Debug, Default)]
pub struct CacheSync {
    pub appservices: AtomicBool,
    pub deployments: AtomicBool,
    pub services: AtomicBool,
    pub other_deployments: AtomicBool,
    pub other_services: AtomicBool,
}

impl CacheSync {
    pub fn all(&self) -> bool {
        [
            &self.appservices,
            &self.deployments,
            &self.services,
            &self.other_deployments,
            &self.other_services,
        ]
        .iter()
        .all(|f| f.load(Ordering::Relaxed))
    }
}

/// The watch caches reconcile reads from, and whether their initial lists are in.
pub struct Caches {
    /// Our children (labelled `managed-by=appservice-operator`), as views.
    pub deployments: Store<DeploymentView>,
    pub services: Store<ServiceView>,
    /// The names of Deployments and Services without that label.
    pub other_deployments: Store<PartialObjectMeta<Deployment>>,
    pub other_services: Store<PartialObjectMeta<Service>>,
    /// Which caches have completed their initial list.
    pub synced: Arc<CacheSync>,
}

/// A child of `kind` (`"Deployment"`, `"Service"`) of an AppService. Children are named
/// after their AppService, so the AppService's reference names both.
pub type ChildKey = (&'static str, ObjectRef<AppService>);

pub struct Context {
    client: Client,
    config: Config,
    recorder: Recorder,
    clock: Box<dyn Clock>,
    metrics: Arc<Metrics>,
    /// External resources behind the finalizer.
    external: Arc<dyn External>,
    /// Image verification, when enabled.
    images: Option<Arc<crate::images::Verifier>>,
    caches: Caches,
    /// True while this replica may reconcile: it leads, or (with sharding) it is a live
    /// member of the ring.
    leading: watch::Receiver<bool>,
    /// True while this replica holds the leader Lease (the same flag without sharding):
    /// what runs once per cluster (the orphan scan, the sharder) follows it.
    leader: watch::Receiver<bool>,
    backoff_policy: BackoffPolicy,
    /// Consecutive failures per object; cleared by a successful reconcile.
    failures: Mutex<HashMap<ObjectRef<AppService>, u32>>,
    /// Per object, the last status we wrote and the resourceVersion it was written over.
    written: Mutex<WrittenOver<ObjectRef<AppService>>>,
    /// Children we created that our caches have not shown yet.
    created: Mutex<HashSet<ChildKey>>,
    /// Per child, the view our last write of it returned and the resourceVersion that
    /// write replaced, until the cache moves past that version.
    child_writes: Mutex<WrittenOver<ChildKey>>,
    /// With `--sharded-watch`: the namespace buckets this shard serves.
    served: Option<Arc<crate::shard::served::Served>>,
    /// AppServices whose finalizer we released: the resourceVersion it was released
    /// from, and when. Kept apart from what [`Context::forget`] clears, since a release
    /// ends the pass with the object forgotten, while the cache may still show it.
    released: Mutex<Recent<ObjectRef<AppService>, String>>,
    /// AppServices (by uid) being deleted whose external cleanup succeeded: a deletion
    /// is never undone and no pass of a deleting object creates external state, so a
    /// later pass (after the finalizer's removal failed, say on a conflict) only has
    /// the finalizer left to remove. Bounded as `released` is.
    cleaned: Mutex<Recent<String, ()>>,
}

/// What the finalizer did lately that the cache may not show yet: per key, a value
/// (the resourceVersion a release was made from, or nothing) and when. Entries older
/// than [`RELEASE_MEMORY`] go on the next insert, so the map is bounded by the
/// deletions of that long.
struct Recent<K, V> {
    map: HashMap<K, (V, Instant)>,
}

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq, V> Recent<K, V> {
    fn remember(&mut self, key: K, value: V, now: Instant) {
        self.map
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < RELEASE_MEMORY);
        self.map.insert(key, (value, now));
    }

    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|(v, _)| v)
    }
}

impl<K: std::hash::Hash + Eq> Recent<K, String> {
    /// Whether `key` was released from exactly `resource_version`.
    fn released_from(&self, key: &K, resource_version: Option<&str>) -> bool {
        self.get(key)
            .is_some_and(|rv| Some(rv.as_str()) == resource_version)
    }
}

/// How long a release is remembered: far longer than a cache takes to show it, and short
/// enough to bound the memory by the deletions of that long.
const RELEASE_MEMORY: Duration = Duration::from_secs(300);

/// Writes whose result the cache has not shown yet: per key, the resourceVersion the
/// write replaced and what it returned. One mechanism for the status (keyed by the
/// AppService) and for the children (keyed by their slot).
struct WrittenOver<K> {
    map: HashMap<K, (String, Arc<dyn Any + Send + Sync>)>,
}

impl<K> Default for WrittenOver<K> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq> WrittenOver<K> {
    /// What the last write of `key` returned, while the cache (at `cached`) still holds
    /// the object it replaced; otherwise the memory is dropped.
    fn get<V: Clone + 'static>(&mut self, key: &K, cached: Option<&str>) -> Option<V> {
        self.drop_stale(key, cached);
        let written = self.map.get(key)?.1.downcast_ref::<V>().cloned();
        if written.is_none() {
            self.map.remove(key);
        }
        written
    }

    /// Forgets the write of `key` if the cache (at `cached`) has moved past the object it
    /// replaced: the cache is authoritative again.
    fn drop_stale(&mut self, key: &K, cached: Option<&str>) {
        if self
            .map
            .get(key)
            .is_some_and(|(replaced, _)| Some(replaced.as_str()) != cached)
        {
            self.map.remove(key);
        }
    }

    fn insert<V: Send + Sync + 'static>(&mut self, key: K, replaced: String, written: V) {
        self.map.insert(key, (replaced, Arc::new(written)));
    }

    fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.map.retain(|k, _| keep(k));
    }

    fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }
}

/// A poisoned lock is recovered: every map here stays consistent between statements, so
/// a reconcile that panicked cannot have left one half-updated.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Context {
    pub fn new(
        client: Client,
        config: Config,
        recorder: Recorder,
        hooks: Hooks,
        caches: Caches,
        leading: watch::Receiver<bool>,
    ) -> Self {
        Context {
            client,
            config,
            recorder,
            clock: hooks.clock,
            metrics: hooks.metrics,
            external: hooks.external,
            images: hooks.images,
            caches,
            leader: leading.clone(),
            leading,
            backoff_policy: BackoffPolicy::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
            created: Mutex::default(),
            child_writes: Mutex::default(),
            served: None,
            released: Mutex::default(),
            cleaned: Mutex::default(),
        }
    }

    /// With `--sharded-watch`: the buckets this shard serves gate its passes.
    pub fn with_served(mut self, served: Option<Arc<crate::shard::served::Served>>) -> Self {
        self.served = served;
        self
    }

    pub fn served(&self) -> Option<&Arc<crate::shard::served::Served>> {
        self.served.as_ref()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn external(&self) -> &dyn External {
        self.external.as_ref()
    }

    /// Image verification, when enabled.
    pub fn images(&self) -> Option<&crate::images::Verifier> {
        self.images.as_deref()
    }

    /// The external step's periodic work, if it has any (see [`External::background`]).
    pub fn external_background(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        self.external.clone().background(self.leader.clone())
    }

    /// With sharding, the leader Lease's flag, apart from the membership that gates
    /// reconciles.
    /// True while this replica holds the leader Lease: what runs once per cluster.
    pub fn ring_leader(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    pub fn with_ring_leader(mut self, leader: watch::Receiver<bool>) -> Self {
        self.leader = leader;
        self
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    pub fn backoff_policy(&self) -> &BackoffPolicy {
        &self.backoff_policy
    }

    /// The leadership flag, to wait on its changes.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Every cache has completed its initial list (what `/readyz` reports).
    pub fn is_ready(&self) -> bool {
        self.caches.synced.all()
    }

    /// Records a failure of `key`; returns how many failures preceded it.
    pub fn record_failure(&self, key: &ObjectRef<AppService>) -> u32 {
        let mut map = lock(&self.failures);
        let n = map.entry(key.clone()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// Forgets the failures of `key` (after a success, or when it is gone).
    pub fn reset_failures(&self, key: &ObjectRef<AppService>) {
        lock(&self.failures).remove(key);
    }

    /// The status we last wrote for `key`, if the cached object (at `resource_version`)
    /// is still the one that write replaced, i.e. the cache has not caught up yet.
    pub fn status_written_over(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) -> Option<AppServiceStatus> {
        lock(&self.written).get(key, resource_version)
    }

    /// Forgets the status we wrote for `key` if the cached object (at
    /// `resource_version`) has moved past the one that write replaced: the live status
    /// is authoritative again.
    pub fn drop_stale_status_write(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) {
        lock(&self.written).drop_stale(key, resource_version);
    }

    /// Records that `status` was written over the object at `resource_version`.
    pub fn remember_status_write(
        &self,
        key: ObjectRef<AppService>,
        resource_version: String,
        status: AppServiceStatus,
    ) {
        lock(&self.written).insert(key, resource_version, status);
    }

    /// Records that we released our finalizer from `key` at `resource_version`.
    pub fn remember_release(&self, key: ObjectRef<AppService>, resource_version: String) {
        lock(&self.released).remember(key, resource_version, Instant::now());
    }

    /// Whether the cached `key` at `resource_version` is the object we released our
    /// finalizer from: a cache that has not heard of the release yet, whose pass must not
    /// clean up a second time.
    pub fn released_from(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) -> bool {
        lock(&self.released).released_from(key, resource_version)
    }

    /// Records that the external cleanup of the deleting AppService `uid` succeeded.
    pub fn remember_cleanup(&self, uid: String) {
        lock(&self.cleaned).remember(uid, (), Instant::now());
    }

    /// Whether the external cleanup of the deleting AppService `uid` succeeded already.
    pub fn cleaned_up(&self, uid: &str) -> bool {
        lock(&self.cleaned).get(uid).is_some()
    }

    /// Forgets everything about `key` (it is gone).
    pub fn forget(&self, key: &ObjectRef<AppService>) {
        self.reset_failures(key);
        lock(&self.written).remove(key);
        lock(&self.created).retain(|(_, owner)| owner != key);
        lock(&self.child_writes).retain(|(_, owner)| owner != key);
    }

    /// Records that we created `child`: until the cache shows it, a miss in the cache
    /// means "not seen yet", not "absent" (creating it again would fail with 409).
    pub fn created(&self, child: ChildKey) {
        lock(&self.created).insert(child);
    }

    /// Whether we created `child` and the cache has not shown it yet.
    pub fn awaiting(&self, child: &ChildKey) -> bool {
        lock(&self.created).contains(child)
    }

    /// The cache shows `child` (or the API server says it is gone): stop awaiting it.
    pub fn seen(&self, child: &ChildKey) {
        let mut set = lock(&self.created);
        if !set.is_empty() {
            set.remove(child);
        }
    }

    /// What we last wrote to `child`, if the cached object (at `resource_version`) is
    /// still the one that write replaced: the cache has not caught up, and deciding on
    /// it would write the same change again. Once the cache has moved on, it is
    /// authoritative again and the memory is dropped.
    pub fn child_written_over<V: Clone + 'static>(
        &self,
        child: &ChildKey,
        resource_version: Option<&str>,
    ) -> Option<V> {
        lock(&self.child_writes).get(child, resource_version)
    }

    /// Records that a write of `child` replaced the object at `replaced` with `written`.
    pub fn remember_child_write<V: Send + Sync + 'static>(
        &self,
        child: ChildKey,
        replaced: String,
        written: V,
    ) {
        lock(&self.child_writes).insert(child, replaced, written);
    }
}

#[cfg(test)]
mod tests {
    use super::{RELEASE_MEMORY, Recent, WrittenOver};
    use std::time::{Duration, Instant};

    #[test]
    fn a_release_is_known_for_the_version_released_from_and_forgotten_in_time() {
        let t0 = Instant::now();
        let mut r = Recent::<&str, String>::default();
        assert!(!r.released_from(&"app", Some("5")));
        r.remember("app", "5".to_owned(), t0);
        assert!(
            r.released_from(&"app", Some("5")),
            "the cache still shows it"
        );
        assert!(!r.released_from(&"app", Some("6")), "a later version");
        assert!(!r.released_from(&"app", None));
        assert!(!r.released_from(&"other", Some("5")));
        assert!(r.get(&"app").is_some(), "whatever the version");
        assert!(r.get(&"other").is_none());
        // Bounded: an insert past the memory drops what is older.
        r.remember(
            "other",
            "9".to_owned(),
            t0 + RELEASE_MEMORY - Duration::from_secs(1),
        );
        assert!(r.released_from(&"app", Some("5")));
        r.remember("third", "1".to_owned(), t0 + RELEASE_MEMORY);
        assert!(!r.released_from(&"app", Some("5")));
        assert!(r.released_from(&"other", Some("9")));
        assert_eq!(r.map.len(), 2);
    }

    #[test]
    fn a_write_stands_in_for_the_cache_until_the_cache_moves_on() {
        let mut w = WrittenOver::<&str>::default();
        assert_eq!(w.get::<String>(&"app", Some("1")), None);
        w.insert("app", "1".to_owned(), "written at 2".to_owned());
        // The cache still holds the object the write replaced: the write stands in.
        assert_eq!(
            w.get::<String>(&"app", Some("1")).as_deref(),
            Some("written at 2")
        );
        assert_eq!(
            w.get::<String>(&"app", Some("1")).as_deref(),
            Some("written at 2")
        );
        // The cache moved past it (our write, or a later one): the cache decides, and
        // stays deciding even if an old version were seen again.
        assert_eq!(w.get::<String>(&"app", Some("2")), None);
        assert_eq!(w.get::<String>(&"app", Some("1")), None);
    }

    #[test]
    fn a_write_of_another_type_or_another_key_is_not_taken() {
        let mut w = WrittenOver::<&str>::default();
        w.insert("app", "1".to_owned(), 7_u32);
        assert_eq!(w.get::<String>(&"other", Some("1")), None);
        assert_eq!(w.get::<u32>(&"app", Some("1")), Some(7));
        assert_eq!(w.get::<String>(&"app", Some("1")), None);
        assert_eq!(
            w.get::<u32>(&"app", Some("1")),
            None,
            "dropped on a mismatch"
        );
        w.insert("app", "1".to_owned(), 7_u32);
        w.insert("gone", "1".to_owned(), 8_u32);
        w.retain(|k| *k != "gone");
        assert_eq!(w.get::<u32>(&"gone", Some("1")), None);
        assert_eq!(w.get::<u32>(&"app", Some("1")), Some(7));
    }
}
