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
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::Error;

mod observe;

pub use observe::{
    observe_apps, observe_error_policy, observe_mapper, observe_mapper_all, observe_reconcile,
    observe_reconcile_all,
};

/// The `name` (workqueue) and `controller` (controller-runtime) label of every series.
pub const CONTROLLER_NAME: &str = "appservice";

telemetry::label_values! {
    /// The `result` label of `controller_runtime_reconcile_total`.
    pub enum ReconcileResult {
        /// Converged, or waiting for a change.
        Success => "success",
        /// Asked to look again before the resync interval: a rollout in progress, a
        /// database not ready, a name taken.
        Requeue => "requeue",
        Error => "error",
    }
}

/// Seconds from 1 ms to 10 minutes: a reconcile at steady state takes well under a
/// millisecond, a wait in a saturated queue can take minutes.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0,
];

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: ReconcileResult,
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
        for &result in ReconcileResult::ALL {
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
    pub fn retried(&self, key: &ObjectRef<AppService>, next: Next, now: Instant) {
        if let Some(delay) = next.delay() {
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
    pub fn reconciles(&self, result: ReconcileResult) -> u64 {
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
    pub fn finish(self, result: &Result<Next, Error>, now: Instant, resync: Duration) {
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
                ReconcileResult::Error
            }
            Ok(next) => match next.delay() {
                Some(delay) if delay < resync => ReconcileResult::Requeue,
                _ => ReconcileResult::Success,
            },
        };
        queue
            .reconciles
            .get_or_create(&ResultLabel { result: label })
            .inc();
        // The error policy's requeue is recorded by `retried`.
        if let Ok(next) = result
            && let Some(delay) = next.delay()
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

/// When a pass asks to reconcile its object again, as data: what the queue's bookkeeping
/// reads, turned into kube-runtime's `Action` (whose delay is private) only at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when something changes (an event of the object or of what it watches).
    AwaitChange,
    /// After this long, whatever happens meanwhile.
    After(Duration),
}

impl Next {
    /// Reconcile again after `delay` (as `Action::requeue`).
    pub const fn requeue(delay: Duration) -> Self {
        Next::After(delay)
    }

    /// Reconcile again only on a change (as `Action::await_change`).
    pub const fn await_change() -> Self {
        Next::AwaitChange
    }

    /// The delay, if one was asked for.
    pub const fn delay(self) -> Option<Duration> {
        match self {
            Next::AwaitChange => None,
            Next::After(delay) => Some(delay),
        }
    }

    /// kube-runtime's form of it.
    pub fn action(self) -> Action {
        match self {
            Next::AwaitChange => Action::await_change(),
            Next::After(delay) => Action::requeue(delay),
        }
    }
}

#[cfg(test)]
mod tests;
