//! AppServices in memory, so a `/scale` write is judged by the same rules as a write of
//! the AppService itself, and a host name is exposed by one AppService only.
//!
//! The review of a scale write carries an `autoscaling/v1` Scale (name, namespace,
//! resourceVersion, replicas), not the AppService, and the webhook never calls the API
//! server while answering. With `--watch-appservices` a watch of the hub version
//! (`v1beta1`) keeps every AppService here, as compact JSON without `managedFields`;
//! the scale review is then judged on the cached object with `spec.replicas` replaced.
//!
//! * **Sync.** The webhook is not ready until the first complete list is in memory; a
//!   re-list (after the watch expired) replaces the contents at once when complete.
//! * **Freshness.** The old Scale's `resourceVersion` is the stored AppService's. Before
//!   a scale review is judged, the handler waits, at most [`SETTLE_TIMEOUT`], for the
//!   cache to hold that version (a watch event follows a write within milliseconds);
//!   if it still does not, the review is denied with 409 Conflict, which `kubectl
//!   scale`, the HPA and client-go's `RetryOnConflict` retry.
//! * **Bounds.** One object is kept up to [`MAX_CACHED_OBJECT_BYTES`] of JSON, all of
//!   them up to `--appservice-cache-bytes`. Past either bound only its name and
//!   resourceVersion are kept, and a scale write of it is denied saying why (the same
//!   change through the AppService itself is judged as usual).
//! * **Host names.** The same watch keeps which AppService holds each host name of
//!   `spec.expose.hostnames`, for every cached AppService, those kept by name only
//!   included ([`hostnames`]); a write claiming a host name another AppService holds is
//!   refused ([`AppServiceCache::held_elsewhere`]).

mod hostnames;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use kube::Api;
use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::value::RawValue;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use hostnames::{Claims, HostIndex};

/// JSON bytes of one cached AppService at most. An AppService of 128 env entries of
/// 100 bytes and its status is about 20 KiB; one larger is kept by name only.
pub const MAX_CACHED_OBJECT_BYTES: usize = 64 * 1024;
/// Default of `--appservice-cache-bytes`: the JSON of every cached AppService together
/// (about 20,000 AppServices of a typical 1.5 KiB).
pub const DEFAULT_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// Longest wait of a scale review for the cache to hold the version it is about.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes an entry costs besides its strings: the map slot, the key and the entry.
const ENTRY_OVERHEAD: usize = 2 * std::mem::size_of::<(Key, Entry)>();

/// Where an AppService lives.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    namespace: Box<str>,
    name: Box<str>,
}

/// What is kept of one AppService.
#[derive(Debug)]
struct Entry {
    resource_version: Box<str>,
    object: Kept,
    /// Its host names, also in the index: kept whatever `object` is. Boxed: most
    /// AppServices expose nothing, and their entries stay a pointer smaller.
    claims: Option<Box<Claims>>,
}

/// The object, or why only its name is kept.
#[derive(Clone, Debug)]
enum Kept {
    Object(Box<RawValue>),
    /// Its JSON is this many bytes, over [`MAX_CACHED_OBJECT_BYTES`].
    TooLarge(usize),
    /// Keeping it would have taken the cache over its byte budget.
    OverBudget,
}

impl Entry {
    fn bytes(&self, key: &Key) -> usize {
        let object = match &self.object {
            Kept::Object(raw) => raw.get().len(),
            Kept::TooLarge(_) | Kept::OverBudget => 0,
        };
        let claims = self.claims.as_deref().map_or(0, Claims::bytes);
        ENTRY_OVERHEAD
            + key.namespace.len()
            + key.name.len()
            + self.resource_version.len()
            + object
            + claims
    }
}

/// What a scale review finds in the cache.
#[derive(Debug)]
pub enum Lookup {
    /// The AppService at the wanted resourceVersion, as hub JSON.
    Found(Box<RawValue>),
    /// Not in the cache (yet).
    Missing,
    /// In the cache at another resourceVersion (the watch is behind).
    Stale { cached: String },
    /// Kept by name only: its JSON is this many bytes.
    TooLarge(usize),
    /// Kept by name only: the cache is at its byte budget.
    OverBudget { budget: usize },
}

/// The cached AppServices; cheap to clone.
#[derive(Clone)]
pub struct AppServiceCache {
    inner: Arc<Inner>,
}

struct Inner {
    objects: RwLock<Objects>,
    synced: AtomicBool,
    /// Bumped on every change, so a waiting review wakes up.
    changes: watch::Sender<u64>,
    max_bytes: usize,
}

