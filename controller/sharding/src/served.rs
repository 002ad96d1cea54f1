//! What one member of a ring serves: the namespace buckets its watches select and its
//! writes may touch ([`super::buckets`]), shared by the claims task ([`super::claims`])
//! that changes them, the core's watches that follow them (as a `Scope`: selected by the
//! API server with `--sharded-watch`, filtered by namespace otherwise), the check of every
//! write against them, and the gate at the top of each pass. A member alone in its ring serves every bucket: the same
//! object, with one member.
//!
//! The order of a release is what makes a handover safe: first the buckets leave
//! `allowed` (the fence refuses every later write to them and the gate every later pass),
//! then [`Served::release`] waits until no write to them is in flight, and only then does
//! the claims task take them out of the Lease, where another member may see them free. An
//! acquired bucket is usable by passes only once every cache has listed it.
//!
//! Beside the buckets, the namespaces this member's ring may serve beside the other rings
//! ([`super::rings`]): a pass or a write needs both. A namespace is let go the same way
//! as a bucket: first it leaves `admitted`, then [`Served::release_namespaces`] waits
//! until no write to it is in flight.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use controller_core::share::{Scope, Select};
use futures::Stream;
use http::Request;
use kube::client::Body;
use tokio::sync::{Notify, watch};

use super::buckets::{BUCKETS, Buckets, bucket};

#[derive(Debug, Default)]
struct Inner {
    /// Writes (and passes) may touch these buckets.
    allowed: Buckets,
    /// Writes under way, per bucket.
    in_flight: Vec<u32>,
    /// The namespaces the rings let this member serve.
    admitted: BTreeSet<String>,
    /// Writes under way, per namespace (none: no entry).
    in_flight_namespaces: HashMap<String, u32>,
    /// The buckets of each generation of watches not yet listed by every cache; the
    /// newest is what the watches select now. Every change of the watched buckets
    /// starts a new generation.
    generations: BTreeMap<u64, Buckets>,
    /// Per cache, the last generation whose initial list is in its store.
    synced: BTreeMap<&'static str, u64>,
}

impl Inner {
    /// The newest generation of watches: its number and buckets. Older ones are dropped
    /// only once every cache listed a newer one, so the newest is always there.
    fn watched(&self) -> (u64, Buckets) {
        self.generations
            .last_key_value()
            .map_or((0, Buckets::NONE), |(n, b)| (*n, *b))
    }
}

/// What passes may run for: the buckets allowed and listed by every cache, and how many
/// times namespaces were admitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usable {
    pub buckets: Buckets,
    pub admissions: u64,
}

/// Shared by everything that follows the served buckets.
pub struct Served {
    inner: Mutex<Inner>,
    drained: Notify,
    /// What the watches select, for the core: the watched buckets as a scope.
    scope: watch::Sender<Scope>,
    /// Whether the API server selects the buckets (`--sharded-watch`).
    server_side: bool,
    usable: watch::Sender<Usable>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("inner", &self.inner)
            .field("server_side", &self.server_side)
            .field("usable", &*self.usable.borrow())
            .finish()
    }
}

impl Default for Served {
    fn default() -> Self {
        Served::new(false)
    }
}

