//! The work queue, as operators know it from controller-runtime: depth, adds, retries,
//! time in queue, work duration, unfinished work, longest running reconcile, and
//! reconciles by result.
//!
//! kube-runtime's `Controller` keeps its scheduler to itself, so the queue is observed
//! around it: every trigger (a watch event of an AppService, of a child, of an object
//! blocking a name, leadership gained) marks its object as waiting; a requeue marks it as
//! waiting from the moment it is due; the start of a reconcile takes it out of the queue
//! and the end records the result. Like the scheduler, an object waits at most once: a
//! second trigger before its reconcile starts adds nothing. An object triggered while it
//! is being reconciled waits for that reconcile to end, and its time in queue says so.
//!
//! Depth, longest running and unfinished work are computed from this bookkeeping when
//! `/metrics` is scraped.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::AppService;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::context::Context;
use crate::error::Error;

/// The `name` (workqueue) and `controller` (controller-runtime) label of every series.
pub const CONTROLLER_NAME: &str = "appservice";

/// Every value of the `result` label of `controller_runtime_reconcile_total`: `success`
/// (converged, or waiting for a change), `requeue` (asked to look again before the
/// resync interval: a rollout in progress, a database not ready, a name taken), `error`.
pub const RESULTS: [&str; 3] = ["success", "requeue", "error"];

/// Seconds from 1 ms to 10 minutes: a reconcile at steady state takes well under a
/// millisecond, a wait in a saturated queue can take minutes.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0,
];

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Where one object stands in the queue.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// Waiting since (or, for a requeue, due at) this instant.
    due: Option<Instant>,
    /// Being reconciled since this instant.
    running_since: Option<Instant>,
}

/// The queue's bookkeeping and its metrics.
#[derive(Debug)]
pub struct Queue {
    entries: Mutex<HashMap<ObjectRef<AppService>, Entry>>,
    depth: Gauge,
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished_work: FloatGauge,
    longest_running: FloatGauge,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_errors: Counter,
    active_workers: Gauge,
    max_concurrent: Gauge,
}

impl Default for Queue {
    fn default() -> Self {
        let reconciles = Family::<ResultLabel, Counter>::default();
        for result in RESULTS {
            let _ = reconciles.get_or_create(&ResultLabel { result });
        }
        Queue {
            entries: Mutex::new(HashMap::new()),
            depth: Gauge::default(),
            adds: Counter::default(),
            retries: Counter::default(),
            queue_duration: Histogram::new(BUCKETS),
            work_duration: Histogram::new(BUCKETS),
            unfinished_work: FloatGauge::default(),
            longest_running: FloatGauge::default(),
            reconciles,
            reconcile_errors: Counter::default(),
            active_workers: Gauge::default(),
            max_concurrent: Gauge::default(),
        }
    }
}

