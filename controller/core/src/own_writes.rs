//! The controller's memory of its own writes that its watch caches may not show yet: one
//! component with one bound.
//!
//! A cache lags the writes a pass makes. Until it catches up, a pass deciding on the
//! cache alone would write the same status again, create a child a second time (409), or
//! clean up an object whose finalizer it already released. So per AppService the
//! controller remembers:
//!
//! * the status it last wrote, and the resourceVersion that write replaced;
//! * per child slot, what its last write of the child returned and the version it
//!   replaced;
//! * the child slots it created that the cache has not shown yet;
//! * the resourceVersion it released its finalizer from;
//! * the uid whose external cleanup succeeded.
//!
//! A write stands in for the cache only while the cache still holds the very version the
//! write replaced: once the cache moves on (our write, or anyone's after it), the cache is
//! authoritative again and the memory of that write goes.
//!
//! **The bound.** At most `capacity` AppServices are remembered, the one written least
//! recently going first, and nothing is remembered longer than `ttl` after the last write
//! of its AppService. Forgetting early only costs a request, never correctness: the pass
//! then decides on the cache, so it repeats a write the API server takes as a no-op,
//! meets a 409 that is retried (a create, whose slot is then asked for directly), or runs
//! an idempotent cleanup again.

use std::any::Any;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{AppService, AppServiceStatus};
use kube::runtime::reflector::ObjectRef;
use lru::LruCache;

/// How many AppServices are remembered at most: more than a cluster writes within
/// [`TTL`] in the scale benchmarks (20,000), and a few hundred MiB at worst.
pub const CAPACITY: NonZeroUsize = match NonZeroUsize::new(65_536) {
    Some(n) => n,
    None => panic!("the capacity is not zero"),
};

/// How long after its last write an AppService is remembered: far longer than a cache
/// takes to show a write, short enough that a quiet controller holds nothing.
pub const TTL: Duration = Duration::from_secs(300);

/// A write of one object: the resourceVersion it replaced, and what it returned.
struct Over<V> {
    replaced: String,
    written: V,
}

impl<V> Over<V> {
    /// Whether the cache (at `cached`) still holds the object this write replaced.
    fn stands_in(&self, cached: Option<&str>) -> bool {
        Some(self.replaced.as_str()) == cached
    }
}

/// Everything remembered of one AppService.
struct Memory {
    /// The last write remembered (what [`TTL`] counts from).
    at: Instant,
    status: Option<Over<AppServiceStatus>>,
    /// Per slot (see [`crate::children::lookup`]), the last write of that child.
    children: Vec<(&'static str, Over<Arc<dyn Any + Send + Sync>>)>,
    /// Slots created that the cache has not shown.
    created: Vec<&'static str>,
    /// The resourceVersion our finalizer was released from.
    released: Option<String>,
    /// The uid whose external cleanup succeeded.
    cleaned: Option<String>,
}

impl Memory {
    fn new(at: Instant) -> Self {
        Memory {
            at,
            status: None,
            children: Vec::new(),
            created: Vec::new(),
            released: None,
            cleaned: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.status.is_none()
            && self.children.is_empty()
            && self.created.is_empty()
            && self.released.is_none()
            && self.cleaned.is_none()
    }
}

/// The memory of the controller's own writes (see the module).
pub struct OwnWrites {
    /// Unbounded as a map (no table of `capacity` entries allocated up front):
    /// [`Held::write`] keeps it within `capacity`.
    apps: Mutex<LruCache<ObjectRef<AppService>, Memory>>,
    capacity: NonZeroUsize,
    ttl: Duration,
}

impl Default for OwnWrites {
    fn default() -> Self {
        Self::with_bound(CAPACITY, TTL)
    }
}

/// The memory as one lock holds it: reads that see an expired or stale entry drop it.
struct Held<'a> {
    apps: MutexGuard<'a, LruCache<ObjectRef<AppService>, Memory>>,
    capacity: NonZeroUsize,
    ttl: Duration,
}

impl Held<'_> {
    /// The live memory of `key`, without making it more recent; an expired one goes.
    fn peek(&mut self, key: &ObjectRef<AppService>, now: Instant) -> Option<&mut Memory> {
        let expired = self
            .apps
            .peek(key)
            .is_some_and(|m| now.saturating_duration_since(m.at) >= self.ttl);
        if expired {
            self.apps.pop(key);
        }
        self.apps.peek_mut(key)
    }