#[derive(Default)]
struct Objects {
    map: HashMap<Key, Entry>,
    bytes: usize,
    /// Host name → the AppService holding it, for every entry of `map`.
    hosts: HostIndex,
}

impl Objects {
    fn insert(&mut self, watched: Watched, max: usize) {
        let Watched {
            key,
            resource_version,
            json,
            created,
            hostnames,
        } = watched;
        self.remove(&key);
        let size = json.get().len();
        let mut entry = Entry {
            resource_version,
            object: Kept::Object(json),
            claims: self.hosts.claim(&key, created, hostnames),
        };
        if size > MAX_CACHED_OBJECT_BYTES {
            entry.object = Kept::TooLarge(size);
        } else if self.bytes + entry.bytes(&key) > max {
            entry.object = Kept::OverBudget;
        }
        if !matches!(entry.object, Kept::Object(_)) {
            tracing::warn!(
                namespace = %key.namespace,
                name = %key.name,
                bytes = size,
                cache_bytes = self.bytes,
                "AppService kept by name only: its /scale writes are refused (its host names are kept)"
            );
        }
        self.bytes += entry.bytes(&key);
        self.map.insert(key, entry);
    }

    fn remove(&mut self, key: &Key) {
        if let Some(old) = self.map.remove(key) {
            self.bytes = self.bytes.saturating_sub(old.bytes(key));
            if let Some(claims) = &old.claims {
                self.hosts.release(claims);
            }
        }
    }
}

impl std::fmt::Debug for AppServiceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppServiceCache")
            .field("synced", &self.is_synced())
            .field("objects", &self.len())
            .finish_non_exhaustive()
    }
}

/// The hub version, which the cache keeps whatever version an object was written in.
fn hub_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(common::names::GROUP, "v1beta1", "AppService");
    ApiResource::from_gvk_with_plural(&gvk, "appservices")
}

impl AppServiceCache {
    /// An empty cache holding at most `max_bytes` of objects (filled by [`Self::spawn`]
    /// or, in tests, [`Self::apply`]).
    pub fn new(max_bytes: usize) -> Self {
        AppServiceCache {
            inner: Arc::new(Inner {
                objects: RwLock::new(Objects::default()),
                synced: AtomicBool::new(false),
                changes: watch::channel(0).0,
                max_bytes,
            }),
        }
    }