impl Queue {
    /// Registers the metrics under controller-runtime's names (no prefix), with the
    /// `name` or `controller` label.
    pub fn register(&self, root: &mut Registry) {
        let queue =
            root.sub_registry_with_label((Cow::Borrowed("name"), Cow::Borrowed(CONTROLLER_NAME)));
        queue.register(
            "workqueue_depth",
            "Objects waiting for a reconcile",
            self.depth.clone(),
        );
        queue.register(
            "workqueue_adds",
            "Objects put in the queue (by a watch event, a requeue or a retry)",
            self.adds.clone(),
        );
        queue.register(
            "workqueue_retries",
            "Objects put back in the queue after a failed reconcile",
            self.retries.clone(),
        );
        queue.register(
            "workqueue_queue_duration_seconds",
            "How long an object waited in the queue before its reconcile started",
            self.queue_duration.clone(),
        );
        queue.register(
            "workqueue_work_duration_seconds",
            "How long a reconcile took",
            self.work_duration.clone(),
        );
        queue.register(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress that has not finished: the sum of the running reconciles' ages; a value that grows without a reconcile ending means a stuck reconcile",
            self.unfinished_work.clone(),
        );
        queue.register(
            "workqueue_longest_running_processor_seconds",
            "Age of the longest-running reconcile",
            self.longest_running.clone(),
        );
        let controller = root
            .sub_registry_with_label((Cow::Borrowed("controller"), Cow::Borrowed(CONTROLLER_NAME)));
        controller.register(
            "controller_runtime_reconcile",
            "Reconciles by result: success, requeue (look again soon), error",
            self.reconciles.clone(),
        );
        controller.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed",
            self.reconcile_errors.clone(),
        );
        controller.register(
            "controller_runtime_active_workers",
            "Reconciles running right now",
            self.active_workers.clone(),
        );
        controller.register(
            "controller_runtime_max_concurrent_reconciles",
            "Most reconciles that run at once",
            self.max_concurrent.clone(),
        );
    }

    pub fn set_max_concurrent(&self, n: u16) {
        self.max_concurrent.set(i64::from(n));
    }

    fn with_entries<T>(
        &self,
        f: impl FnOnce(&mut HashMap<ObjectRef<AppService>, Entry>) -> T,
    ) -> T {
        // A poisoned lock only means a panic elsewhere while counting: keep counting.
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut entries)
    }

    /// A trigger: `key` is wanted now.
    pub fn triggered(&self, key: &ObjectRef<AppService>, now: Instant) {
        self.want(key, now, now);
    }

    /// A requeue: `key` is wanted at `due`.
    pub fn scheduled(&self, key: &ObjectRef<AppService>, due: Instant, now: Instant) {
        self.want(key, due, now);
    }

    fn want(&self, key: &ObjectRef<AppService>, due: Instant, now: Instant) {
        let added = self.with_entries(|entries| {
            let entry = entries.entry(key.clone()).or_default();
            match entry.due {
                // Already waiting: the scheduler holds one request per object.
                Some(waiting) if waiting <= now => false,
                // A later requeue was pending; the earlier request replaces it.
                Some(later) if due < later => {
                    entry.due = Some(due);
                    // It is in the queue from now on, where it was only promised before.
                    due <= now
                }
                Some(_) => false,
                None => {
                    entry.due = Some(due);
                    true
                }
            }
        });
        if added {
            self.adds.inc();
        }
    }

    /// A reconcile of `key` starts: it leaves the queue. `leading`: whether this replica
    /// reconciles (a standby's passes return at once and are not work).
    pub fn start(
        self: &Arc<Self>,
        key: ObjectRef<AppService>,
        now: Instant,
        leading: bool,
    ) -> Running {
        let waited = self.with_entries(|entries| {
            let entry = entries.entry(key.clone()).or_default();
            let waited = entry
                .due
                .take()
                .map_or(Duration::ZERO, |due| now.saturating_duration_since(due));
            if leading {
                entry.running_since = Some(now);
            } else if entry.running_since.is_none() {
                entries.remove(&key);
            }
            waited
        });
        if leading {
            self.queue_duration.observe(waited.as_secs_f64());
            self.active_workers.inc();
        }
        Running {
            queue: self.clone(),
            key,
            started: now,
            counted: leading,
        }
    }

    /// The error policy asked for `action` after a failed reconcile of `key`.
    pub fn retried(&self, key: &ObjectRef<AppService>, action: &Action, now: Instant) {
        if let Some(delay) = requeue_delay(action) {
            self.retries.inc();
            self.scheduled(key, now + delay, now);
        }
    }

    /// `key` is gone (the controller found no such object to reconcile).
    pub fn forget(&self, key: &ObjectRef<AppService>) {
        self.with_entries(|entries| {
            if entries.get(key).is_some_and(|e| e.running_since.is_none()) {
                entries.remove(key);
            }
        });
    }

    /// Sets depth, longest running and unfinished work as of `now` (at scrape time).
    pub fn refresh(&self, now: Instant) {
        let (depth, longest, unfinished) = self.with_entries(|entries| {
            let mut depth = 0i64;
            let mut longest = Duration::ZERO;
            let mut unfinished = Duration::ZERO;
            for entry in entries.values() {
                match entry.running_since {
                    Some(since) => {
                        let age = now.saturating_duration_since(since);
                        longest = longest.max(age);
                        unfinished += age;
                    }
                    // Waiting for a running reconcile to end is not in the queue yet
                    // (controller-runtime re-adds such an object when it is done).
                    None if entry.due.is_some_and(|due| due <= now) => depth += 1,
                    None => {}
                }
            }
            (depth, longest, unfinished)
        });
        self.depth.set(depth);
        self.longest_running.set(longest.as_secs_f64());
        self.unfinished_work.set(unfinished.as_secs_f64());
    }

    fn finish(&self, key: &ObjectRef<AppService>) {
        self.with_entries(|entries| {
            if let Some(entry) = entries.get_mut(key) {
                entry.running_since = None;
                if entry.due.is_none() {
                    entries.remove(key);
                }
            }
        });
    }

    /// Reconciles by result so far.
    pub fn reconciles(&self, result: &'static str) -> u64 {
        self.reconciles.get_or_create(&ResultLabel { result }).get()
    }

    /// Objects put in the queue so far.
    pub fn adds(&self) -> u64 {
        self.adds.get()
    }

    /// Objects retried after an error so far.
    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// Objects known to the bookkeeping (waiting, scheduled or running).
    pub fn tracked(&self) -> usize {
        self.with_entries(|entries| entries.len())
    }
}

