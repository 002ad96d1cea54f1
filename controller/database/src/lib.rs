//! PostgreSQL databases of AppServices, behind the finalizer ([`External`]).
//!
//! `ensure`, for an AppService with `spec.database.enabled`:
//! 1. reads its `DatabaseClass` and the admin credentials (and CA) from the operator's
//!    namespace, and takes a connection from the class's pool;
//! 2. makes sure the Secret `<name>-database` exists (created first, with a new password
//!    and a "password pending" mark, so two controllers agree on one password: the second
//!    create gets 409 and reads the first one's);
//! 3. creates the role (or sets the Secret's password when it is pending) and the
//!    database owned by it, named from the UID, `CONNECT` revoked from `PUBLIC`;
//!    "already exists" from a concurrent creator counts as success; the role's LOGIN
//!    and the class's connection limit are put back when they drift;
//! 4. clears the pending mark, and reports `DatabaseReady=True`.
//!
//! Before any of it the class must pass `common::database_class::refusal`, allow the
//! AppService's namespace, and name an admin Secret that opted in by label
//! (`server.rs`). Passwords reach the server only as SCRAM-SHA-256 verifiers computed
//! here (`sql::Verifier`); text in the Secret that the controller did not generate is
//! replaced (`secret::trusted_password`).
//!
//! Files: this one orchestrates (`ensure`, `cleanup`, Events); `provision.rs` runs the
//! steps above and the removal on one server; `secret.rs` builds the Secret, and
//! `pod.rs` what the Pods get from it; `class_status.rs` writes the class's status; `server.rs` and `connect.rs` reach the
//! server; `orphans.rs` is the periodic orphan scan; `error.rs` its failures and their
//! reasons; `metrics.rs` its `appservice_controller_database_*` families.
//!
//! A crash between any two steps leaves a state the next reconcile completes. With the
//! database disabled, `ensure` removes what an earlier generation created, following the
//! class's `deletionPolicy`; `cleanup` does the same for a deleted AppService.

mod class_status;
mod connect;
pub mod error;
pub mod metrics;
pub mod orphans;
pub mod pod;
mod provision;
pub mod secret;
mod server;
pub mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::AppService;
use common::conditions::{DATABASE_READY, FALSE, TRUE};
use common::names::{FIELD_MANAGER, database_secret_name};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

pub use connect::Limits;
use connect::Pools;
use error::DbResult;
pub use error::{DatabaseError, DatabaseErrorReason, reasons};
use metrics::DatabaseMetrics;

use controller_core::error::{Error, Result};
use controller_core::external::{ConditionReport, External, PodAdditions, Readiness, Report, Step};
use controller_core::metrics::{Metrics, Written};
use controller_core::subject::Subject;

pub use common::names::CLASS_ANNOTATION;
pub use common::names::PASSWORD_PENDING_ANNOTATION;

/// How often a database waiting for an admin (missing class, wrong credentials) is
/// looked at again. Fixed, not a backoff: nothing here is a hot loop, and the admin's
/// fix should show within this long.
pub const WAITING_RECHECK: Duration = Duration::from_secs(30);

/// Settings of the database step (flags of the controller binary).
#[derive(clap::Args, Clone, Debug)]
pub struct DatabaseConfig {
    /// Namespace of the DatabaseClasses' admin Secrets and CA objects (default: the
    /// lease namespace, i.e. the release namespace).
    #[arg(long, env = "DATABASE_ADMIN_NAMESPACE")]
    pub admin_namespace: Option<String>,

    /// Connections per DatabaseClass.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 4)]
    pub pool_size: usize,

    /// Limit on connecting and logging in to a database server.
    #[arg(long, env = "DATABASE_CONNECT_TIMEOUT", value_parser = common::duration::parse_duration, default_value = "5s")]
    pub connect_timeout: Duration,

    /// Limit on one SQL statement (the server's `statement_timeout`).
    #[arg(long, env = "DATABASE_STATEMENT_TIMEOUT", value_parser = common::duration::parse_duration, default_value = "15s")]
    pub statement_timeout: Duration,