    /// The memory of `key` for a write at `now`: made the most recent, created if need
    /// be (which drops the least recent one when full). Expired ones go first.
    fn write(&mut self, key: &ObjectRef<AppService>, now: Instant) -> &mut Memory {
        while let Some((_, oldest)) = self.apps.peek_lru() {
            if now.saturating_duration_since(oldest.at) < self.ttl {
                break;
            }
            self.apps.pop_lru();
        }
        if !self.apps.contains(key) && self.apps.len() >= self.capacity.get() {
            self.apps.pop_lru();
        }
        let memory = self
            .apps
            .get_or_insert_mut(key.clone(), || Memory::new(now));
        memory.at = now;
        memory
    }

    /// The status written for `key`, while the cache (at `cached`) still holds the object
    /// that write replaced; a stale one goes.
    fn status(
        &mut self,
        key: &ObjectRef<AppService>,
        cached: Option<&str>,
        now: Instant,
    ) -> Option<&Over<AppServiceStatus>> {
        let memory = self.peek(key, now)?;
        if memory
            .status
            .as_ref()
            .is_some_and(|over| !over.stands_in(cached))
        {
            memory.status = None;
            self.tidy(key);
            return None;
        }
        // Looked up again: the first borrow cannot outlive the branch that tidies.
        self.apps.peek(key)?.status.as_ref()
    }

    /// Drops the memory of `key` once nothing is left in it.
    fn tidy(&mut self, key: &ObjectRef<AppService>) {
        if self.apps.peek(key).is_some_and(Memory::is_empty) {
            self.apps.pop(key);
        }
    }
}

impl OwnWrites {
    /// A memory of at most `capacity` AppServices, each for at most `ttl` after its last
    /// write.
    pub fn with_bound(capacity: NonZeroUsize, ttl: Duration) -> Self {
        OwnWrites {
            apps: Mutex::new(LruCache::unbounded()),
            capacity,
            ttl,
        }
    }