    /// Starts the watch of every AppService; it runs until `shutdown` turns true.
    pub fn spawn(
        client: kube::Client,
        max_bytes: usize,
        mut shutdown: watch::Receiver<bool>,
    ) -> (Self, JoinHandle<()>) {
        let cache = AppServiceCache::new(max_bytes);
        let writer = cache.clone();
        let task = tokio::spawn(async move {
            let api: Api<DynamicObject> = Api::all_with(client, &hub_resource());
            let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
            let mut events = std::pin::pin!(events);
            // A re-list fills this and replaces the contents when complete.
            let mut relist: Option<Objects> = None;
            loop {
                tokio::select! {
                    _ = shutdown.wait_for(|stop| *stop) => return,
                    event = events.next() => match event {
                        Some(Ok(event)) => writer.handle(event, &mut relist),
                        Some(Err(error)) => tracing::warn!(%error, "AppService watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        (cache, task)
    }

    fn handle(&self, event: Event<DynamicObject>, relist: &mut Option<Objects>) {
        let max = self.inner.max_bytes;
        match event {
            Event::Init => *relist = Some(Objects::default()),
            Event::InitApply(object) => {
                if let (Some(objects), Some(watched)) = (relist.as_mut(), Watched::of(object)) {
                    objects.insert(watched, max);
                }
            }
            Event::InitDone => {
                if let Some(objects) = relist.take() {
                    let count = objects.map.len();
                    let bytes = objects.bytes;
                    let hostnames = objects.hosts.len();
                    *self.write() = objects;
                    if !self.inner.synced.swap(true, Ordering::SeqCst) {
                        tracing::info!(appservices = count, bytes, hostnames, "AppServices cached");
                    }
                }
                self.changed();
            }
            Event::Apply(object) => {
                if let Some(watched) = Watched::of(object) {
                    self.write().insert(watched, max);
                    self.changed();
                }
            }
            Event::Delete(object) => {
                if let Some(key) = key_of(&object) {
                    self.write().remove(&key);
                    self.changed();
                }
            }
        }
    }

    /// Puts an object in the cache as a watch event would (tests and benchmarks).
    pub fn apply(&self, object: DynamicObject) {
        if let Some(watched) = Watched::of(object) {
            self.write().insert(watched, self.inner.max_bytes);
            self.inner.synced.store(true, Ordering::SeqCst);
            self.changed();
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Objects> {
        self.inner
            .objects
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Objects> {
        self.inner
            .objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// True once the first complete list of AppServices is in memory.
    pub fn is_synced(&self) -> bool {
        self.inner.synced.load(Ordering::SeqCst)
    }

    /// How many AppServices are cached.
    pub fn len(&self) -> usize {
        self.read().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the cache accounts for: every entry's strings and fixed overhead.
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }

    /// The AppService `namespace/name` at `resource_version`, or why not.
    pub fn lookup(&self, namespace: &str, name: &str, resource_version: &str) -> Lookup {
        let key = Key {
            namespace: namespace.into(),
            name: name.into(),
        };
        let objects = self.read();
        let Some(entry) = objects.map.get(&key) else {
            return Lookup::Missing;
        };
        if &*entry.resource_version != resource_version {
            return Lookup::Stale {
                cached: entry.resource_version.to_string(),
            };
        }
        match &entry.object {
            Kept::Object(raw) => Lookup::Found(raw.clone()),
            Kept::TooLarge(size) => Lookup::TooLarge(*size),
            Kept::OverBudget => Lookup::OverBudget {
                budget: self.inner.max_bytes,
            },
        }
    }

    /// The host names of `hostnames` an AppService other than `namespace/name` holds,
    /// each with its position in `hostnames` and its holder (for the admins' log: the
    /// holder is never told to the writer). O(`hostnames`), under one read lock; nothing
    /// locked for an object that exposes nothing.
    pub fn held_elsewhere(&self, namespace: &str, name: &str, hostnames: &[String]) -> Vec<Taken> {
        if hostnames.is_empty() {
            return Vec::new();
        }
        let objects = self.read();
        hostnames
            .iter()
            .enumerate()
            .filter_map(|(index, host)| {
                let holder = objects.hosts.holder(host)?;
                (&*holder.namespace != namespace || &*holder.name != name).then(|| Taken {
                    index,
                    holder_namespace: holder.namespace.to_string(),
                    holder_name: holder.name.to_string(),
                })
            })
            .collect()
    }

    /// The namespace and name of the AppService holding `host`, when one does.
    pub fn holder(&self, host: &str) -> Option<(String, String)> {
        let objects = self.read();
        let key = objects.hosts.holder(host)?;
        Some((key.namespace.to_string(), key.name.to_string()))
    }

    /// Waits, at most [`SETTLE_TIMEOUT`], until the cache holds the AppService a scale
    /// review is about at the review's resourceVersion (`target`, from the decoded review:
    /// [`crate::admission::Review::scale_target`]). The review is judged afterwards
    /// whatever the outcome: a cache still behind then is a 409 of the review itself.
    pub async fn settle(&self, target: &ScaleTarget) {
        let mut changes = self.inner.changes.subscribe();
        let fresh = |cache: &Self| {
            matches!(
                cache.lookup(&target.namespace, &target.name, &target.resource_version),
                Lookup::Found(_) | Lookup::TooLarge(_) | Lookup::OverBudget { .. }
            )
        };
        let wait = async {
            while !fresh(self) {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(SETTLE_TIMEOUT, wait).await;
    }
}

/// What the cache takes of a watched object.
struct Watched {
    key: Key,
    resource_version: Box<str>,
    /// The object without managedFields.
    json: Box<RawValue>,
    /// When it was created: the oldest claimant of a host name holds it.
    created: Timestamp,
    /// `spec.expose.hostnames`.
    hostnames: Vec<String>,
}

/// Where a watched object lives.
fn key_of(object: &DynamicObject) -> Option<Key> {
    Some(Key {
        namespace: object.metadata.namespace.as_deref()?.into(),
        name: object.metadata.name.as_deref()?.into(),
    })
}

impl Watched {
    fn of(mut object: DynamicObject) -> Option<Watched> {
        let key = key_of(&object)?;
        let resource_version: Box<str> = object.metadata.resource_version.clone()?.into();
        // The API server always sets it; one without sorts after every real one.
        let created = object
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::MAX, |time| time.0);
        let hostnames = hostnames::hostnames_of(&object.data);
        // Policies judge what users write; managedFields are the API server's bookkeeping
        // and often the largest part of an object.
        object.metadata.managed_fields = None;
        if object.types.is_none() {
            object.types = Some(kube::core::TypeMeta {
                api_version: format!("{}/v1beta1", common::names::GROUP),
                kind: "AppService".to_owned(),
            });
        }
        match serde_json::value::to_raw_value(&object) {
            Ok(json) => Some(Watched {
                key,
                resource_version,
                json,
                created,
                hostnames,
            }),
            Err(error) => {
                tracing::warn!(%error, "cannot serialize a watched AppService");
                None
            }
        }
    }
}

/// A host name another AppService holds ([`AppServiceCache::held_elsewhere`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Its position in the list asked about.
    pub index: usize,
    pub holder_namespace: String,
    pub holder_name: String,
}

/// The AppService a scale review is judged on, at the resourceVersion it scaled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleTarget {
    pub namespace: String,
    pub name: String,
    pub resource_version: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn object(name: &str, rv: &str, env: usize) -> DynamicObject {
        let env: Vec<_> = (0..env)
            .map(|i| json!({"name": format!("VAR_{i}"), "value": "x".repeat(90)}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": rv,
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"image": "nginx:1.27", "replicas": 2, "env": env}
        }))
        .unwrap()
    }

    #[test]
    fn objects_are_found_at_their_version_without_managed_fields() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        assert!(matches!(cache.lookup("shop", "a", "1"), Lookup::Missing));
        cache.apply(object("a", "1", 0));
        let Lookup::Found(raw) = cache.lookup("shop", "a", "1") else {
            panic!("not found");
        };
        let value: serde_json::Value = serde_json::from_str(raw.get()).unwrap();
        assert_eq!(value["spec"]["replicas"], 2);
        assert!(value["metadata"].get("managedFields").is_none());
        assert!(matches!(
            cache.lookup("shop", "a", "2"),
            Lookup::Stale { cached } if cached == "1"
        ));
        cache.apply(object("a", "2", 0));
        assert!(matches!(cache.lookup("shop", "a", "2"), Lookup::Found(_)));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn bounds_keep_names_only() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        cache.apply(object("big", "1", 1000));
        assert!(
            matches!(cache.lookup("shop", "big", "1"), Lookup::TooLarge(n) if n > MAX_CACHED_OBJECT_BYTES)
        );
        let small = AppServiceCache::new(4096);
        small.apply(object("a", "1", 20));
        small.apply(object("b", "1", 20));
        assert!(matches!(small.lookup("shop", "a", "1"), Lookup::Found(_)));
        assert!(matches!(
            small.lookup("shop", "b", "1"),
            Lookup::OverBudget { budget: 4096 }
        ));
        assert!(small.bytes() <= 4096);
        // Replacing or deleting an object gives its bytes back.
        let mut relist = None;
        small.handle(Event::Delete(object("a", "1", 20)), &mut relist);
        small.apply(object("b", "2", 20));
        assert!(matches!(small.lookup("shop", "b", "2"), Lookup::Found(_)));
    }

    #[test]
    fn a_relist_replaces_the_contents_when_complete() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let mut relist = None;
        cache.handle(Event::Init, &mut relist);
        cache.handle(Event::InitApply(object("a", "1", 0)), &mut relist);
        assert!(!cache.is_synced());
        assert!(cache.is_empty());
        cache.handle(Event::InitDone, &mut relist);
        assert!(cache.is_synced());
        assert_eq!(cache.len(), 1);
        cache.handle(Event::Init, &mut relist);
        cache.handle(Event::InitApply(object("b", "5", 0)), &mut relist);
        assert!(
            matches!(cache.lookup("shop", "a", "1"), Lookup::Found(_)),
            "kept until done"
        );
        cache.handle(Event::InitDone, &mut relist);
        assert!(matches!(cache.lookup("shop", "a", "1"), Lookup::Missing));
        assert!(matches!(cache.lookup("shop", "b", "5"), Lookup::Found(_)));
    }

    #[tokio::test]
    async fn settle_returns_once_the_version_arrives() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        cache.apply(object("a", "1", 0));
        let target = ScaleTarget {
            namespace: "shop".into(),
            name: "a".into(),
            resource_version: "2".into(),
        };
        let writer = cache.clone();
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.settle(&target).await }
        });
        tokio::task::yield_now().await;
        writer.apply(object("a", "2", 0));
        waiter.await.unwrap();
        assert!(matches!(cache.lookup("shop", "a", "2"), Lookup::Found(_)));
    }
}