/// A reconcile in progress; [`Running::finish`] records its result. Dropped unfinished
/// (the reconcile was cancelled), it only leaves the running set.
#[derive(Debug)]
pub struct Running {
    queue: Arc<Queue>,
    key: ObjectRef<AppService>,
    started: Instant,
    counted: bool,
}

impl Running {
    /// Records the result of the reconcile and, when it asked for one, its requeue.
    /// `resync`: a requeue this late or later is the safety-net resync of a converged
    /// object, a success.
    pub fn finish(self, result: &Result<Action, Error>, now: Instant, resync: Duration) {
        if !self.counted {
            return;
        }
        let queue = &self.queue;
        queue
            .work_duration
            .observe(now.saturating_duration_since(self.started).as_secs_f64());
        let label = match result {
            Err(_) => {
                queue.reconcile_errors.inc();
                "error"
            }
            Ok(action) => match requeue_delay(action) {
                Some(delay) if delay < resync => "requeue",
                _ => "success",
            },
        };
        queue
            .reconciles
            .get_or_create(&ResultLabel { result: label })
            .inc();
        // The error policy's requeue is recorded by `retried`.
        if let Ok(action) = result
            && let Some(delay) = requeue_delay(action)
        {
            queue.scheduled(&self.key, now + delay, now);
        }
        // Drop does the rest.
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.counted {
            self.queue.active_workers.dec();
            self.queue.finish(&self.key);
        }
    }
}

/// When `action` asks to reconcile again. kube-runtime keeps the delay private; its
/// `Debug` output (`Action { requeue_after: Some(10s) }`) is the only way to read it, so
/// it is parsed here and checked by rebuilding the `Action` from the result: if the
/// format ever changes, the answer is `None` (no requeue seen), never a wrong delay.
pub fn requeue_delay(action: &Action) -> Option<Duration> {
    let text = format!("{action:?}");
    let inner = text.split_once("Some(")?.1.split_once(')')?.0;
    let delay = parse_debug_duration(inner)?;
    (Action::requeue(delay) == *action).then_some(delay)
}