impl Served {
    /// Nothing served yet; `server_side`: the API server selects the buckets
    /// (`--sharded-watch`), otherwise the watches keep their namespaces themselves.
    pub fn new(server_side: bool) -> Self {
        Served {
            inner: Mutex::new(Inner {
                in_flight: vec![0; BUCKETS as usize],
                generations: BTreeMap::from([(0, Buckets::NONE)]),
                ..Inner::default()
            }),
            drained: Notify::new(),
            scope: watch::channel(Scope::default()).0,
            server_side,
            usable: watch::channel(Usable::default()).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The buckets writes may touch now.
    pub fn allowed(&self) -> Buckets {
        self.lock().allowed
    }

    /// The last generation of watches every cache has listed.
    pub fn listed_generation(&self) -> u64 {
        self.lock().synced.values().min().copied().unwrap_or(0)
    }

    /// The buckets the watches select now.
    pub fn watched(&self) -> Buckets {
        self.lock().watched().1
    }

    /// Whether a pass may run for an object in `namespace`.
    pub fn usable(&self, namespace: &str) -> bool {
        self.usable.borrow().buckets.contains_namespace(namespace)
            && self.lock().admitted.contains(namespace)
    }

    /// The namespaces the rings let this member serve now.
    pub fn admitted(&self) -> BTreeSet<String> {
        self.lock().admitted.clone()
    }

    /// Changes of [`Self::usable`]: each time buckets become usable or namespaces are
    /// admitted, their objects need a pass (the caches hold them, but the gate stopped
    /// their passes).
    pub fn subscribe_usable(&self) -> watch::Receiver<Usable> {
        self.usable.subscribe()
    }

    /// Takes `namespaces` on: writes and passes may touch them (within the buckets).
    pub fn admit(&self, namespaces: &BTreeSet<String>) {
        if namespaces.is_empty() {
            return;
        }
        let mut inner = self.lock();
        inner.admitted.extend(namespaces.iter().cloned());
        drop(inner);
        self.usable.send_modify(|u| u.admissions += 1);
    }

    /// Lets `namespaces` go: from now on the fence refuses writes to them and the gate
    /// passes; completes once no write to them is in flight any more.
    pub async fn release_namespaces(&self, namespaces: &BTreeSet<String>) {
        {
            let mut inner = self.lock();
            inner.admitted.retain(|n| !namespaces.contains(n));
        }
        self.drained_of(|inner| {
            namespaces
                .iter()
                .any(|n| inner.in_flight_namespaces.contains_key(n))
        })
        .await;
    }

    /// Completes once `busy` (read under the lock) no longer holds, looked at again
    /// after each write that ends.
    async fn drained_of(&self, busy: impl Fn(&Inner) -> bool) {
        loop {
            let drained = self.drained.notified();
            if !busy(&self.lock()) {
                return;
            }
            drained.await;
        }
    }

    /// What the watches select now, and each change of it.
    pub fn subscribe_scope(&self) -> watch::Receiver<Scope> {
        self.scope.subscribe()
    }

    /// Takes `buckets` on: writes to them are allowed at once, the watches switch to the
    /// new set, and passes run for them once every cache has listed them.
    pub fn acquire(&self, buckets: Buckets) {
        let mut inner = self.lock();
        inner.allowed = inner.allowed.union(buckets);
        let next = inner.watched().1.union(buckets);
        self.switch(&mut inner, next);
    }

    /// Lets `buckets` go: from now on the fence refuses writes to them and the gate
    /// passes; completes once no write to them is in flight any more. The watches then
    /// drop them.
    pub async fn release(&self, buckets: Buckets) {
        {
            let mut inner = self.lock();
            inner.allowed = inner.allowed.minus(buckets);
            self.update_usable(&mut inner);
        }
        self.drained_of(|inner| {
            buckets
                .iter()
                .any(|b| inner.in_flight.get(b as usize).is_some_and(|n| *n > 0))
        })
        .await;
        let mut inner = self.lock();
        let next = inner.watched().1.minus(buckets);
        self.switch(&mut inner, next);
    }

    fn switch(&self, inner: &mut Inner, buckets: Buckets) {
        let number = inner.watched().0 + 1;
        inner.generations.insert(number, buckets);
        let select = if buckets.is_empty() {
            Select::Nothing
        } else if self.server_side {
            buckets.selector().map_or(Select::Nothing, Select::Server)
        } else if buckets == Buckets::ALL {
            Select::Everything
        } else {
            Select::Namespaces(Arc::new(move |ns: &str| buckets.contains_namespace(ns)))
        };
        self.scope.send_replace(Scope {
            generation: number,
            select,
        });
        self.update_usable(inner);
    }

    /// A cache (each registers once, before its first list) has listed `generation`.
    pub fn synced(&self, cache: &'static str, generation: u64) {
        let mut inner = self.lock();
        inner.synced.insert(cache, generation);
        self.update_usable(&mut inner);
    }

    /// A cache that follows the served buckets: none is usable until it listed them.
    pub fn register(&self, cache: &'static str) {
        self.lock().synced.entry(cache).or_insert(0);
    }

    fn update_usable(&self, inner: &mut Inner) {
        // What every cache has listed: the buckets of each one's last listed generation.
        let listed = inner
            .synced
            .values()
            .map(|g| inner.generations.get(g).copied().unwrap_or(Buckets::NONE))
            .reduce(Buckets::intersection)
            .unwrap_or(Buckets::NONE);
        let usable = inner.allowed.intersection(listed);
        // Generations older than every cache's are done with.
        if let Some(oldest) = inner.synced.values().min().copied() {
            inner.generations = inner.generations.split_off(&oldest);
        }
        self.usable.send_if_modified(|u| {
            let changed = u.buckets != usable;
            u.buckets = usable;
            changed
        });
    }

    /// Counts a write to `namespace` as in flight while the guard lives; `None` if the
    /// bucket is not allowed or the namespace not admitted (the write must not be sent).
    pub fn begin_write(self: &Arc<Self>, namespace: &str) -> Option<WriteGuard> {
        let b = bucket(namespace);
        let mut inner = self.lock();
        if !inner.allowed.contains(b) || !inner.admitted.contains(namespace) {
            return None;
        }
        if let Some(n) = inner.in_flight.get_mut(b as usize) {
            *n += 1;
        }
        *inner
            .in_flight_namespaces
            .entry(namespace.to_owned())
            .or_default() += 1;
        Some(WriteGuard {
            served: self.clone(),
            bucket: b,
            namespace: namespace.to_owned(),
        })
    }
}

/// A write in flight (see [`Served::begin_write`]).
pub struct WriteGuard {
    served: Arc<Served>,
    bucket: u32,
    namespace: String,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut inner = self.served.lock();
        if let Some(n) = inner.in_flight.get_mut(self.bucket as usize) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = inner.in_flight_namespaces.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.in_flight_namespaces.remove(&self.namespace);
            }
        }
        drop(inner);
        self.served.drained.notify_waiters();
    }
}