    /// How often the leader scans each DatabaseClass's server for databases and roles of
    /// AppServices that no longer exist (docs/users/databases.md, "Orphaned databases"); 0 turns it off.
    #[arg(long, env = "DATABASE_ORPHAN_SCAN_INTERVAL", value_parser = common::duration::parse_duration, default_value = "1h")]
    pub orphan_scan_interval: Duration,
}

/// The database step: an [`External`] over real PostgreSQL servers.
pub struct Databases {
    client: Client,
    admin_namespace: String,
    limits: Limits,
    pools: Pools,
    metrics: Arc<Metrics>,
    /// Its own families (`appservice_controller_database_*`), registered in `metrics`.
    series: DatabaseMetrics,
    recorder: Recorder,
    orphan_scan_interval: Duration,
    orphans: orphans::Memory,
    /// "Now" for condition timestamps, as the status module takes it.
    clock: Arc<dyn controller_core::status::Clock>,
}

/// The AppService's namespace and UID. Its database and role are named from the UID, so
/// a UID that is not 32 hex digits (never one read from the API server: they are UUIDs)
/// is refused, never given a name another AppService could share.
fn identity(app: &Subject<'_>) -> DbResult<(String, String)> {
    let uid = Some(app.uid())
        .filter(|uid| sql::uid_hex_of(&sql::db_name(uid)).is_some())
        .ok_or_else(|| {
            DatabaseError::Internal("the AppService has no UID of 32 hex digits".into())
        })?;
    Ok((app.namespace().to_owned(), uid.to_owned()))
}

