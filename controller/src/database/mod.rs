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
//!    "already exists" from a concurrent creator counts as success;
//! 4. clears the pending mark, and reports `DatabaseReady=True`.
//!
//! A crash between any two steps leaves a state the next reconcile completes. With the
//! database disabled, `ensure` removes what an earlier generation created, following the
//! class's `deletionPolicy`; `cleanup` does the same for a deleted AppService.

mod connect;
pub mod secret;
pub mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::conditions::{DATABASE_READY, FALSE, TRUE};
use common::database_class::REACHABLE;
use common::names::{FIELD_MANAGER, database_secret_name};
use common::{AppService, DatabaseClass, DatabaseClassStatus, DeletionPolicy};
use deadpool_postgres::{Object, Pool, PoolError};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, info_span, instrument, warn};

pub use connect::Limits;
use connect::{Credentials, Fingerprint, Pools};

use crate::desired::is_controlled_by;
use crate::error::{Error, Result};
use crate::external::{ConditionReport, External, Outcome, Report, Step};
use crate::metrics::{Metrics, Written};

/// Condition reasons of `DatabaseReady` (and of `Ready` while it is not true).
pub mod reasons {
    pub const PROVISIONED: &str = "Provisioned";
    pub const CLASS_NOT_FOUND: &str = "DatabaseClassNotFound";
    pub const ADMIN_SECRET_INVALID: &str = "AdminSecretInvalid";
    pub const CA_INVALID: &str = "DatabaseCAInvalid";
    pub const ADMIN_CREDENTIALS_REJECTED: &str = "AdminCredentialsRejected";
    pub const ADMIN_PRIVILEGE_MISSING: &str = "AdminPrivilegeMissing";
    pub const SERVER_UNREACHABLE: &str = "DatabaseServerUnreachable";
    pub const PROVISIONING_FAILED: &str = "DatabaseProvisioningFailed";
    pub const SECRET_CONFLICT: &str = "DatabaseSecretConflict";
    pub const RETAINED: &str = "DatabaseRetained";
    pub const DELETED: &str = "DatabaseDeleted";
}

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
}

/// Why a database step did not complete. Messages name objects and servers, never a
/// password or any other Secret value.
#[derive(thiserror::Error, Debug)]
pub enum DatabaseError {
    #[error("DatabaseClass {0:?} does not exist")]
    ClassNotFound(String),
    #[error("admin credentials of DatabaseClass {class:?}: {reason}")]
    AdminSecret { class: String, reason: String },
    #[error("CA of DatabaseClass {class:?}: {reason}")]
    Ca { class: String, reason: String },
    #[error(
        "the server of DatabaseClass {class:?} rejected the admin login; fix the admin credentials Secret ({detail})"
    )]
    Credentials { class: String, detail: String },
    #[error("the admin login of DatabaseClass {class:?} lacks a privilege: {detail}")]
    Privilege { class: String, detail: String },
    #[error("the server of DatabaseClass {class:?} ({address}) is unreachable: {detail}")]
    Unreachable {
        class: String,
        address: String,
        detail: String,
    },
    #[error("{what} on the server of DatabaseClass {class:?} failed: {detail}")]
    Sql {
        class: String,
        what: &'static str,
        detail: String,
    },
    #[error("Secret {0} exists and is not controlled by this AppService; it is left untouched")]
    SecretConflict(String),
    #[error("Kubernetes API request failed: {0}")]
    Kube(kube::Error),
    #[error("{0}")]
    Internal(String),
}

