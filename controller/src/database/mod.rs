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
//! A crash between any two steps leaves a state the next reconcile completes. With the
//! database disabled, `ensure` removes what an earlier generation created, following the
//! class's `deletionPolicy`; `cleanup` does the same for a deleted AppService.

mod connect;
mod error;
pub mod orphans;
pub mod secret;
mod server;
pub mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::conditions::{DATABASE_READY, FALSE, TRUE};
use common::database_class::REACHABLE;
use common::names::{FIELD_MANAGER, database_secret_name};
use common::{AppService, DatabaseClass, DatabaseClassStatus, DeletionPolicy};
use deadpool_postgres::Object;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

pub use connect::Limits;
use connect::Pools;
use error::DbResult;
pub use error::{DatabaseError, DatabaseErrorReason, reasons};
use server::Server;

use crate::desired::PodDatabase;
use crate::error::{Error, Result};
use crate::external::{ConditionReport, External, Outcome, Report, Step};
use crate::metrics::{Metrics, Written};

/// Annotation on the credentials Secret: the class the database lives on, so that
/// disabling the database later finds the server even when the spec no longer says.
pub const CLASS_ANNOTATION: &str = "platform.example.com/database-class";
/// Annotation on the credentials Secret while its password may not be the role's yet.
pub const PASSWORD_PENDING_ANNOTATION: &str = "platform.example.com/password-pending";

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
    /// AppServices that no longer exist (README "Orphaned databases"); 0 turns it off.
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
    recorder: Recorder,
    orphan_scan_interval: Duration,
    orphans: orphans::Memory,
}