/// A poisoned lock is recovered: the maps here stay consistent between statements.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Databases {
    pub fn new(
        client: Client,
        config: &DatabaseConfig,
        lease_namespace: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_owned(),
                instance: None,
            },
        );
        Databases {
            client,
            admin_namespace: config
                .admin_namespace
                .clone()
                .unwrap_or_else(|| lease_namespace.to_owned()),
            limits: Limits {
                pool_size: config.pool_size.max(1),
                connect_timeout: config.connect_timeout,
                statement_timeout: config.statement_timeout,
            },
            pools: Pools::default(),
            series: metrics.families(),
            metrics,
            recorder,
            orphan_scan_interval: config.orphan_scan_interval,
            orphans: orphans::Memory::default(),
            clock: Arc::new(controller_core::status::SystemClock),
        }
    }

    /// The same, stamping conditions with `clock` (tests pin time).
    pub fn with_clock(mut self, clock: Arc<dyn controller_core::status::Clock>) -> Self {
        self.clock = clock;
        self
    }

    async fn publish(
        &self,
        app: &Subject<'_>,
        type_: EventType,
        reason: &str,
        note: String,
        action: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        controller_core::report::publish(&self.recorder, &self.metrics, app.app(), &event).await;
    }

    /// `ensure` for an AppService whose database is disabled: remove what an earlier
    /// generation created (found through the credentials Secret), per the class's policy.
    async fn ensure_disabled(&self, app: &Subject<'_>) -> Result<Report> {
        let (namespace, uid) = identity(app).map_err(DatabaseError::into_ensure_error)?;
        let secret_name = database_secret_name(&app.name_any());
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let absent = Report {
            outcome: Readiness::Done,
            conditions: vec![],
            absent: vec![DATABASE_READY],
            pod: PodAdditions::default(),
            images: None,
        };
        // Only an AppService that ever mentioned a database can have one: the others
        // (most of them) cost no API request here.
        if !mentions_database(app.app()) {
            return Ok(absent);
        }
        let Some(live) = secrets.get_opt(&secret_name).await? else {
            return Ok(absent);
        };
        if !secret::is_ours(&live, &uid, &sql::db_name(&uid)) {
            return Ok(absent);
        }
        let class_name = live.annotations().get(CLASS_ANNOTATION).cloned();
        if let Some(class_name) = class_name {
            let started = Instant::now();
            match self.remove(app, &class_name).await {
                Ok((reason, message)) => {
                    self.removed(app, started, reason, message, "DisableDatabase")
                        .await;
                }
                Err(DatabaseError::Kube(e)) => return Err(Error::Kube(e)),
                Err(e) => {
                    self.removal_failed(&e, started);
                    let report = ConditionReport {
                        type_: DATABASE_READY,
                        status: FALSE,
                        reason: e.reason(),
                        message: format!(
                            "the database is disabled but could not be removed: {}",
                            e.condition_message()
                        ),
                    };
                    return Ok(self.failed(report, e));
                }
            }
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: live.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match secrets.delete(&secret_name, &params).await {
            Ok(_) => self.metrics.write(Written::Secrets),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
        Ok(absent)
    }

    /// A removal that began at `started` succeeded: counted, logged and announced by an
    /// Event of `action`.
    async fn removed(
        &self,
        app: &Subject<'_>,
        started: Instant,
        reason: &'static str,
        message: String,
        action: &'static str,
    ) {
        self.series.cleaned(true, started.elapsed());
        info!(%message, action, "database removed");
        self.publish(app, EventType::Normal, reason, message, action)
            .await;
    }

    /// A removal that began at `started` failed with `e`: counted by reason.
    fn removal_failed(&self, e: &DatabaseError, started: Instant) {
        self.series.cleaned(false, started.elapsed());
        self.series.error(e.metric_label());
    }

    fn failed(&self, condition: ConditionReport, e: DatabaseError) -> Report {
        let outcome = if e.is_waiting() {
            Readiness::NotReady(WAITING_RECHECK)
        } else {
            Readiness::Failed(e.into_ensure_error())
        };
        Report {
            outcome,
            conditions: vec![condition],
            absent: vec![],
            pod: PodAdditions::default(),
            images: None,
        }
    }

    async fn ensure_enabled(&self, app: &Subject<'_>, class_name: &str) -> Result<Report> {
        let started = Instant::now();
        let result = self.provision(app, class_name).await;
        self.series.provisioned(result.is_ok(), started.elapsed());
        let report = match result {
            Ok((message, pod)) => Report {
                outcome: Readiness::Done,
                conditions: vec![ConditionReport {
                    type_: DATABASE_READY,
                    status: TRUE,
                    reason: reasons::PROVISIONED,
                    message,
                }],
                absent: vec![],
                pod: pod::additions(app.name(), &pod),
                images: None,
            },
            // API errors go to the error policy like any other (409 retried soon, ...).
            Err(DatabaseError::Kube(e)) => return Err(Error::Kube(e)),
            Err(e) => {
                self.series.error(e.metric_label());
                let condition = ConditionReport {
                    type_: DATABASE_READY,
                    status: FALSE,
                    reason: e.reason(),
                    message: e.condition_message(),
                };
                // The whole story (admin Secret, server's words) is for admins only.
                match e {
                    DatabaseError::Unreachable { .. } => {
                        warn!(error = %e, "database server unreachable")
                    }
                    _ => warn!(error = %e, reason = e.reason(), "database not ready"),
                }
                self.failed(condition, e)
            }
        };
        // Its Event, when DatabaseReady moves, comes with the status (`report::announcements`).
        Ok(report)
    }

    async fn cleanup_app(&self, app: &Subject<'_>) -> Result<Step> {
        let (namespace, uid) = identity(app).map_err(DatabaseError::into_ensure_error)?;
        let secret_name = database_secret_name(&app.name_any());
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let secret = secrets
            .get_opt(&secret_name)
            .await?
            .filter(|s| secret::is_ours(s, &uid, &sql::db_name(&uid)));
        let class_name = match app.spec.database_class() {
            Some(c) => c.to_owned(),
            None => match secret
                .as_ref()
                .and_then(|s| s.annotations().get(CLASS_ANNOTATION).cloned())
            {
                Some(c) => c,
                // Never provisioned (or already removed when the database was disabled).
                None => return Ok(Step::Done),
            },
        };
        let started = Instant::now();
        match self.remove(app, &class_name).await {
            Ok((reason, message)) => {
                self.removed(app, started, reason, message, "Cleanup").await;
                Ok(Step::Done)
            }
            // Nothing was ever created without the Secret existing first (see
            // `provision`): with no Secret and a class that does not exist or that the
            // controller refuses to use (so it never provisioned anything through it),
            // there is nothing to drop, and the tenant's deletion does not wait for an
            // admin.
            Err(
                DatabaseError::ClassNotFound(_)
                | DatabaseError::ClassRefused { .. }
                | DatabaseError::AdminSecretNotOptedIn { .. },
            ) if secret.is_none() => Ok(Step::Done),
            Err(DatabaseError::Kube(e)) => Err(Error::Kube(e)),
            Err(e) => {
                self.removal_failed(&e, started);
                warn!(error = %e, "database cleanup failed");
                Err(e.into_cleanup_error())
            }
        }
    }
}

/// Whether `app` may have a database: its spec asks for one, or its status still reports
/// one (the spec dropped it and the removal has not been reported done). A database is
/// only ever created for a spec that asks for it, after the finalizer is on, and its
/// `DatabaseReady` condition goes only once it is removed; the orphan scan is the net for
/// a status cleared by another writer.
fn mentions_database(app: &AppService) -> bool {
    app.spec.database.is_some()
        || app
            .status
            .as_ref()
            .is_some_and(|s| common::conditions::find(&s.conditions, DATABASE_READY).is_some())
}

impl External for Databases {
    fn ensure<'a>(&'a self, app: &'a Subject<'a>) -> BoxFuture<'a, Result<Report>> {
        Box::pin(async move {
            match app.spec.database_class() {
                Some(class) => self.ensure_enabled(app, class).await,
                None => self.ensure_disabled(app).await,
            }
        })
    }

    fn cleanup<'a>(&'a self, app: &'a Subject<'a>) -> BoxFuture<'a, Result<Step>> {
        Box::pin(self.cleanup_app(app))
    }

    fn background(
        self: Arc<Self>,
        leading: tokio::sync::watch::Receiver<bool>,
    ) -> Option<BoxFuture<'static, ()>> {
        let interval = self.orphan_scan_interval;
        (!interval.is_zero()).then(|| -> BoxFuture<'static, ()> {
            Box::pin(async move { self.scan_orphans_every(interval, leading).await })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_appservice_that_may_have_a_database_costs_a_lookup_at_cleanup() {
        let app = |value: serde_json::Value| -> AppService {
            serde_json::from_value(value).expect("an AppService")
        };
        let meta = serde_json::json!({"name": "shop", "namespace": "team"});
        let plain = app(serde_json::json!({
            "metadata": meta, "spec": {"image": "nginx:1.27"}
        }));
        assert!(!mentions_database(&plain));
        let requested = app(serde_json::json!({
            "metadata": meta, "spec": {"image": "nginx:1.27", "database": {"class": "main"}}
        }));
        assert!(mentions_database(&requested));
        // The request dropped, the removal not reported yet: still looked up.
        let removing = app(serde_json::json!({
            "metadata": meta, "spec": {"image": "nginx:1.27"},
            "status": {"conditions": [{"type": DATABASE_READY, "status": "True",
                "reason": "Provisioned", "message": "", "lastTransitionTime": "2026-12-04T00:00:00Z"}]}
        }));
        assert!(mentions_database(&removing));
        // Other conditions alone do not.
        let ready = app(serde_json::json!({
            "metadata": meta, "spec": {"image": "nginx:1.27"},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "Available", "message": "", "lastTransitionTime": "2026-12-04T00:00:00Z"}]}
        }));
        assert!(!mentions_database(&ready));
    }

    #[test]
    fn an_appservice_without_a_uuid_gets_no_database_name() {
        let mut app = AppService::new("shop", common::AppServiceSpec::default());
        app.metadata.namespace = Some("team".into());
        for uid in [
            "not-a-uuid",
            "0f3c2a1b-9d8e",
            "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0cZ",
        ] {
            app.metadata.uid = Some(uid.to_owned());
            let subject = Subject::of(&app).expect("name, namespace and uid are there");
            assert!(identity(&subject).is_err(), "{uid:?}");
        }
        app.metadata.uid = Some("0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9".into());
        let subject = Subject::of(&app).expect("name, namespace and uid are there");
        assert_eq!(
            identity(&subject).ok(),
            Some((
                "team".to_owned(),
                "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9".to_owned()
            ))
        );
    }
}