impl DatabaseError {
    /// What the failure means, in one table: its condition reason, its metric label, and
    /// whether it waits for an admin or a user to change something (checked again at a
    /// fixed, slow pace) rather than being a failure to back off from.
    fn meaning(&self) -> (&'static str, DatabaseErrorReason, bool) {
        use DatabaseErrorReason as M;
        match self {
            DatabaseError::ClassNotFound(_) => (reasons::CLASS_NOT_FOUND, M::ClassNotFound, true),
            DatabaseError::AdminSecret { .. } => {
                (reasons::ADMIN_SECRET_INVALID, M::AdminSecret, true)
            }
            DatabaseError::Ca { .. } => (reasons::CA_INVALID, M::Ca, true),
            DatabaseError::Credentials { .. } => {
                (reasons::ADMIN_CREDENTIALS_REJECTED, M::Credentials, true)
            }
            DatabaseError::Privilege { .. } => {
                (reasons::ADMIN_PRIVILEGE_MISSING, M::Privilege, true)
            }
            DatabaseError::SecretConflict(_) => (reasons::SECRET_CONFLICT, M::SecretConflict, true),
            DatabaseError::Unreachable { .. } => {
                (reasons::SERVER_UNREACHABLE, M::Unreachable, false)
            }
            DatabaseError::Sql { .. } => (reasons::PROVISIONING_FAILED, M::Sql, false),
            DatabaseError::Kube(_) => (reasons::PROVISIONING_FAILED, M::Kube, false),
            DatabaseError::Internal(_) => (reasons::PROVISIONING_FAILED, M::Internal, false),
        }
    }

    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        self.meaning().0
    }

    /// Waits for an admin or a user to change something rather than a failure to back
    /// off from.
    pub fn is_waiting(&self) -> bool {
        self.meaning().2
    }

    /// The message for conditions: like the error's, but without the volatile detail of
    /// an unreachable server (connection refused, reset, shutting down, ...), so that a
    /// continuing outage does not rewrite status (and wake the object) at every retry.
    /// Logs and the transition's Event carry the detail.
    pub fn condition_message(&self) -> String {
        match self {
            DatabaseError::Unreachable { class, address, .. } => format!(
                "the server of DatabaseClass {class:?} ({address}) is unreachable; retrying with backoff"
            ),
            other => other.to_string(),
        }
    }

    /// Short, fixed label for metrics.
    pub fn metric_label(&self) -> DatabaseErrorReason {
        self.meaning().1
    }
}

telemetry::label_values! {
    /// Why a database operation failed, as the `database_errors` metric counts it.
    pub enum DatabaseErrorReason {
        ClassNotFound => "class_not_found",
        AdminSecret => "admin_secret",
        Ca => "ca",
        Credentials => "credentials",
        Privilege => "privilege",
        Unreachable => "unreachable",
        Sql => "sql",
        SecretConflict => "secret_conflict",
        Kube => "kube",
        Internal => "internal",
    }
}

impl From<kube::Error> for DatabaseError {
    fn from(e: kube::Error) -> Self {
        DatabaseError::Kube(e)
    }
}

type DbResult<T> = std::result::Result<T, DatabaseError>;

/// The database step: an [`External`] over real PostgreSQL servers.
pub struct Databases {
    client: Client,
    admin_namespace: String,
    limits: Limits,
    pools: Pools,
    metrics: Arc<Metrics>,
    recorder: Recorder,
}

/// A class's server, as the messages name it.
struct Server<'a> {
    class: &'a DatabaseClass,
    name: String,
}