/// The AppService's namespace and UID. Its database and role are named from the UID, so
/// an object without a UUID (never one read from the API server) is refused, never given
/// a name another AppService could share (`appsvc_` alone).
fn identity(app: &AppService) -> DbResult<(String, String)> {
    let namespace = app
        .namespace()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| DatabaseError::Internal("the AppService has no namespace".into()))?;
    let uid = app
        .metadata
        .uid
        .clone()
        .filter(|uid| sql::uid_hex_of(&sql::db_name(uid)).is_some())
        .ok_or_else(|| {
            DatabaseError::Internal("the AppService has no UID of 32 hex digits".into())
        })?;
    Ok((namespace, uid))
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
            metrics,
            recorder,
            orphan_scan_interval: config.orphan_scan_interval,
            orphans: orphans::Memory::default(),
        }
    }

    /// Provisions the database of `app` on `class_name`; returns what `DatabaseReady`
    /// should say, and what the Pods get from the Secret.
    async fn provision(
        &self,
        app: &AppService,
        class_name: &str,
    ) -> DbResult<(String, PodDatabase)> {
        let name = app.name_any();
        let (namespace, uid) = identity(app)?;
        let db = sql::db_name(&uid);
        let server = self.server(class_name).await?;
        let class = &server.class;
        self.check_namespace(&server, &namespace).await?;
        let (conn, ca_pem) = match self.connect(&server).await {
            Ok(c) => c,
            Err(e) => {
                self.observe_class(class, Err(&e)).await;
                return Err(e);
            }
        };
        self.observe_class_version(&server, &conn).await;
        let session = self.session(&server, &conn);

        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let secret_name = database_secret_name(&name);
        let live = match secrets.get_opt(&secret_name).await? {
            Some(s) => {
                if !secret::is_ours(&s, &uid, &db) {
                    return Err(DatabaseError::SecretConflict(format!(
                        "{namespace}/{secret_name}"
                    )));
                }
                s
            }
            None => {
                // The first side effect for this AppService (or after its Secret was
                // lost): make sure it is still the live object, not a stale cache entry
                // of one whose cleanup already ran, or we would provision it again.
                let apps: Api<AppService> = Api::namespaced(self.client.clone(), &namespace);
                let fresh = apps.get_opt(&name).await?;
                if !fresh.is_some_and(|a| {
                    a.metadata.uid.as_deref() == Some(uid.as_str())
                        && a.metadata.deletion_timestamp.is_none()
                }) {
                    return Err(DatabaseError::Internal(
                        "the AppService is going away; not provisioning".into(),
                    ));
                }
                let desired = secret::desired(
                    app,
                    class,
                    &db,
                    &sql::new_password(),
                    true,
                    ca_pem.as_deref(),
                )
                .map_err(|e| DatabaseError::Internal(e.to_string()))?;
                // Create, not apply: a second controller racing us gets 409 and then
                // reads our password instead of writing its own.
                let created = secrets.create(&PostParams::default(), &desired).await?;
                self.metrics.write(Written::Secrets);
                info!(secret = %secret_name, "database credentials Secret created");
                created
            }
        };
        // The role's password as the Secret tells it (an edited copy is told from the
        // real one by its hash); a Secret where neither copy is known good gets a new one.
        let (live, password) = match secret::trusted_password(&live) {
            Some(pw) => (live, pw),
            None => {
                let pw = sql::new_password();
                let mut desired = secret::desired(app, class, &db, &pw, true, ca_pem.as_deref())
                    .map_err(|e| DatabaseError::Internal(e.to_string()))?;
                secret::keep_others(&live, &mut desired);
                desired.metadata.resource_version = live.metadata.resource_version.clone();
                let replaced = secrets
                    .replace(&secret_name, &PostParams::default(), &desired)
                    .await?;
                self.metrics.write(Written::Secrets);
                (replaced, pw)
            }
        };
        let pending = live
            .annotations()
            .get(PASSWORD_PENDING_ANNOTATION)
            .is_some_and(|v| v == "true");

        let limit = class.spec.connection_limit;
        let verifier =
            || sql::Verifier::of(&password).map_err(|e| DatabaseError::Internal(e.to_string()));
        let role = session
            .query_opt("checking the role", sql::ROLE_STATE, &db)
            .await?
            .map(|row| -> (bool, i32) {
                (
                    row.try_get(0).unwrap_or(false),
                    row.try_get(1).unwrap_or(-1),
                )
            });
        let created = role.is_none()
            && session
                .execute_create("CREATE ROLE", &sql::create_role(&db, &verifier()?, limit))
                .await?;
        // A role someone created a moment ago, or one that may not have the Secret's
        // password yet: make the Secret's password the role's.
        if !created && (pending || role.is_none()) {
            session
                .execute("ALTER ROLE", &sql::set_password(&db, &verifier()?))
                .await?;
        }
        // LOGIN (gone under Retain, or taken away by hand) and the connection limit.
        if !created && role != Some((true, limit)) {
            session
                .execute("ALTER ROLE", &sql::set_login(&db, limit))
                .await?;
        }
        if !session
            .query_bool("checking the database", sql::DATABASE_EXISTS, &db)
            .await?
            && session
                .execute_create("CREATE DATABASE", &sql::create_database(&db, &db))
                .await?
        {
            let comment = format!("AppService {namespace}/{name} (uid {uid})");
            session
                .execute("COMMENT ON DATABASE", &sql::comment_database(&db, &comment))
                .await?;
        }
        if session
            .query_bool("checking CONNECT", sql::PUBLIC_MAY_CONNECT, &db)
            .await?
        {
            session
                .execute("REVOKE CONNECT", &sql::revoke_public_connect(&db))
                .await?;
        }
        drop(conn);

        // The Secret's content follows the class (host, port, TLS) and its password.
        let desired = secret::desired(app, class, &db, &password, false, ca_pem.as_deref())
            .map_err(|e| DatabaseError::Internal(e.to_string()))?;
        // ... and its metadata: our labels, our owner reference through the storage
        // version (re-pointing a Secret an earlier release made), others' entries kept.
        // What the Pods get: from the data as written, so the Deployment rolls only once
        // the role has the password its Pods will be given.
        let pod = secret::pod_database(&desired);
        if pending || !secret::same_data(&live, &desired) || !secret::same_metadata(&live, &desired)
        {
            let mut desired = desired;
            secret::keep_others(&live, &mut desired);
            desired.metadata.resource_version = live.metadata.resource_version.clone();
            // resourceVersion as precondition: if someone replaced the Secret meanwhile,
            // this fails (409) and the next reconcile starts from their version.
            secrets
                .replace(&secret_name, &PostParams::default(), &desired)
                .await?;
            self.metrics.write(Written::Secrets);
        }
        Ok((
            format!(
                "database {db} on {} (DatabaseClass {class_name}); credentials in Secret {secret_name}",
                server.address()
            ),
            pod,
        ))
    }

    /// Removes the database of `app` on `class_name` as the class's policy says.
    /// Returns the Event reason and message describing what happened.
    async fn remove(&self, app: &AppService, class_name: &str) -> DbResult<(&'static str, String)> {
        let (_, uid) = identity(app)?;
        let db = sql::db_name(&uid);
        let server = self.server(class_name).await?;
        let class = &server.class;
        let conn = match self.connect(&server).await {
            Ok((conn, _)) => conn,
            Err(e) => {
                self.observe_class(class, Err(&e)).await;
                return Err(e);
            }
        };
        if class.spec.deletion_policy == DeletionPolicy::Retain {
            // Keep the data, but not a login: the credentials in the (now deleted)
            // Secret, and any copy of them, stop working, and open sessions end.
            let session = self.session(&server, &conn);
            if session
                .query_opt("checking the role", sql::ROLE_STATE, &db)
                .await?
                .is_some()
            {
                session
                    .execute("ALTER ROLE", &sql::retire_role(&db))
                    .await?;
                session
                    .query_opt("terminating sessions", sql::TERMINATE_ROLE_SESSIONS, &db)
                    .await?;
            }
            return Ok((
                reasons::RETAINED,
                format!(
                    "database {db} kept on {} (DatabaseClass {class_name} has deletionPolicy Retain); its role can no longer log in",
                    server.address()
                ),
            ));
        }
        let session = self.session(&server, &conn);
        match tokio::time::timeout(
            self.op_timeout(),
            conn.query_one(sql::TERMINATE_SESSIONS, &[&db]),
        )
        .instrument(info_span!("db.statement", otel.kind = "client", db.system = "postgresql", db.operation = "terminating sessions", server.address = %server.address()))
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(server.pg_error("terminating sessions", &e)),
            Err(_) => {
                return Err(DatabaseError::Unreachable {
                    class: class_name.to_owned(),
                    address: server.address(),
                    detail: "terminating sessions did not finish in time".into(),
                });
            }
        }
        session
            .execute("DROP DATABASE", &sql::drop_database(&db))
            .await?;
        session.execute("DROP ROLE", &sql::drop_role(&db)).await?;
        Ok((
            reasons::DELETED,
            format!("database and role {db} dropped on {}", server.address()),
        ))
    }

    /// Records on the class whether its server could be reached (only when that changed).
    async fn observe_class(
        &self,
        class: &DatabaseClass,
        result: std::result::Result<&str, &DatabaseError>,
    ) {
        let (status, reason, message, version) = match result {
            Ok(version) => (TRUE, "LoggedIn", String::new(), Some(version.to_owned())),
            Err(e) if e.is_class_level() => (FALSE, e.reason(), e.to_string(), None),
            Err(_) => return,
        };
        // The status contract as kstatus reads it (Flux, Helm --wait): Stalled while an
        // admin must fix the class (credentials, CA, admin Secret, a refused spec),
        // Reconciling while an unreachable server is retried.
        let waiting = result.as_ref().err().is_some_and(|e| e.is_waiting());
        let (stalled, reconciling) = match (status == TRUE, waiting) {
            (true, _) => (FALSE, FALSE),
            (false, true) => (TRUE, FALSE),
            (false, false) => (FALSE, TRUE),
        };
        let old = class.status.clone().unwrap_or_default();
        let mut new = DatabaseClassStatus {
            observed_generation: class.metadata.generation,
            server_version: version.or(old.server_version.clone()),
            conditions: old.conditions.clone(),
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        for (type_, st) in [
            (REACHABLE, status),
            (common::conditions::STALLED, stalled),
            (common::conditions::RECONCILING, reconciling),
        ] {
            let (reason, message) = if st == TRUE || type_ == REACHABLE {
                (reason, message.clone())
            } else {
                (common::conditions::reasons::AS_EXPECTED, String::new())
            };
            common::conditions::set(
                &mut new.conditions,
                common::conditions::new_condition(
                    type_,
                    st,
                    reason,
                    message,
                    class.metadata.generation,
                    &now,
                ),
            );
        }
        if new.observed_generation == old.observed_generation
            && new.server_version == old.server_version
            && common::conditions::same_set_ignoring_time(&new.conditions, &old.conditions)
        {
            return;
        }
        let api: Api<DatabaseClass> = Api::all(self.client.clone());
        let patch = json!({
            "apiVersion": DatabaseClass::api_version(&()),
            "kind": DatabaseClass::kind(&()),
            "status": new,
        });
        match api
            .patch_status(
                &class.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => self.metrics.write(Written::DatabaseClassStatus),
            Err(e) => {
                warn!(error = %e, class = %class.name_any(), "could not write DatabaseClass status")
            }
        }
    }

    /// Asks the server its version when the class's status does not show it yet.
    async fn observe_class_version(&self, server: &Server, conn: &Object) {
        let class = &server.class;
        let current = class.status.as_ref().is_some_and(|s| {
            s.server_version.is_some()
                && s.observed_generation == class.metadata.generation
                && common::conditions::is_true(&s.conditions, REACHABLE)
        });
        if current {
            return;
        }
        let version = match tokio::time::timeout(
            self.op_timeout(),
            conn.query_one("SHOW server_version", &[]),
        )
        .await
        {
            Ok(Ok(row)) => row.try_get::<_, String>(0).unwrap_or_default(),
            _ => return,
        };
        self.observe_class(class, Ok(&version)).await;
    }

    async fn publish(
        &self,
        app: &AppService,
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
        crate::report::publish(&self.recorder, &self.metrics, app, &event).await;
    }

    /// `ensure` for an AppService whose database is disabled: remove what an earlier
    /// generation created (found through the credentials Secret), per the class's policy.
    async fn ensure_disabled(&self, app: &AppService) -> Result<Report> {
        let (namespace, uid) = identity(app).map_err(Error::Database)?;
        let secret_name = database_secret_name(&app.name_any());
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let absent = Report {
            outcome: Outcome::Done,
            conditions: vec![],
            absent: vec![DATABASE_READY],
            database: None,
        };
        // Only an AppService that ever mentioned a database can have one: the others
        // (most of them) cost no API request here.
        let mentioned = app.spec.database.is_some()
            || app
                .status
                .as_ref()
                .is_some_and(|s| common::conditions::find(&s.conditions, DATABASE_READY).is_some());
        if !mentioned {
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
        app: &AppService,
        started: Instant,
        reason: &'static str,
        message: String,
        action: &'static str,
    ) {
        self.metrics.database().cleaned(true, started.elapsed());
        info!(%message, action, "database removed");
        self.publish(app, EventType::Normal, reason, message, action)
            .await;
    }

    /// A removal that began at `started` failed with `e`: counted by reason.
    fn removal_failed(&self, e: &DatabaseError, started: Instant) {
        self.metrics.database().cleaned(false, started.elapsed());
        self.metrics.database().error(e.metric_label());
    }

    fn failed(&self, condition: ConditionReport, e: DatabaseError) -> Report {
        let outcome = if e.is_waiting() {
            Outcome::NotReady(WAITING_RECHECK)
        } else {
            Outcome::Failed(Error::Database(e))
        };
        Report {
            outcome,
            conditions: vec![condition],
            absent: vec![],
            database: None,
        }
    }

    async fn ensure_enabled(&self, app: &AppService, class_name: &str) -> Result<Report> {
        let started = Instant::now();
        let result = self.provision(app, class_name).await;
        self.metrics
            .database()
            .provisioned(result.is_ok(), started.elapsed());
        let report = match result {
            Ok((message, pod)) => Report {
                outcome: Outcome::Done,
                conditions: vec![ConditionReport {
                    type_: DATABASE_READY,
                    status: TRUE,
                    reason: reasons::PROVISIONED,
                    message,
                }],
                absent: vec![],
                database: Some(pod),
            },
            // API errors go to the error policy like any other (409 retried soon, ...).
            Err(DatabaseError::Kube(e)) => return Err(Error::Kube(e)),
            Err(e) => {
                self.metrics.database().error(e.metric_label());
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
        // An Event when DatabaseReady moves (status or reason).
        if let Some(new) = report.conditions.first() {
            let old = app
                .status
                .as_ref()
                .and_then(|s| common::conditions::find(&s.conditions, DATABASE_READY));
            if !old.is_some_and(|o| o.status == new.status && o.reason == new.reason) {
                let type_ = if new.status == TRUE {
                    EventType::Normal
                } else {
                    EventType::Warning
                };
                self.publish(
                    app,
                    type_,
                    new.reason,
                    new.message.clone(),
                    "ProvisionDatabase",
                )
                .await;
            }
        }
        Ok(report)
    }

    async fn cleanup_app(&self, app: &AppService) -> Result<Step> {
        let (namespace, uid) = identity(app).map_err(Error::Database)?;
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
                Err(Error::Cleanup(e))
            }
        }
    }
}

impl External for Databases {
    fn ensure<'a>(&'a self, app: &'a AppService) -> BoxFuture<'a, Result<Report>> {
        Box::pin(async move {
            match app.spec.database_class() {
                Some(class) => self.ensure_enabled(app, class).await,
                None => self.ensure_disabled(app).await,
            }
        })
    }

    fn cleanup<'a>(&'a self, app: &'a AppService) -> BoxFuture<'a, Result<Step>> {
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
    fn an_appservice_without_a_uuid_gets_no_database_name() {
        let mut app = AppService::new("shop", common::AppServiceSpec::default());
        app.metadata.namespace = Some("team".into());
        for uid in [None, Some(""), Some("not-a-uuid"), Some("0f3c2a1b-9d8e")] {
            app.metadata.uid = uid.map(str::to_owned);
            assert!(identity(&app).is_err(), "{uid:?}");
        }
        app.metadata.uid = Some("0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9".into());
        assert_eq!(
            identity(&app).ok(),
            Some((
                "team".to_owned(),
                "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9".to_owned()
            ))
        );
        app.metadata.namespace = None;
        assert!(identity(&app).is_err());
    }
}