    /// A poisoned lock is recovered: the map stays consistent between statements, so a
    /// reconcile that panicked cannot have left it half-updated.
    fn held(&self) -> Held<'_> {
        Held {
            apps: self.apps.lock().unwrap_or_else(PoisonError::into_inner),
            capacity: self.capacity,
            ttl: self.ttl,
        }
    }

    /// How many AppServices are remembered.
    pub fn len(&self) -> usize {
        self.held().apps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records that `status` was written over `key` at `replaced`.
    pub fn wrote_status(
        &self,
        key: &ObjectRef<AppService>,
        replaced: String,
        status: AppServiceStatus,
        now: Instant,
    ) {
        self.held().write(key, now).status = Some(Over {
            replaced,
            written: status,
        });
    }

    /// The status last written for `key` while the cache (at `cached`) still holds the
    /// object that write replaced; otherwise that memory goes.
    pub fn status_over(
        &self,
        key: &ObjectRef<AppService>,
        cached: Option<&str>,
        now: Instant,
    ) -> Option<AppServiceStatus> {
        self.held()
            .status(key, cached, now)
            .map(|over| over.written.clone())
    }

    /// Forgets the status written for `key` once the cache (at `cached`) has moved past
    /// the object that write replaced.
    pub fn drop_stale_status(
        &self,
        key: &ObjectRef<AppService>,
        cached: Option<&str>,
        now: Instant,
    ) {
        self.held().status(key, cached, now);
    }

    /// Records that a write of the child in `slot` replaced `replaced` with `written`.
    pub fn wrote_child<V: Send + Sync + 'static>(
        &self,
        key: &ObjectRef<AppService>,
        slot: &'static str,
        replaced: String,
        written: V,
        now: Instant,
    ) {
        let mut held = self.held();
        let memory = held.write(key, now);
        memory.children.retain(|(s, _)| *s != slot);
        memory.children.push((
            slot,
            Over {
                replaced,
                written: Arc::new(written),
            },
        ));
    }

    /// What the last write of the child in `slot` returned, while the cache (at
    /// `cached`) still holds the object it replaced; otherwise that memory goes.
    pub fn child_over<V: Clone + 'static>(
        &self,
        key: &ObjectRef<AppService>,
        slot: &'static str,
        cached: Option<&str>,
        now: Instant,
    ) -> Option<V> {
        let mut held = self.held();
        let memory = held.peek(key, now)?;
        let at = memory.children.iter().position(|(s, _)| *s == slot)?;
        let over = &memory.children[at].1;
        let written = over
            .stands_in(cached)
            .then(|| over.written.downcast_ref::<V>().cloned())
            .flatten();
        if written.is_none() {
            memory.children.swap_remove(at);
            held.tidy(key);
        }
        written
    }

    /// Records that the child in `slot` was created: until the cache shows it, a miss
    /// there means "not seen yet", not "absent".
    pub fn created(&self, key: &ObjectRef<AppService>, slot: &'static str, now: Instant) {
        let mut held = self.held();
        let memory = held.write(key, now);
        if !memory.created.contains(&slot) {
            memory.created.push(slot);
        }
    }

    /// Whether the child in `slot` was created and the cache has not shown it yet.
    pub fn awaiting(&self, key: &ObjectRef<AppService>, slot: &'static str, now: Instant) -> bool {
        self.held()
            .peek(key, now)
            .is_some_and(|m| m.created.contains(&slot))
    }

    /// The cache shows the child in `slot` (or the API server says it is gone).
    pub fn seen(&self, key: &ObjectRef<AppService>, slot: &'static str) {
        let mut held = self.held();
        if let Some(memory) = held.apps.peek_mut(key)
            && let Some(at) = memory.created.iter().position(|s| *s == slot)
        {
            memory.created.swap_remove(at);
            held.tidy(key);
        }
    }

    /// Records that our finalizer was released from `key` at `resource_version`.
    pub fn released(&self, key: &ObjectRef<AppService>, resource_version: String, now: Instant) {
        self.held().write(key, now).released = Some(resource_version);
    }

    /// Whether the cached `key` at `resource_version` is the object our finalizer was
    /// released from.
    pub fn released_from(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
        now: Instant,
    ) -> bool {
        self.held()
            .peek(key, now)
            .and_then(|m| m.released.as_deref())
            .is_some_and(|rv| Some(rv) == resource_version)
    }

    /// Records that the external cleanup of `key`, the object of `uid`, succeeded.
    pub fn cleaned(&self, key: &ObjectRef<AppService>, uid: String, now: Instant) {
        self.held().write(key, now).cleaned = Some(uid);
    }

    /// Whether the external cleanup of `key`, the object of `uid`, succeeded already.
    pub fn cleaned_up(&self, key: &ObjectRef<AppService>, uid: &str, now: Instant) -> bool {
        self.held()
            .peek(key, now)
            .is_some_and(|m| m.cleaned.as_deref() == Some(uid))
    }

    /// Forgets the writes of `key` (it is gone), but not its release or cleanup: a cache
    /// may still show it, and its pass must not clean up again.
    pub fn forget(&self, key: &ObjectRef<AppService>) {
        let mut held = self.held();
        if let Some(memory) = held.apps.peek_mut(key) {
            memory.status = None;
            memory.children.clear();
            memory.created.clear();
            held.tidy(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{OwnWrites, TTL};
    use common::{AppService, AppServiceStatus};
    use kube::runtime::reflector::ObjectRef;
    use std::num::NonZeroUsize;
    use std::time::{Duration, Instant};

    fn key(name: &str) -> ObjectRef<AppService> {
        ObjectRef::new(name).within("ns")
    }

    fn status(n: i32) -> AppServiceStatus {
        AppServiceStatus {
            ready_replicas: Some(n),
            ..AppServiceStatus::default()
        }
    }

    fn bounded(capacity: usize) -> OwnWrites {
        let capacity = NonZeroUsize::new(capacity).expect("a test capacity above zero");
        OwnWrites::with_bound(capacity, TTL)
    }

    /// The one bound: `capacity` AppServices, the least recently written going first,
    /// and nothing older than the TTL, whichever comes first; every kind of memory alike.
    #[test]
    fn the_memory_holds_at_most_its_capacity_and_nothing_past_its_ttl() {
        let t0 = Instant::now();
        let w = bounded(3);
        w.wrote_status(&key("a"), "1".into(), status(1), t0);
        w.created(&key("b"), "Deployment", t0);
        w.released(&key("c"), "7".into(), t0);
        assert_eq!(w.len(), 3);
        // A write refreshes "a": "b" is now the least recent and goes for "d".
        w.cleaned(&key("a"), "uid-a".into(), t0);
        w.wrote_status(&key("d"), "1".into(), status(4), t0);
        assert_eq!(w.len(), 3, "never more than the capacity");
        assert!(!w.awaiting(&key("b"), "Deployment", t0), "evicted");
        assert_eq!(w.status_over(&key("a"), Some("1"), t0), Some(status(1)));
        assert!(w.released_from(&key("c"), Some("7"), t0));
        // Past the TTL nothing stands in any more, and a write sweeps what expired.
        let late = t0 + TTL;
        assert_eq!(w.status_over(&key("a"), Some("1"), late), None);
        assert!(!w.cleaned_up(&key("a"), "uid-a", late));
        w.wrote_status(&key("e"), "1".into(), status(5), late);
        assert_eq!(w.len(), 1, "only the write made at the end is left");
        assert_eq!(w.status_over(&key("e"), Some("1"), late), Some(status(5)));
        // Just inside the TTL a memory holds.
        let w = bounded(3);
        w.released(&key("a"), "7".into(), t0);
        assert!(w.released_from(&key("a"), Some("7"), t0 + TTL - Duration::from_millis(1)));
    }

    #[test]
    fn a_status_write_stands_in_until_the_cache_moves_on() {
        let now = Instant::now();
        let w = OwnWrites::default();
        assert_eq!(w.status_over(&key("app"), Some("1"), now), None);
        w.wrote_status(&key("app"), "1".into(), status(2), now);
        // The cache still holds the object the write replaced: the write stands in.
        assert_eq!(w.status_over(&key("app"), Some("1"), now), Some(status(2)));
        assert_eq!(w.status_over(&key("app"), Some("1"), now), Some(status(2)));
        w.drop_stale_status(&key("app"), Some("1"), now);
        assert_eq!(w.status_over(&key("app"), Some("1"), now), Some(status(2)));
        // The cache moved past it: the cache decides, even if an old version came back.
        w.drop_stale_status(&key("app"), Some("2"), now);
        assert_eq!(w.status_over(&key("app"), Some("1"), now), None);
        assert!(w.is_empty(), "nothing left of it");
    }

    #[test]
    fn a_child_write_is_per_slot_and_of_its_own_type() {
        let now = Instant::now();
        let w = OwnWrites::default();
        w.wrote_child(&key("app"), "Deployment", "1".into(), 7_u32, now);
        w.wrote_child(&key("app"), "Canary", "4".into(), "canary".to_owned(), now);
        assert_eq!(
            w.child_over::<u32>(&key("other"), "Deployment", Some("1"), now),
            None
        );
        assert_eq!(
            w.child_over::<u32>(&key("app"), "Service", Some("1"), now),
            None
        );
        assert_eq!(
            w.child_over::<u32>(&key("app"), "Deployment", Some("1"), now),
            Some(7)
        );
        // Asked as another type: dropped, like a stale one.
        assert_eq!(
            w.child_over::<String>(&key("app"), "Deployment", Some("1"), now),
            None
        );
        assert_eq!(
            w.child_over::<u32>(&key("app"), "Deployment", Some("1"), now),
            None
        );
        assert_eq!(
            w.child_over::<String>(&key("app"), "Canary", Some("4"), now)
                .as_deref(),
            Some("canary")
        );
        // A second write of a slot replaces the first.
        w.wrote_child(&key("app"), "Canary", "5".into(), "again".to_owned(), now);
        assert_eq!(
            w.child_over::<String>(&key("app"), "Canary", Some("4"), now),
            None
        );
    }

    #[test]
    fn a_created_child_is_awaited_until_seen() {
        let now = Instant::now();
        let w = OwnWrites::default();
        w.created(&key("app"), "Deployment", now);
        w.created(&key("app"), "Service", now);
        assert!(w.awaiting(&key("app"), "Deployment", now));
        w.seen(&key("app"), "Deployment");
        assert!(!w.awaiting(&key("app"), "Deployment", now));
        assert!(w.awaiting(&key("app"), "Service", now));
        w.seen(&key("app"), "Service");
        assert!(w.is_empty());
    }

    #[test]
    fn a_release_and_a_cleanup_outlive_forget_and_match_exactly() {
        let now = Instant::now();
        let w = OwnWrites::default();
        w.wrote_status(&key("app"), "4".into(), status(1), now);
        w.created(&key("app"), "Service", now);
        w.cleaned(&key("app"), "uid-1".into(), now);
        w.released(&key("app"), "5".into(), now);
        w.forget(&key("app"));
        assert_eq!(w.status_over(&key("app"), Some("4"), now), None);
        assert!(!w.awaiting(&key("app"), "Service", now));
        assert!(w.released_from(&key("app"), Some("5"), now));
        assert!(
            !w.released_from(&key("app"), Some("6"), now),
            "a later version"
        );
        assert!(!w.released_from(&key("app"), None, now));
        assert!(w.cleaned_up(&key("app"), "uid-1", now));
        assert!(
            !w.cleaned_up(&key("app"), "uid-2", now),
            "an object of the same name"
        );
        assert!(!w.released_from(&key("other"), Some("5"), now));
    }
}
