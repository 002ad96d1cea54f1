//! A bounded map of fetched values with single-flight fetches: however many passes ask
//! for the same key at once, one fetch runs, and its value is in the map before any of
//! them sees it (a caller arriving after the fetch finds the entry, not a second fetch).
//!
//! Freshness is the caller's to judge ([`Cache::get`]'s `fresh`): a tag is fresh for the
//! resolve interval, a signature manifest while it verifies. At the bound the oldest
//! entry goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

struct Inner<V> {
    entries: HashMap<String, (Instant, V)>,
    flights: HashMap<String, Shared<BoxFuture<'static, V>>>,
}

pub struct Cache<V> {
    inner: Mutex<Inner<V>>,
    capacity: usize,
}

/// What [`Cache::get`] answered, and whether it came from the map.
pub struct Got<V> {
    pub value: V,
    pub hit: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<V: Clone + Send + Sync + 'static> Cache<V> {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Cache {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                flights: HashMap::new(),
            }),
            capacity: capacity.max(1),
        })
    }

    /// The value of `key` if one is cached that `fresh(age, value)` accepts; else the
    /// result of the one fetch in flight for `key`, started with `fetch` if none is.
    pub async fn get(
        self: &Arc<Self>,
        key: &str,
        fresh: impl Fn(Duration, &V) -> bool,
        fetch: impl FnOnce() -> BoxFuture<'static, V>,
    ) -> Got<V> {
        let flight = {
            let mut inner = lock(&self.inner);
            if let Some((at, value)) = inner.entries.get(key)
                && fresh(at.elapsed(), value)
            {
                return Got {
                    value: value.clone(),
                    hit: true,
                };
            }
            match inner.flights.get(key) {
                Some(flight) => flight.clone(),
                None => {
                    let this = Arc::clone(self);
                    let owned = key.to_owned();
                    let fetching = fetch();
                    let flight = async move {
                        let value = fetching.await;
                        this.land(owned, value.clone());
                        value
                    }
                    .boxed()
                    .shared();
                    inner.flights.insert(key.to_owned(), flight.clone());
                    flight
                }
            }
        };
        Got {
            value: flight.await,
            hit: false,
        }
    }

    /// A finished fetch: its value replaces the entry, the flight ends.
    fn land(&self, key: String, value: V) {
        let mut inner = lock(&self.inner);
        inner.flights.remove(&key);
        if !inner.entries.contains_key(&key) && inner.entries.len() >= self.capacity {
            // O(capacity) at the bound: misses at the bound are registry round trips,
            // which cost far more than this scan.
            if let Some(oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                inner.entries.remove(&oldest);
            }
        }
        inner.entries.insert(key, (Instant::now(), value));
    }

    pub fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_callers_share_one_fetch_and_later_ones_hit() {
        let cache = Cache::<u32>::new(8);
        let fetches = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let callers = (0..50).map(|_| {
            let (cache, fetches, mut gate) = (cache.clone(), fetches.clone(), gate.clone());
            async move {
                cache
                    .get(
                        "k",
                        |_, _| true,
                        move || {
                            async move {
                                fetches.fetch_add(1, Ordering::SeqCst);
                                let _ = gate.wait_for(|open| *open).await;
                                7
                            }
                            .boxed()
                        },
                    )
                    .await
                    .value
            }
        });
        let all = futures::future::join_all(callers);
        let opener = async {
            tokio::task::yield_now().await;
            let _ = release.send(true);
        };
        let (values, ()) = tokio::join!(all, opener);
        assert!(values.iter().all(|v| *v == 7));
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        let later = cache.get("k", |_, _| true, || async { 8 }.boxed()).await;
        assert!(later.hit);
        assert_eq!(later.value, 7);
    }

    #[tokio::test]
    async fn a_stale_entry_is_fetched_again_and_the_bound_evicts_the_oldest() {
        let cache = Cache::<u32>::new(2);
        cache.get("a", |_, _| true, || async { 1 }.boxed()).await;
        let again = cache.get("a", |_, v| *v != 1, || async { 2 }.boxed()).await;
        assert!(!again.hit);
        assert_eq!(again.value, 2);
        cache.get("b", |_, _| true, || async { 3 }.boxed()).await;
        cache.get("c", |_, _| true, || async { 4 }.boxed()).await;
        assert_eq!(cache.len(), 2);
        let a = cache.get("a", |_, _| true, || async { 5 }.boxed()).await;
        assert!(!a.hit, "the oldest entry went at the bound");
    }
}