/// The namespace a request's path names (`/api/v1/namespaces/<ns>/…` or
/// `/apis/<group>/<version>/namespaces/<ns>/…`), if it names an object in one. A request
/// for the Namespace object itself names none.
pub fn namespace_of(path: &str) -> Option<&str> {
    let mut parts = path.trim_start_matches('/').split('/');
    let skip = match parts.next()? {
        "api" => 1,
        "apis" => 2,
        _ => return None,
    };
    let mut parts = parts.skip(skip);
    if parts.next()? != "namespaces" {
        return None;
    }
    let namespace = parts.next()?;
    parts.next()?;
    Some(namespace).filter(|n| !n.is_empty())
}

/// Why a write was not sent.
#[derive(Debug, thiserror::Error)]
#[error("namespace {0:?} is not served by this shard (its bucket was handed over); write not sent")]
pub struct NotServed(pub String);

/// `client` with every write to a namespaced object checked against the served buckets
/// right before it is sent, and counted while in flight (reads pass untouched). Writes in
/// `own` (the operator's namespace: its Leases, the databases' admin Secrets) are not
/// AppServices' and pass: the controller never reconciles in its own namespace.
pub fn bounded(client: kube::Client, served: Arc<Served>, own: &str) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let own = own.to_owned();
    let service = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        let served = served.clone();
        let own = own.clone();
        async move {
            let write = controller_core::fence::guarded(&req);
            let guard = match namespace_of(req.uri().path()) {
                Some(ns) if write && ns != own => match served.begin_write(ns) {
                    Some(guard) => Some(guard),
                    None => return Err(kube::Error::Service(Box::new(NotServed(ns.to_owned())))),
                },
                _ => None,
            };
            let response = client.send(req).await;
            drop(guard);
            response
        }
    });
    kube::Client::new(service, namespace)
}

