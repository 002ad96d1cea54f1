//! Prometheus metrics of the controller, with small fixed label sets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success`, `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadyLabel {
    /// Status of the Ready condition: `True`, `False`, `Unknown`.
    pub ready: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `deployments`, `services`, `appservices`, `appservices/status`, `events`.
    pub resource: &'static str,
}

/// Every value of [`WriteLabel::resource`].
pub const WRITE_RESOURCES: [&str; 7] = [
    "deployments",
    "services",
    "appservices",
    "appservices/status",
    "events",
    "secrets",
    "databaseclasses/status",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseOpLabel {
    /// `provision`, `cleanup`.
    pub operation: &'static str,
    /// `success`, `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    /// `provision`, `cleanup`.
    pub operation: &'static str,
}

/// Every value of `DatabaseError::metric_label` (the `reason` of `database_errors`).
pub const DATABASE_ERROR_LABELS: [&str; 10] = [
    "class_not_found",
    "admin_secret",
    "ca",
    "credentials",
    "privilege",
    "unreachable",
    "sql",
    "secret_conflict",
    "kube",
    "internal",
];

/// Metrics of the database step (`appservice_controller_database_*`).
#[derive(Clone)]
pub struct DatabaseMetrics {
    /// Provision and cleanup attempts by result.
    pub operations: Family<DatabaseOpLabel, Counter>,
    /// Failures by reason (`unreachable`, `credentials`, `class_not_found`, ...).
    pub errors: Family<ReasonLabel, Counter>,
    /// Duration of one provision or cleanup attempt.
    pub duration: Family<OperationLabel, Histogram>,
}

impl Default for DatabaseMetrics {
    fn default() -> Self {
        DatabaseMetrics {
            operations: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
        }
    }
}

impl DatabaseMetrics {
    fn record(&self, operation: &'static str, ok: bool, took: Duration) {
        let result = if ok { "success" } else { "error" };
        self.operations
            .get_or_create(&DatabaseOpLabel { operation, result })
            .inc();
        self.duration
            .get_or_create(&OperationLabel { operation })
            .observe(took.as_secs_f64());
    }

    pub fn provisioned(&self, ok: bool, took: Duration) {
        self.record("provision", ok, took);
    }

    pub fn cleaned(&self, ok: bool, took: Duration) {
        self.record("cleanup", ok, took);
    }

    pub fn error(&self, reason: &'static str) {
        self.errors.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Attempts of `operation` with `result` so far.
    pub fn count(&self, operation: &'static str, result: &'static str) -> u64 {
        self.operations
            .get_or_create(&DatabaseOpLabel { operation, result })
            .get()
    }
}

/// Every metric the controller exports, registered in one registry.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ResultLabel, Counter>,
    pub errors: Family<ReasonLabel, Counter>,
    pub duration: Histogram,
    pub objects: Family<ReadyLabel, Gauge>,
    pub leader: Gauge,
    pub cleanup_failures: Counter,
    pub writes: Family<WriteLabel, Counter>,
    pub database: DatabaseMetrics,
    /// The work queue (controller-runtime's names, no prefix).
    pub queue: Arc<crate::queue::Queue>,
    /// `process_*`: memory, CPU, file descriptors, start time (read at scrape).
    pub process: telemetry::process::ProcessMetrics,
    /// Ready status per object key, to keep `objects` exact.
    ready_by_key: Mutex<HashMap<String, String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let queue = Arc::new(crate::queue::Queue::default());
        queue.register(&mut root);
        let process = telemetry::process::ProcessMetrics::default();
        process.register(&mut root);
        let registry = root.sub_registry_with_prefix("appservice_controller");
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ReasonLabel, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let objects = Family::<ReadyLabel, Gauge>::default();
        let leader = Gauge::default();
        let cleanup_failures = Counter::default();
        let writes = Family::<WriteLabel, Counter>::default();
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
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
        for result in ["success", "error"] {
            let _ = reconciles.get_or_create(&ResultLabel { result });
        }
        for reason in crate::error::ERROR_LABELS {
            let _ = errors.get_or_create(&ReasonLabel { reason });
        }
        for ready in ["True", "False", "Unknown"] {
            let _ = objects.get_or_create(&ReadyLabel {
                ready: ready.to_owned(),
            });
        }
        for resource in WRITE_RESOURCES {
            let _ = writes.get_or_create(&WriteLabel { resource });
        }
        let database = DatabaseMetrics::default();
        for operation in ["provision", "cleanup"] {
            for result in ["success", "error"] {
                let _ = database
                    .operations
                    .get_or_create(&DatabaseOpLabel { operation, result });
            }
            let _ = database
                .duration
                .get_or_create(&OperationLabel { operation });
        }
        for reason in DATABASE_ERROR_LABELS {
            let _ = database.errors.get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "database_operations",
            "Database provision and cleanup attempts by operation and result",
            database.operations.clone(),
        );
        registry.register(
            "database_errors",
            "Database failures by reason",
            database.errors.clone(),
        );
        registry.register(
            "database_operation_duration_seconds",
            "Duration of one database provision or cleanup attempt",
            database.duration.clone(),
        );
        Metrics {
            registry: root,
            database,
            queue,
            process,
            reconciles,
            errors,
            duration,
            objects,
            leader,
            cleanup_failures,
            writes,
            ready_by_key: Mutex::new(HashMap::new()),
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, ok: bool, took: Duration) {
        let result = if ok { "success" } else { "error" };
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn error(&self, reason: &'static str) {
        self.errors.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn write(&self, resource: &'static str) {
        self.writes.get_or_create(&WriteLabel { resource }).inc();
    }

    /// Reconciles run so far (both results).
    pub fn reconcile_count(&self) -> u64 {
        ["success", "error"]
            .into_iter()
            .map(|result| self.reconciles.get_or_create(&ResultLabel { result }).get())
            .sum()
    }

    /// API writes made so far by reconcile to one resource (one of [`WRITE_RESOURCES`]).
    pub fn writes_to(&self, resource: &'static str) -> u64 {
        self.writes.get_or_create(&WriteLabel { resource }).get()
    }

    /// API writes made so far by reconcile, all resources.
    pub fn write_count(&self) -> u64 {
        WRITE_RESOURCES
            .into_iter()
            .map(|resource| self.writes.get_or_create(&WriteLabel { resource }).get())
            .sum()
    }

    /// Records the Ready status of `key` (`None` when the object is gone).
    pub fn set_ready(&self, key: &str, ready: Option<&str>) {
        let Ok(mut by_key) = self.ready_by_key.lock() else {
            return;
        };
        let old = match ready {
            Some(r) => by_key.insert(key.to_owned(), r.to_owned()),
            None => by_key.remove(key),
        };
        if old.as_deref() == ready {
            return;
        }
        if let Some(old) = old {
            self.objects.get_or_create(&ReadyLabel { ready: old }).dec();
        }
        if let Some(new) = ready {
            self.objects
                .get_or_create(&ReadyLabel {
                    ready: new.to_owned(),
                })
                .inc();
        }
    }

    /// The registry in the Prometheus text format, with the queue's gauges as of now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.queue.refresh(std::time::Instant::now());
        self.process.refresh();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_gauge_tracks_transitions() {
        let m = Metrics::default();
        m.set_ready("ns/a", Some("False"));
        m.set_ready("ns/b", Some("False"));
        m.set_ready("ns/a", Some("True"));
        m.set_ready("ns/a", Some("True"));
        let get = |r: &str| {
            m.objects
                .get_or_create(&ReadyLabel { ready: r.into() })
                .get()
        };
        assert_eq!(get("True"), 1);
        assert_eq!(get("False"), 1);
        m.set_ready("ns/b", None);
        assert_eq!(get("False"), 0);
        m.write("deployments");
        m.write("events");
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
            "appservice_controller_database_operations_total{operation=\"cleanup\",result=\"error\"} 0",
            "appservice_controller_database_errors_total{reason=\"unreachable\"} 0",
            "appservice_controller_database_operation_duration_seconds_count{operation=\"provision\"} 0",
            "workqueue_depth{name=\"appservice\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
        assert!(
            text.contains("appservice_controller_objects{ready=\"True\"} 1"),
            "{text}"
        );
    }
}
