//! Prometheus metrics of the controller, with small fixed label sets.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use common::AppService;
use kube::runtime::reflector::ObjectRef;

pub use crate::error::ErrorReason;
pub use telemetry::labels::Ended;

telemetry::label_values! {
    /// Status of an AppService's Ready condition.
    pub enum Ready { True => "True", False => "False", Unknown => "Unknown" }

    /// What reconcile wrote to the API server.
    pub enum Written {
        Deployments => "deployments",
        Services => "services",
        PodDisruptionBudgets => "poddisruptionbudgets",
        HorizontalPodAutoscalers => "horizontalpodautoscalers",
        HttpRoutes => "httproutes",
        ReferenceGrants => "referencegrants",
        Certificates => "certificates",
        Ingresses => "ingresses",
        Gateways => "gateways",
        AppServices => "appservices",
        AppServiceStatus => "appservices/status",
        Events => "events",
        Secrets => "secrets",
        DatabaseClassStatus => "databaseclasses/status",
        ImagePolicyStatus => "imagepolicies/status",
    }

    /// The verb of an API request: its HTTP method, and `watch` for a GET that watches.
    pub enum ApiVerb {
        Get => "get",
        Watch => "watch",
        Post => "post",
        Put => "put",
        Patch => "patch",
        Delete => "delete",
        Other => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabel {
    pub verb: ApiVerb,
    /// The HTTP status code, or `error` when no response came (transport, timeout).
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiVerbLabel {
    pub verb: ApiVerb,
}

/// Every request the controller's client sends (`appservice_controller_api_requests` and
/// `..._api_request_duration_seconds`), recorded by the client's own layer
/// ([`crate::client::build_client_with_metrics`]). Cheap to clone: clones count into the
/// same series.
#[derive(Clone)]
pub struct ApiMetrics {
    requests: Family<ApiRequestLabel, Counter>,
    /// Until the response's headers: a watch counts the time to its first byte only.
    latency: Family<ApiVerbLabel, Histogram>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 15))
            }),
        }
    }
}

impl ApiMetrics {
    /// One request of `verb`, answered with `code` (`None`: no answer) after `took`.
    pub fn observe(&self, verb: ApiVerb, code: Option<u16>, took: Duration) {
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.requests
            .get_or_create(&ApiRequestLabel { verb, code })
            .inc();
        self.latency
            .get_or_create(&ApiVerbLabel { verb })
            .observe(took.as_secs_f64());
    }

    /// Requests of `verb` answered with `code` so far.
    pub fn count(&self, verb: ApiVerb, code: &str) -> u64 {
        self.requests
            .get_or_create(&ApiRequestLabel {
                verb,
                code: code.to_owned(),
            })
            .get()
    }
}