/// Yields each time buckets become usable or namespaces are admitted.
pub fn gained(usable: watch::Receiver<Usable>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        (usable, Usable::default()),
        |(mut rx, mut before)| async move {
            loop {
                rx.changed().await.ok()?;
                let now = *rx.borrow_and_update();
                let more = !now.buckets.minus(before.buckets).is_empty()
                    || now.admissions != before.admissions;
                before = now;
                if more {
                    return Some(((), (rx, before)));
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_of_a_path() {
        assert_eq!(namespace_of("/api/v1/namespaces/a/services/x"), Some("a"));
        assert_eq!(namespace_of("/api/v1/namespaces/a/events"), Some("a"));
        assert_eq!(
            namespace_of("/apis/platform.example.com/v1beta1/namespaces/t-1/appservices/x/status"),
            Some("t-1")
        );
        assert_eq!(
            namespace_of("/api/v1/namespaces/a"),
            None,
            "the Namespace itself"
        );
        assert_eq!(
            namespace_of("/apis/platform.example.com/v1beta1/imagepolicies/p"),
            None
        );
        assert_eq!(namespace_of("/healthz"), None);
    }

    fn served_with_caches() -> Arc<Served> {
        let s = Arc::new(Served::default());
        s.register("a");
        s.register("b");
        s.admit(&BTreeSet::from(["team-a".to_owned()]));
        s
    }

    #[tokio::test]
    async fn a_namespace_released_shuts_its_writes_and_waits_only_for_its_own() {
        let s = served_with_caches();
        s.acquire(Buckets::ALL);
        s.synced("a", 1);
        s.synced("b", 1);
        let other = (0..)
            .map(|i| format!("team-{i}"))
            .find(|n| bucket(n) == bucket("team-a") && n != "team-a")
            .expect("a namespace in the same bucket");
        s.admit(&BTreeSet::from([other.clone()]));
        assert!(s.usable("team-a") && s.usable(&other));
        assert!(!s.usable("team-z"), "not admitted: no pass");
        assert!(s.begin_write("team-z").is_none(), "not admitted: no write");
        let mine = s.begin_write("team-a").expect("admitted");
        let neighbour = s.begin_write(&other).expect("admitted");
        let release = tokio::spawn({
            let s = s.clone();
            async move {
                s.release_namespaces(&BTreeSet::from(["team-a".to_owned()]))
                    .await
            }
        });
        while s.admitted().contains("team-a") {
            tokio::task::yield_now().await;
        }
        assert!(s.begin_write("team-a").is_none(), "no new write");
        assert!(!s.usable("team-a"), "no new pass");
        assert!(s.usable(&other), "its bucket's neighbour is untouched");
        tokio::task::yield_now().await;
        assert!(!release.is_finished(), "a write is in flight");
        drop(mine);
        release.await.unwrap();
        drop(neighbour);
    }

    #[test]
    fn acquired_buckets_are_usable_once_every_cache_listed_them() {
        let s = served_with_caches();
        let b = Buckets::NONE.with(bucket("team-a"));
        s.acquire(b);
        assert!(
            s.begin_write("team-a").is_some(),
            "writes are allowed at once"
        );
        assert!(!s.usable("team-a"));
        s.synced("a", 1);
        assert!(!s.usable("team-a"), "cache b has not listed it");
        s.synced("b", 1);
        assert!(s.usable("team-a"));
    }

    #[tokio::test]
    async fn a_release_shuts_writes_at_once_and_waits_for_those_in_flight() {
        let s = served_with_caches();
        let b = Buckets::NONE.with(bucket("team-a"));
        s.acquire(b);
        s.synced("a", 1);
        s.synced("b", 1);
        let guard = s.begin_write("team-a").unwrap();
        let release = tokio::spawn({
            let s = s.clone();
            async move { s.release(b).await }
        });
        while s.allowed().contains_namespace("team-a") {
            tokio::task::yield_now().await;
        }
        assert!(s.begin_write("team-a").is_none(), "no new write");
        assert!(!s.usable("team-a"), "no new pass");
        assert!(!release.is_finished());
        assert!(s.watched().contains_namespace("team-a"), "still watched");
        drop(guard);
        release.await.unwrap();
        assert!(!s.watched().contains_namespace("team-a"));
    }
}
