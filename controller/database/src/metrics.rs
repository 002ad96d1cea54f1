//! `appservice_controller_database_*`: the database step's operations, failures and
//! orphan scans.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::error::DatabaseErrorReason;
use controller_core::metrics::Families;
use telemetry::labels::Ended;

telemetry::label_values! {
    /// A database operation.
    pub enum DatabaseOperation { Provision => "provision", Cleanup => "cleanup" }

    /// What the orphan scan found of a database whose AppService is gone: `orphaned`
    /// (its role can still log in: a finalizer removed by hand), or `retained` (kept
    /// without a login by deletionPolicy Retain).
    pub enum OrphanState { Orphaned => "orphaned", Retained => "retained" }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseErrorLabel {
    pub reason: DatabaseErrorReason,
}

/// A DatabaseClass's name: cluster-scoped objects written by admins, few per cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OrphanLabel {
    pub class: String,
    pub state: OrphanState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OrphanScanLabel {
    pub result: Ended,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseOpLabel {
    pub operation: DatabaseOperation,
    pub result: Ended,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: DatabaseOperation,
}

/// Metrics of the database step (`appservice_controller_database_*`).
#[derive(Clone)]
pub struct DatabaseMetrics {
    /// Provision and cleanup attempts by result.
    pub operations: Family<DatabaseOpLabel, Counter>,
    /// Databases and roles of AppServices that no longer exist, per class and state, as
    /// the last orphan scan of the class found them.
    pub orphans: Family<OrphanLabel, Gauge>,
    /// Orphaned databases the scan dropped (classes with `orphanPolicy: Drop`).
    pub orphans_dropped: Family<ClassLabel, Counter>,
    /// Orphan scans of a class by result.
    pub orphan_scans: Family<OrphanScanLabel, Counter>,
    /// Failures by reason (`unreachable`, `credentials`, `class_not_found`, ...).
    pub errors: Family<DatabaseErrorLabel, Counter>,
    /// Duration of one provision or cleanup attempt.
    pub duration: Family<OperationLabel, Histogram>,
}

impl Default for DatabaseMetrics {
    fn default() -> Self {
        DatabaseMetrics {
            operations: Family::default(),
            orphans: Family::default(),
            orphans_dropped: Family::default(),
            orphan_scans: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
        }
    }
}

impl DatabaseMetrics {
    fn record(&self, operation: DatabaseOperation, ok: bool, took: Duration) {
        let result = Ended::of(ok);
        self.operations
            .get_or_create(&DatabaseOpLabel { operation, result })
            .inc();
        self.duration
            .get_or_create(&OperationLabel { operation })
            .observe(took.as_secs_f64());
    }

    pub fn provisioned(&self, ok: bool, took: Duration) {
        self.record(DatabaseOperation::Provision, ok, took);
    }

    pub fn cleaned(&self, ok: bool, took: Duration) {
        self.record(DatabaseOperation::Cleanup, ok, took);
    }

    pub fn error(&self, reason: DatabaseErrorReason) {
        self.errors
            .get_or_create(&DatabaseErrorLabel { reason })
            .inc();
    }

    /// What the last scan of `class` found: `orphaned` and `retained` counts.
    pub fn set_orphans(&self, class: &str, orphaned: usize, retained: usize) {
        for (state, n) in [
            (OrphanState::Orphaned, orphaned),
            (OrphanState::Retained, retained),
        ] {
            self.orphans
                .get_or_create(&OrphanLabel {
                    class: class.to_owned(),
                    state,
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The orphan gauge of `class` in `state`.
    pub fn orphans_of(&self, class: &str, state: OrphanState) -> i64 {
        self.orphans
            .get_or_create(&OrphanLabel {
                class: class.to_owned(),
                state,
            })
            .get()
    }

    /// Forgets the series of a class that is gone.
    pub fn forget_class(&self, class: &str) {
        for state in [OrphanState::Orphaned, OrphanState::Retained] {
            self.orphans.remove(&OrphanLabel {
                class: class.to_owned(),
                state,
            });
        }
        self.orphans_dropped.remove(&ClassLabel {
            class: class.to_owned(),
        });
    }

    pub fn orphan_dropped(&self, class: &str) {
        self.orphans_dropped
            .get_or_create(&ClassLabel {
                class: class.to_owned(),
            })
            .inc();
    }

    pub fn dropped_of(&self, class: &str) -> u64 {
        self.orphans_dropped
            .get_or_create(&ClassLabel {
                class: class.to_owned(),
            })
            .get()
    }

    pub fn orphan_scan(&self, ok: bool) {
        self.orphan_scans
            .get_or_create(&OrphanScanLabel {
                result: Ended::of(ok),
            })
            .inc();
    }

    pub fn orphan_scans_of(&self, ok: bool) -> u64 {
        self.orphan_scans
            .get_or_create(&OrphanScanLabel {
                result: Ended::of(ok),
            })
            .get()
    }

    /// Attempts of `operation` with `result` so far.
    pub fn count(&self, operation: DatabaseOperation, result: Ended) -> u64 {
        self.operations
            .get_or_create(&DatabaseOpLabel { operation, result })
            .get()
    }

    /// Every attempt so far, as `provisions ok/err: 3/0, cleanups ok/err: 2/1`.
    pub fn summary(&self) -> String {
        let count = |operation| {
            (
                self.count(operation, Ended::Success),
                self.count(operation, Ended::Error),
            )
        };
        let (provisioned, provision_failed) = count(DatabaseOperation::Provision);
        let (cleaned, cleanup_failed) = count(DatabaseOperation::Cleanup);
        format!(
            "provisions ok/err: {provisioned}/{provision_failed}, cleanups ok/err: {cleaned}/{cleanup_failed}"
        )
    }
}

impl Families for DatabaseMetrics {
    /// Registers the families, every fixed series at 0 from the start.
    fn register(&self, registry: &mut Registry) {
        for &operation in DatabaseOperation::ALL {
            for &result in Ended::ALL {
                let _ = self
                    .operations
                    .get_or_create(&DatabaseOpLabel { operation, result });
            }
            let _ = self.duration.get_or_create(&OperationLabel { operation });
        }
        for &reason in DatabaseErrorReason::ALL {
            let _ = self.errors.get_or_create(&DatabaseErrorLabel { reason });
        }
        for &result in Ended::ALL {
            let _ = self.orphan_scans.get_or_create(&OrphanScanLabel { result });
        }
        registry.register(
            "database_orphans",
            "Databases and roles of AppServices that no longer exist, by DatabaseClass and state (orphaned, retained), as the last orphan scan found them",
            self.orphans.clone(),
        );
        registry.register(
            "database_orphans_dropped",
            "Orphaned databases dropped by the orphan scan (orphanPolicy Drop), by DatabaseClass",
            self.orphans_dropped.clone(),
        );
        registry.register(
            "database_orphan_scans",
            "Orphan scans of one DatabaseClass by result",
            self.orphan_scans.clone(),
        );
        registry.register(
            "database_operations",
            "Database provision and cleanup attempts by operation and result",
            self.operations.clone(),
        );
        registry.register(
            "database_errors",
            "Database failures by reason",
            self.errors.clone(),
        );
        registry.register(
            "database_operation_duration_seconds",
            "Duration of one database provision or cleanup attempt",
            self.duration.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use controller_core::metrics::Metrics;

    #[test]
    fn every_fixed_series_is_exported_from_the_start_once() {
        let metrics = Metrics::default();
        let ours = metrics.families::<DatabaseMetrics>();
        ours.cleaned(false, Duration::from_millis(1));
        let text = metrics.encode().expect("encodes");
        for series in [
            "appservice_controller_database_operations_total{operation=\"cleanup\",result=\"error\"} 1",
            "appservice_controller_database_operations_total{operation=\"provision\",result=\"success\"} 0",
            "appservice_controller_database_errors_total{reason=\"unreachable\"} 0",
            "appservice_controller_database_orphan_scans_total{result=\"error\"} 0",
            "appservice_controller_database_operation_duration_seconds_count{operation=\"provision\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
        // Asked for again (a second Databases over the same metrics): the same set.
        metrics
            .families::<DatabaseMetrics>()
            .cleaned(false, Duration::ZERO);
        assert_eq!(ours.count(DatabaseOperation::Cleanup, Ended::Error), 2);
        let text = metrics.encode().expect("encodes");
        assert_eq!(
            text.matches("# HELP appservice_controller_database_errors ")
                .count(),
            1,
            "{text}"
        );
    }
}