impl Server<'_> {
    fn address(&self) -> String {
        format!("{}:{}", self.class.spec.host, self.class.spec.port)
    }

    /// Maps a PostgreSQL error of `what` to a [`DatabaseError`].
    fn pg_error(&self, what: &'static str, e: &tokio_postgres::Error) -> DatabaseError {
        let detail = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        };
        let class = self.name.clone();
        match sql::classify(e.code()) {
            sql::Failure::Credentials => DatabaseError::Credentials { class, detail },
            sql::Failure::Privilege => DatabaseError::Privilege { class, detail },
            sql::Failure::Unavailable => DatabaseError::Unreachable {
                class,
                address: self.address(),
                detail,
            },
            sql::Failure::AlreadyExists | sql::Failure::Other => DatabaseError::Sql {
                class,
                what,
                detail,
            },
        }
    }

    fn pool_error(&self, e: PoolError) -> DatabaseError {
        match e {
            PoolError::Backend(e) => self.pg_error("login", &e),
            PoolError::Timeout(_) => DatabaseError::Unreachable {
                class: self.name.clone(),
                address: self.address(),
                detail: "timed out connecting".into(),
            },
            other => DatabaseError::Unreachable {
                class: self.name.clone(),
                address: self.address(),
                detail: other.to_string(),
            },
        }
    }
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
        }
    }

    /// Upper bound of one database operation on the client side: the server enforces
    /// `statement_timeout`, this catches a server that stopped answering altogether.
    fn op_timeout(&self) -> Duration {
        self.limits.connect_timeout + self.limits.statement_timeout + Duration::from_secs(2)
    }

    async fn class(&self, name: &str) -> DbResult<DatabaseClass> {
        let api: Api<DatabaseClass> = Api::all(self.client.clone());
        api.get_opt(name)
            .await?
            .ok_or_else(|| DatabaseError::ClassNotFound(name.to_owned()))
    }

    /// A connection to the class's server as its admin, and the class's CA (PEM).
    #[instrument(name = "db.connect", skip_all, fields(otel.kind = "client", db.system = "postgresql", server.address = %server.address()))]
    async fn connect(&self, server: &Server<'_>) -> DbResult<(Object, Option<String>)> {
        let (pool, ca_pem) = self.pool(server).await?;
        match tokio::time::timeout(self.op_timeout(), pool.get()).await {
            Ok(Ok(conn)) => Ok((conn, ca_pem)),
            Ok(Err(e)) => Err(server.pool_error(e)),
            Err(_) => Err(DatabaseError::Unreachable {
                class: server.name.clone(),
                address: server.address(),
                detail: "timed out connecting".into(),
            }),
        }
    }

    async fn pool(&self, server: &Server<'_>) -> DbResult<(Pool, Option<String>)> {
        let class = server.class;
        let admin = &class.spec.admin_credentials;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.admin_namespace);
        let admin_secret = secrets.get_opt(&admin.secret_name).await?.ok_or_else(|| {
            DatabaseError::AdminSecret {
                class: server.name.clone(),
                reason: format!(
                    "Secret {}/{} not found",
                    self.admin_namespace, admin.secret_name
                ),
            }
        })?;
        let (ca_pem, ca_version) = self.ca(server).await?;
        let fingerprint = Fingerprint {
            class_uid: class.metadata.uid.clone().unwrap_or_default(),
            class_generation: class.metadata.generation.unwrap_or_default(),
            secret_version: admin_secret
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            ca_version,
        };
        let read = |key: &str| -> DbResult<String> {
            secret::value(&admin_secret, key).ok_or_else(|| DatabaseError::AdminSecret {
                class: server.name.clone(),
                reason: format!(
                    "Secret {}/{} has no key {key:?}",
                    self.admin_namespace, admin.secret_name
                ),
            })
        };
        let pool = self.pools.get_or_build(
            class,
            fingerprint,
            || {
                Ok(Credentials {
                    username: read(admin.username_key())?,
                    password: read(admin.password_key())?,
                    ca_pem: ca_pem.clone(),
                })
            },
            self.limits,
        )?;
        Ok((pool, ca_pem))
    }

    /// The CA PEM of the class (if it names one) and the version of the object holding it.
    async fn ca(&self, server: &Server<'_>) -> DbResult<(Option<String>, String)> {
        let Some(ca) = &server.class.spec.tls.ca else {
            return Ok((None, String::new()));
        };
        let missing = |what: String| DatabaseError::Ca {
            class: server.name.clone(),
            reason: what,
        };
        let ns = &self.admin_namespace;
        if let Some(r) = &ca.secret_ref {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            let s = api
                .get_opt(&r.name)
                .await?
                .ok_or_else(|| missing(format!("Secret {ns}/{} not found", r.name)))?;
            let pem = secret::value(&s, r.key()).ok_or_else(|| {
                missing(format!("Secret {ns}/{} has no key {:?}", r.name, r.key()))
            })?;
            return Ok((Some(pem), s.metadata.resource_version.unwrap_or_default()));
        }
        if let Some(r) = &ca.config_map_ref {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
            let cm = api
                .get_opt(&r.name)
                .await?
                .ok_or_else(|| missing(format!("ConfigMap {ns}/{} not found", r.name)))?;
            let pem = cm
                .data
                .as_ref()
                .and_then(|d| d.get(r.key()))
                .cloned()
                .ok_or_else(|| {
                    missing(format!(
                        "ConfigMap {ns}/{} has no key {:?}",
                        r.name,
                        r.key()
                    ))
                })?;
            return Ok((Some(pem), cm.metadata.resource_version.unwrap_or_default()));
        }
        Ok((None, String::new()))
    }

    /// Runs one call to the server, bounded by the operation timeout. Its span names the
    /// operation, never the statement text, which may hold a password.
    #[instrument(name = "db.statement", skip_all, fields(otel.kind = "client", db.system = "postgresql", db.operation = what, server.address = %server.address()))]
    async fn bounded<T>(
        &self,
        server: &Server<'_>,
        what: &'static str,
        call: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> DbResult<Result<T, tokio_postgres::Error>> {
        tokio::time::timeout(self.op_timeout(), call)
            .await
            .map_err(|_| DatabaseError::Unreachable {
                class: server.name.clone(),
                address: server.address(),
                detail: format!("{what} did not finish in time"),
            })
    }

    /// Runs `statement`.
    async fn execute(
        &self,
        server: &Server<'_>,
        conn: &Object,
        what: &'static str,
        statement: &str,
    ) -> DbResult<()> {
        self.bounded(server, what, conn.batch_execute(statement))
            .await?
            .map_err(|e| server.pg_error(what, &e))
    }

    /// Like [`Self::execute`], with "already exists" counting as success; returns whether
    /// the statement created something.
    async fn execute_create(
        &self,
        server: &Server<'_>,
        conn: &Object,
        what: &'static str,
        statement: &str,
    ) -> DbResult<bool> {
        match self
            .bounded(server, what, conn.batch_execute(statement))
            .await?
        {
            Ok(()) => Ok(true),
            Err(e) if sql::classify(e.code()) == sql::Failure::AlreadyExists => Ok(false),
            Err(e) => Err(server.pg_error(what, &e)),
        }
    }

    /// The boolean `query` answers for `arg`.
    async fn query_bool(
        &self,
        server: &Server<'_>,
        conn: &Object,
        what: &'static str,
        query: &str,
        arg: &str,
    ) -> DbResult<bool> {
        self.bounded(server, what, conn.query_one(query, &[&arg]))
            .await?
            .and_then(|row| row.try_get::<_, bool>(0))
            .map_err(|e| server.pg_error(what, &e))
    }

    /// Provisions the database of `app` on `class_name`; returns what `DatabaseReady`
    /// should say.
    async fn provision(&self, app: &AppService, class_name: &str) -> DbResult<String> {
        let name = app.name_any();
        let namespace = app.namespace().unwrap_or_default();
        let uid = app.metadata.uid.clone().unwrap_or_default();
        let db = sql::db_name(&uid);
        let class = self.class(class_name).await?;
        let server = Server {
            class: &class,
            name: class_name.to_owned(),
        };
        let (conn, ca_pem) = match self.connect(&server).await {
            Ok(c) => c,
            Err(e) => {
                self.observe_class(&class, Err(&e)).await;
                return Err(e);
            }
        };
        self.observe_class_version(&server, &conn).await;

        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let secret_name = database_secret_name(&name);
        let live = match secrets.get_opt(&secret_name).await? {
            Some(s) => {
                if !is_controlled_by(s.metadata.owner_references.as_deref(), &uid) {
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
                    &class,
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
        // The password the Secret holds; a Secret without one (tampered) gets a new one.
        let (live, password) = match secret::value(&live, secret::PGPASSWORD) {
            Some(pw) if !pw.is_empty() => (live, pw),
            _ => {
                let pw = sql::new_password();
                let mut desired = secret::desired(app, &class, &db, &pw, true, ca_pem.as_deref())
                    .map_err(|e| DatabaseError::Internal(e.to_string()))?;
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

        if !self
            .query_bool(&server, &conn, "checking the role", sql::ROLE_EXISTS, &db)
            .await?
        {
            if !self
                .execute_create(
                    &server,
                    &conn,
                    "CREATE ROLE",
                    &sql::create_role(&db, &password),
                )
                .await?
            {
                // Someone created it a moment ago: make the Secret's password the role's.
                self.execute(
                    &server,
                    &conn,
                    "ALTER ROLE",
                    &sql::set_password(&db, &password),
                )
                .await?;
            }
        } else if pending {
            self.execute(
                &server,
                &conn,
                "ALTER ROLE",
                &sql::set_password(&db, &password),
            )
            .await?;
        }
        if !self
            .query_bool(
                &server,
                &conn,
                "checking the database",
                sql::DATABASE_EXISTS,
                &db,
            )
            .await?
            && self
                .execute_create(
                    &server,
                    &conn,
                    "CREATE DATABASE",
                    &sql::create_database(&db, &db),
                )
                .await?
        {
            let comment = format!("AppService {namespace}/{name} (uid {uid})");
            self.execute(
                &server,
                &conn,
                "COMMENT ON DATABASE",
                &sql::comment_database(&db, &comment),
            )
            .await?;
        }
        if self
            .query_bool(
                &server,
                &conn,
                "checking CONNECT",
                sql::PUBLIC_MAY_CONNECT,
                &db,
            )
            .await?
        {
            self.execute(
                &server,
                &conn,
                "REVOKE CONNECT",
                &sql::revoke_public_connect(&db),
            )
            .await?;
        }
        drop(conn);

        // The Secret's content follows the class (host, port, TLS) and its password.
        let desired = secret::desired(app, &class, &db, &password, false, ca_pem.as_deref())
            .map_err(|e| DatabaseError::Internal(e.to_string()))?;
        if pending || !secret::same_data(&live, &desired) {
            let mut desired = desired;
            desired.metadata.resource_version = live.metadata.resource_version.clone();
            // resourceVersion as precondition: if someone replaced the Secret meanwhile,
            // this fails (409) and the next reconcile starts from their version.
            secrets
                .replace(&secret_name, &PostParams::default(), &desired)
                .await?;
            self.metrics.write(Written::Secrets);
        }
        Ok(format!(
            "database {db} on {} (DatabaseClass {class_name}); credentials in Secret {secret_name}",
            server.address()
        ))
    }

    /// Removes the database of `app` on `class_name` as the class's policy says.
    /// Returns the Event reason and message describing what happened.
    async fn remove(&self, app: &AppService, class_name: &str) -> DbResult<(&'static str, String)> {
        let uid = app.metadata.uid.clone().unwrap_or_default();
        let db = sql::db_name(&uid);
        let class = self.class(class_name).await?;
        let server = Server {
            class: &class,
            name: class_name.to_owned(),
        };
        if class.spec.deletion_policy == DeletionPolicy::Retain {
            return Ok((
                reasons::RETAINED,
                format!(
                    "database and role {db} kept on {} (DatabaseClass {class_name} has deletionPolicy Retain)",
                    server.address()
                ),
            ));
        }
        let conn = match self.connect(&server).await {
            Ok((conn, _)) => conn,
            Err(e) => {
                self.observe_class(&class, Err(&e)).await;
                return Err(e);
            }
        };
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
        self.execute(&server, &conn, "DROP DATABASE", &sql::drop_database(&db))
            .await?;
        self.execute(&server, &conn, "DROP ROLE", &sql::drop_role(&db))
            .await?;
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
            Err(
                e @ (DatabaseError::Unreachable { .. }
                | DatabaseError::Credentials { .. }
                | DatabaseError::Ca { .. }
                | DatabaseError::AdminSecret { .. }),
            ) => (FALSE, e.reason(), e.to_string(), None),
            Err(_) => return,
        };
        let old = class.status.clone().unwrap_or_default();
        let mut new = DatabaseClassStatus {
            observed_generation: class.metadata.generation,
            server_version: version.or(old.server_version.clone()),
            conditions: old.conditions.clone(),
        };
        common::conditions::set(
            &mut new.conditions,
            common::conditions::new_condition(
                REACHABLE,
                status,
                reason,
                message,
                class.metadata.generation,
                &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
            ),
        );
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
    async fn observe_class_version(&self, server: &Server<'_>, conn: &Object) {
        let class = server.class;
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
        match self.recorder.publish(&event, &app.object_ref(&())).await {
            Ok(()) => self.metrics.write(Written::Events),
            Err(e) => warn!(error = %e, "could not publish event"),
        }
    }

    /// `ensure` for an AppService whose database is disabled: remove what an earlier
    /// generation created (found through the credentials Secret), per the class's policy.
    async fn ensure_disabled(&self, app: &AppService) -> Result<Report> {
        let namespace = app.namespace().unwrap_or_default();
        let uid = app.metadata.uid.clone().unwrap_or_default();
        let secret_name = database_secret_name(&app.name_any());
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let absent = Report {
            outcome: Outcome::Done,
            conditions: vec![],
            absent: vec![DATABASE_READY],
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
        if !is_controlled_by(live.metadata.owner_references.as_deref(), &uid) {
            return Ok(absent);
        }
        let class_name = live.annotations().get(CLASS_ANNOTATION).cloned();
        if let Some(class_name) = class_name {
            let started = Instant::now();
            match self.remove(app, &class_name).await {
                Ok((reason, message)) => {
                    self.metrics.database().cleaned(true, started.elapsed());
                    info!(%message, "database disabled");
                    self.publish(app, EventType::Normal, reason, message, "DisableDatabase")
                        .await;
                }
                Err(DatabaseError::Kube(e)) => return Err(Error::Kube(e)),
                Err(e) => {
                    self.metrics.database().cleaned(false, started.elapsed());
                    self.metrics.database().error(e.metric_label());
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
        }
    }

    async fn ensure_enabled(&self, app: &AppService, class_name: &str) -> Result<Report> {
        let started = Instant::now();
        let result = self.provision(app, class_name).await;
        self.metrics
            .database()
            .provisioned(result.is_ok(), started.elapsed());
        let report = match result {
            Ok(message) => Report {
                outcome: Outcome::Done,
                conditions: vec![ConditionReport {
                    type_: DATABASE_READY,
                    status: TRUE,
                    reason: reasons::PROVISIONED,
                    message,
                }],
                absent: vec![],
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
                if let DatabaseError::Unreachable { .. } = e {
                    warn!(error = %e, "database server unreachable");
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
        let namespace = app.namespace().unwrap_or_default();
        let secret_name = database_secret_name(&app.name_any());
        let uid = app.metadata.uid.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let secret = secrets
            .get_opt(&secret_name)
            .await?
            .filter(|s| is_controlled_by(s.metadata.owner_references.as_deref(), &uid));
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
                self.metrics.database().cleaned(true, started.elapsed());
                info!(%message, "database cleanup done");
                self.publish(app, EventType::Normal, reason, message, "Cleanup")
                    .await;
                Ok(Step::Done)
            }
            // Nothing was ever created without the Secret existing first (see
            // `provision`): with neither the class nor the Secret, there is nothing to drop.
            Err(DatabaseError::ClassNotFound(_)) if secret.is_none() => Ok(Step::Done),
            Err(DatabaseError::Kube(e)) => Err(Error::Kube(e)),
            Err(e) => {
                self.metrics.database().cleaned(false, started.elapsed());
                self.metrics.database().error(e.metric_label());
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
}