impl Ready {
    /// The value of a condition's `status` (`Unknown` for anything else).
    pub fn of(status: &str) -> Ready {
        match status {
            common::conditions::TRUE => Ready::True,
            common::conditions::FALSE => Ready::False,
            _ => Ready::Unknown,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: Ended,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub reason: ErrorReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadyLabel {
    pub ready: Ready,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub resource: Written,
}

/// The prefix of every series the controller exports besides the queue's and the
/// process's.
const PREFIX: &str = "appservice_controller";

/// The metric families of a provider beside the core (the database step's
/// `appservice_controller_database_*`): it defines and records them, and registers them
/// once per [`Metrics`] through [`Metrics::families`].
pub trait Families: Clone + Default + Send + Sync + 'static {
    /// Registers every family in `registry`, which carries the controller's prefix.
    fn register(&self, registry: &mut Registry);
}

/// Every metric the controller exports, registered in one registry.
///
/// Recorded through its methods; the fields are private so that every series keeps the
/// meaning its registration gives it.
pub struct Metrics {
    /// Behind a lock only so that a provider can register its [`Families`] after the
    /// metrics are shared; read by each scrape.
    registry: Mutex<Registry>,
    /// The providers' families, one set per type.
    families: Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
    reconciles: Family<ResultLabel, Counter>,
    errors: Family<ErrorLabel, Counter>,
    duration: Histogram,
    objects: Family<ReadyLabel, Gauge>,
    leader: Gauge,
    leader_transitions: Counter,
    api: ApiMetrics,
    cleanup_failures: Counter,
    excluded: Counter,
    writes: Family<WriteLabel, Counter>,
    /// The work queue (controller-runtime's names, no prefix).
    queue: Arc<crate::queue::Queue>,
    /// `process_*`: memory, CPU, file descriptors, start time (read at scrape).
    process: telemetry::process::ProcessMetrics,
    /// Ready status per AppService, to keep `objects` exact.
    ready_by_key: Mutex<HashMap<ObjectRef<AppService>, Ready>>,
    /// AppServices being deleted while our finalizer holds them: their deletion time.
    held_by_key: Mutex<HashMap<ObjectRef<AppService>, i64>>,
    held: Gauge,
    oldest_held: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let queue = Arc::new(crate::queue::Queue::default());
        queue.register(&mut root);
        let process = telemetry::process::ProcessMetrics::default();
        process.register(&mut root);
        let registry = root.sub_registry_with_prefix(PREFIX);
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ErrorLabel, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let objects = Family::<ReadyLabel, Gauge>::default();
        let leader = Gauge::default();
        let leader_transitions = Counter::default();
        let held = Gauge::default();
        let oldest_held = Gauge::default();
        registry.register(
            "finalizer_held",
            "AppServices being deleted whose cleanup our finalizer still waits for",
            held.clone(),
        );
        registry.register(
            "finalizer_oldest_deletion_timestamp_seconds",
            "Deletion time (Unix seconds) of the AppService our finalizer has held longest, \
             0 when none: its age is time() minus this",
            oldest_held.clone(),
        );
        let api = ApiMetrics::default();
        let cleanup_failures = Counter::default();
        let excluded = Counter::default();
        let writes = Family::<WriteLabel, Counter>::default();
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
        registry.register(
            "excluded",
            "AppService events left alone because their namespace is excluded (--exclude-namespaces)",
            excluded.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile errors by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            duration.clone(),
        );
        registry.register(
            "objects",
            "AppServices by status of their Ready condition",
            objects.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        registry.register(
            "leader_transitions",
            "Times this replica became or stopped being the leader",
            leader_transitions.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the API server by verb and HTTP code (error: no answer)",
            api.requests.clone(),
        );
        registry.register(
            "api_request_duration_seconds",
            "Latency of API requests until the response's headers, by verb",
            api.latency.clone(),
        );
        registry.register(
            "cleanup_failures",
            "Failed attempts at cleaning up external resources of a deleted AppService",
            cleanup_failures.clone(),
        );
        registry.register(
            "api_writes",
            "API writes made by reconcile, by resource",
            writes.clone(),
        );
        // Every fixed series exists from the start, at 0: an alert on a rate of a series
        // that appears only with the first failure sees nothing until then.
        for &result in Ended::ALL {
            let _ = reconciles.get_or_create(&ResultLabel { result });
        }
        for &reason in ErrorReason::ALL {
            let _ = errors.get_or_create(&ErrorLabel { reason });
        }
        for &ready in Ready::ALL {
            let _ = objects.get_or_create(&ReadyLabel { ready });
        }
        for &resource in Written::ALL {
            let _ = writes.get_or_create(&WriteLabel { resource });
        }
        Metrics {
            registry: Mutex::new(root),
            families: Mutex::new(HashMap::new()),
            queue,
            process,
            reconciles,
            errors,
            duration,
            objects,
            leader,
            leader_transitions,
            api,
            cleanup_failures,
            excluded,
            writes,
            ready_by_key: Mutex::new(HashMap::new()),
            held_by_key: Mutex::new(HashMap::new()),
            held,
            oldest_held,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, ok: bool, took: Duration) {
        let result = Ended::of(ok);
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn error(&self, reason: ErrorReason) {
        self.errors.get_or_create(&ErrorLabel { reason }).inc();
    }

    pub fn write(&self, resource: Written) {
        self.writes.get_or_create(&WriteLabel { resource }).inc();
    }

    /// An AppService in an excluded namespace was left alone.
    pub fn excluded(&self) {
        self.excluded.inc();
    }

    /// How often an AppService in an excluded namespace was left alone.
    pub fn excluded_count(&self) -> u64 {
        self.excluded.get()
    }

    pub fn cleanup_failed(&self) {
        self.cleanup_failures.inc();
    }

    /// Whether this replica leads; a change counts as a leader transition.
    pub fn set_leader(&self, leading: bool) {
        if self.leader.set(i64::from(leading)) != i64::from(leading) {
            self.leader_transitions.inc();
        }
    }

    /// Times this replica became or stopped being the leader.
    pub fn leader_transitions(&self) -> u64 {
        self.leader_transitions.get()
    }

    /// The metrics of the client's API requests, to build the client with
    /// ([`crate::client::build_client_with_metrics`]).
    pub fn api(&self) -> ApiMetrics {
        self.api.clone()
    }

    /// The families of type `F`, registered under the controller's prefix the first time
    /// they are asked for, the same set every later time: a provider made twice over one
    /// `Metrics` records into one set, and no family is exported twice.
    pub fn families<F: Families>(&self) -> F {
        let mut families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = families
            .get(&TypeId::of::<F>())
            .and_then(|known| known.downcast_ref::<F>())
        {
            return known.clone();
        }
        let new = F::default();
        new.register(
            self.registry
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .sub_registry_with_prefix(PREFIX),
        );
        families.insert(TypeId::of::<F>(), Box::new(new.clone()));
        new
    }

    /// The work queue's metrics.
    pub fn queue(&self) -> &Arc<crate::queue::Queue> {
        &self.queue
    }

    /// Reconciles run so far (both results).
    pub fn reconcile_count(&self) -> u64 {
        Ended::ALL
            .iter()
            .map(|&result| self.reconciles.get_or_create(&ResultLabel { result }).get())
            .sum()
    }

    /// Failed reconciles for `reason` so far.
    pub fn errors_of(&self, reason: ErrorReason) -> u64 {
        self.errors.get_or_create(&ErrorLabel { reason }).get()
    }

    /// Failed attempts at cleaning up external resources so far.
    pub fn cleanup_failure_count(&self) -> u64 {
        self.cleanup_failures.get()
    }

    /// API writes made so far by reconcile to one resource.
    pub fn writes_to(&self, resource: Written) -> u64 {
        self.writes.get_or_create(&WriteLabel { resource }).get()
    }

    /// API writes made so far by reconcile, all resources.
    pub fn write_count(&self) -> u64 {
        Written::ALL
            .iter()
            .map(|&resource| self.writes_to(resource))
            .sum()
    }

    /// AppServices whose Ready condition has this status.
    pub fn objects(&self, ready: Ready) -> i64 {
        self.objects.get_or_create(&ReadyLabel { ready }).get()
    }

    /// Records the Ready status of `key` (`None` when the object is gone).
    pub fn set_ready(&self, key: &ObjectRef<AppService>, ready: Option<Ready>) {
        let mut by_key = self
            .ready_by_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = match ready {
            Some(r) => by_key.insert(key.clone(), r),
            None => by_key.remove(key),
        };
        if old == ready {
            return;
        }
        if let Some(old) = old {
            self.objects.get_or_create(&ReadyLabel { ready: old }).dec();
        }
        if let Some(new) = ready {
            self.objects.get_or_create(&ReadyLabel { ready: new }).inc();
        }
    }

    /// Records that our finalizer holds `key`, deleted at `deleted` (Unix seconds), or
    /// (`None`) that it no longer does: cleaned up, or gone.
    pub fn set_held(&self, key: &ObjectRef<AppService>, deleted: Option<i64>) {
        let mut by_key = self
            .held_by_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match deleted {
            Some(at) => by_key.insert(key.clone(), at),
            None => by_key.remove(key),
        };
        self.held
            .set(i64::try_from(by_key.len()).unwrap_or(i64::MAX));
        self.oldest_held
            .set(by_key.values().copied().min().unwrap_or(0));
    }

    /// AppServices held by our finalizer, and the oldest one's deletion time (0: none).
    pub fn held(&self) -> (i64, i64) {
        (self.held.get(), self.oldest_held.get())
    }

    /// The registry in the Prometheus text format, with the queue's gauges as of now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.queue.refresh(std::time::Instant::now());
        self.process.refresh();
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_gauge_tracks_transitions() {
        let m = Metrics::default();
        let (a, b) = (
            ObjectRef::new("a").within("ns"),
            ObjectRef::new("b").within("ns"),
        );
        m.set_ready(&a, Some(Ready::False));
        m.set_ready(&b, Some(Ready::False));
        m.set_ready(&a, Some(Ready::True));
        m.set_ready(&a, Some(Ready::True));
        assert_eq!(m.objects(Ready::True), 1);
        assert_eq!(m.objects(Ready::False), 1);
        m.set_ready(&b, None);

        // Held by the finalizer: the count and the oldest deletion, kept exact.
        assert_eq!(m.held(), (0, 0));
        m.set_held(&a, Some(200));
        m.set_held(&b, Some(100));
        m.set_held(&a, Some(200));
        assert_eq!(m.held(), (2, 100));
        m.set_held(&b, None);
        assert_eq!(m.held(), (1, 200));
        m.set_held(&a, None);
        m.set_held(&a, None);
        assert_eq!(m.held(), (0, 0));
        assert_eq!(m.objects(Ready::False), 0);
        m.write(Written::Deployments);
        m.write(Written::Events);
        assert_eq!(m.write_count(), 2);
        m.reconciled(true, Duration::from_millis(3));
        m.reconciled(false, Duration::from_millis(3));
        assert_eq!(m.reconcile_count(), 2);
        let text = m.encode().unwrap();
        for series in [
            "appservice_controller_reconciles_total{result=\"error\"}",
            "appservice_controller_reconcile_errors_total{reason=\"drift\"} 0",
            "appservice_controller_objects{ready=\"Unknown\"} 0",
            "appservice_controller_api_writes_total{resource=\"services\"} 0",
            "appservice_controller_cleanup_failures_total 0",
            "workqueue_depth{name=\"appservice\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
        assert!(
            text.contains("appservice_controller_objects{ready=\"True\"} 1"),
            "{text}"
        );
    }

    /// A provider's family, for the test below.
    #[derive(Clone, Default)]
    struct Probe(Counter);

    impl Families for Probe {
        fn register(&self, registry: &mut Registry) {
            registry.register("probe", "A provider's family", self.0.clone());
        }
    }

    #[test]
    fn a_provider_registers_its_families_once_under_the_prefix() {
        let m = Metrics::default();
        assert!(!m.encode().unwrap().contains("probe"));
        let first = m.families::<Probe>();
        first.0.inc();
        m.families::<Probe>().0.inc();
        assert_eq!(first.0.get(), 2, "one set of families, shared");
        let text = m.encode().unwrap();
        assert!(
            text.contains("appservice_controller_probe_total 2"),
            "{text}"
        );
        assert_eq!(
            text.matches("# HELP appservice_controller_probe ").count(),
            1,
            "{text}"
        );
    }
}