/// Parses `Duration`'s `Debug` form: a decimal number and a unit (`ns`, `µs`, `ms`, `s`).
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let (number, unit_nanos) = if let Some(n) = text.strip_suffix("ns") {
        (n, 1u128)
    } else if let Some(n) = text.strip_suffix("µs") {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000_000_000)
    } else {
        return None;
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || fraction.len() > 9 {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let fraction_value: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let nanos = whole
        .checked_mul(unit_nanos)?
        .checked_add(fraction_value.checked_mul(unit_nanos)? / scale)?;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// Counts the AppServices of a watch stream as triggers.
pub fn observe_apps<S, E>(stream: S, queue: Arc<Queue>) -> impl Stream<Item = Result<AppService, E>>
where
    S: Stream<Item = Result<AppService, E>>,
{
    stream.inspect(move |item| {
        if let Ok(app) = item {
            queue.triggered(&ObjectRef::from_obj(app), Instant::now());
        }
    })
}

/// Counts the owners of a child stream's objects as triggers (as kube-runtime's
/// `owns_stream` maps them: every owner reference to an AppService).
pub fn observe_children<S, K, E>(stream: S, queue: Arc<Queue>) -> impl Stream<Item = Result<K, E>>
where
    S: Stream<Item = Result<K, E>>,
    K: Resource,
{
    stream.inspect(move |item| {
        if let Ok(child) = item {
            let meta = child.meta();
            let now = Instant::now();
            for owner in meta.owner_references.iter().flatten() {
                if let Some(key) =
                    ObjectRef::<AppService>::from_owner_ref(meta.namespace.as_deref(), owner, ())
                {
                    queue.triggered(&key, now);
                }
            }
        }
    })
}

/// Counts every AppService in `store` as triggered each time `stream` yields (what
/// `reconcile_all_on` does with the same store).
pub fn observe_reconcile_all<S>(
    stream: S,
    store: Store<AppService>,
    queue: Arc<Queue>,
) -> impl Stream<Item = ()>
where
    S: Stream<Item = ()>,
{
    stream.inspect(move |()| {
        let now = Instant::now();
        for app in store.state() {
            queue.triggered(&ObjectRef::from_obj(&*app), now);
        }
    })
}

/// Wraps a mapper of `watches_stream`: the AppService it names is triggered.
pub fn observe_mapper<T>(
    queue: Arc<Queue>,
    mapper: impl Fn(T) -> Option<ObjectRef<AppService>>,
) -> impl Fn(T) -> Option<ObjectRef<AppService>> {
    move |obj| {
        let key = mapper(obj);
        if let Some(key) = &key {
            queue.triggered(key, Instant::now());
        }
        key
    }
}

/// Wraps the reconcile function: the object leaves the queue when it starts, and its
/// duration and result are recorded when it ends.
pub fn observe_reconcile<F, Fut>(
    reconcile: F,
) -> impl FnMut(Arc<AppService>, Arc<Context>) -> BoxFuture<'static, Result<Action, Error>>
where
    F: Fn(Arc<AppService>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    move |app, ctx| {
        let queue = ctx.metrics().queue().clone();
        let resync = ctx.config().resync_interval;
        let running = queue.start(ObjectRef::from_obj(&*app), Instant::now(), ctx.is_leader());
        let reconciling = reconcile(app, ctx);
        async move {
            let result = reconciling.await;
            running.finish(&result, Instant::now(), resync);
            result
        }
        .boxed()
    }
}

/// Wraps the error policy: a requeue after an error is a retry.
pub fn observe_error_policy<P>(
    policy: P,
) -> impl Fn(Arc<AppService>, &Error, Arc<Context>) -> Action
where
    P: Fn(Arc<AppService>, &Error, Arc<Context>) -> Action,
{
    move |app, error, ctx| {
        let key = ObjectRef::from_obj(&*app);
        let action = policy(app, error, ctx.clone());
        if ctx.is_leader() {
            ctx.metrics().queue().retried(&key, &action, Instant::now());
        }
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectRef<AppService> {
        ObjectRef::new(name).within("ns")
    }

    fn encode(queue: &Queue) -> String {
        let mut registry = Registry::default();
        queue.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn requeue_delays_are_read_exactly() {
        for delay in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_micros(17),
            Duration::from_millis(1),
            Duration::from_millis(1500),
            Duration::from_secs(10),
            Duration::from_secs(600),
            Duration::new(1, 1),
            Duration::new(3600, 123_456_789),
            Duration::from_secs(86_400 * 365),
        ] {
            assert_eq!(
                requeue_delay(&Action::requeue(delay)),
                Some(delay),
                "{delay:?}"
            );
        }
        assert_eq!(requeue_delay(&Action::await_change()), None);
        assert_eq!(parse_debug_duration("1.5"), None);
        assert_eq!(parse_debug_duration("x5s"), None);
        assert_eq!(parse_debug_duration(".5s"), None);
    }

    #[test]
    fn a_trigger_waits_once_until_its_reconcile_starts() {
        let queue = Arc::new(Queue::default());
        let t0 = Instant::now();
        queue.triggered(&key("a"), t0);
        queue.triggered(&key("a"), t0 + Duration::from_millis(10));
        queue.triggered(&key("b"), t0 + Duration::from_millis(20));
        assert_eq!(
            queue.adds(),
            2,
            "a second trigger of a waiting object adds nothing"
        );
        queue.refresh(t0 + Duration::from_millis(30));
        assert_eq!(queue.depth.get(), 2);

        let running = queue.start(key("a"), t0 + Duration::from_millis(500), true);
        queue.refresh(t0 + Duration::from_millis(1500));
        assert_eq!(queue.depth.get(), 1);
        assert_eq!(queue.active_workers.get(), 1);
        assert!((queue.longest_running.get() - 1.0).abs() < 1e-9);
        assert!((queue.unfinished_work.get() - 1.0).abs() < 1e-9);

        // Triggered while running: waits, but is not in the queue until the end.
        queue.triggered(&key("a"), t0 + Duration::from_millis(1600));
        queue.refresh(t0 + Duration::from_millis(1700));
        assert_eq!(queue.depth.get(), 1);
        running.finish(
            &Ok(Action::await_change()),
            t0 + Duration::from_secs(2),
            Duration::from_secs(600),
        );
        queue.refresh(t0 + Duration::from_secs(2));
        assert_eq!(queue.depth.get(), 2);
        assert_eq!(queue.active_workers.get(), 0);
        assert_eq!(queue.longest_running.get(), 0.0);
        assert_eq!(queue.reconciles("success"), 1);

        let text = encode(&queue);
        // The first wait of "a" was 500 ms.
        assert!(
            text.contains(
                "workqueue_queue_duration_seconds_bucket{le=\"0.5\",name=\"appservice\"} 1"
            ) || text.contains(
                "workqueue_queue_duration_seconds_bucket{name=\"appservice\",le=\"0.5\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn requeues_wait_from_when_they_are_due() {
        let queue = Arc::new(Queue::default());
        let resync = Duration::from_secs(600);
        let t0 = Instant::now();
        queue.triggered(&key("a"), t0);
        let running = queue.start(key("a"), t0, true);
        running.finish(&Ok(Action::requeue(Duration::from_secs(10))), t0, resync);
        assert_eq!(queue.reconciles("requeue"), 1);
        assert_eq!(queue.adds(), 2);
        queue.refresh(t0 + Duration::from_secs(5));
        assert_eq!(queue.depth.get(), 0, "not due yet");
        queue.refresh(t0 + Duration::from_secs(11));
        assert_eq!(queue.depth.get(), 1);
        // A watch event before the requeue is due takes its place, once.
        queue.triggered(&key("a"), t0 + Duration::from_secs(1));
        assert_eq!(queue.adds(), 3);
        queue.triggered(&key("a"), t0 + Duration::from_secs(2));
        assert_eq!(queue.adds(), 3);

        // A converged object's resync is a success, and is scheduled.
        let running = queue.start(key("a"), t0 + Duration::from_secs(3), true);
        running.finish(
            &Ok(Action::requeue(resync)),
            t0 + Duration::from_secs(3),
            resync,
        );
        assert_eq!(queue.reconciles("success"), 1);
        assert_eq!(queue.tracked(), 1);
        queue.forget(&key("a"));
        assert_eq!(queue.tracked(), 0);
    }

    #[test]
    fn errors_and_retries_are_counted() {
        let queue = Arc::new(Queue::default());
        let t0 = Instant::now();
        queue.triggered(&key("a"), t0);
        let running = queue.start(key("a"), t0, true);
        running.finish(
            &Err(Error::NotLeader),
            t0 + Duration::from_millis(3),
            Duration::from_secs(600),
        );
        queue.retried(&key("a"), &Action::requeue(Duration::from_secs(2)), t0);
        queue.retried(&key("b"), &Action::await_change(), t0);
        assert_eq!(queue.reconciles("error"), 1);
        assert_eq!(queue.retries(), 1);
        assert_eq!(queue.reconcile_errors.get(), 1);
        assert_eq!(queue.tracked(), 1, "only the retried object is scheduled");
    }

    #[test]
    fn a_cancelled_reconcile_leaves_the_running_set() {
        let queue = Arc::new(Queue::default());
        let t0 = Instant::now();
        let running = queue.start(key("a"), t0, true);
        drop(running);
        queue.refresh(t0 + Duration::from_secs(1));
        assert_eq!(queue.active_workers.get(), 0);
        assert_eq!(queue.longest_running.get(), 0.0);
        assert_eq!(queue.tracked(), 0);
        // A standby's pass is not work, and leaves nothing behind.
        queue.triggered(&key("b"), t0);
        drop(queue.start(key("b"), t0, false));
        assert_eq!(queue.tracked(), 0);
        assert_eq!(queue.active_workers.get(), 0);
    }

    #[test]
    fn every_series_exists_from_the_start() {
        let queue = Queue::default();
        queue.set_max_concurrent(16);
        queue.refresh(Instant::now());
        let text = encode(&queue);
        for line in [
            "workqueue_depth{name=\"appservice\"} 0",
            "workqueue_adds_total{name=\"appservice\"} 0",
            "workqueue_retries_total{name=\"appservice\"} 0",
            "workqueue_queue_duration_seconds_count{name=\"appservice\"} 0",
            "workqueue_work_duration_seconds_count{name=\"appservice\"} 0",
            "workqueue_unfinished_work_seconds{name=\"appservice\"} 0",
            "workqueue_longest_running_processor_seconds{name=\"appservice\"} 0",
            "controller_runtime_reconcile_total{controller=\"appservice\",result=\"success\"} 0",
            "controller_runtime_reconcile_total{controller=\"appservice\",result=\"requeue\"} 0",
            "controller_runtime_reconcile_total{controller=\"appservice\",result=\"error\"} 0",
            "controller_runtime_reconcile_errors_total{controller=\"appservice\"} 0",
            "controller_runtime_active_workers{controller=\"appservice\"} 0",
            "controller_runtime_max_concurrent_reconciles{controller=\"appservice\"} 16",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
