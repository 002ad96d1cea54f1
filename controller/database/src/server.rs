//! Talking to a DatabaseClass's server: the class and its credentials, pooled
//! connections, and SQL calls bounded by the operation timeout, each a span.

use std::time::Duration;

use common::DatabaseClass;
use deadpool_postgres::{Object, Pool, PoolError};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use tracing::instrument;

use super::connect::{Credentials, Fingerprint};
use super::error::DbResult;
use super::{DatabaseError, Databases, secret, sql};

/// A class's server, as the messages name it.
pub(super) struct Server {
    pub(super) class: DatabaseClass,
    pub(super) name: String,
}

impl Server {
    pub(super) fn address(&self) -> String {
        format!("{}:{}", self.class.spec.host, self.class.spec.port)
    }

    /// Maps a PostgreSQL error of `what` to a [`DatabaseError`].
    pub(super) fn pg_error(&self, what: &'static str, e: &tokio_postgres::Error) -> DatabaseError {
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
                code: e.code().map(|c| c.code().to_owned()),
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
    /// Upper bound of one database operation on the client side: the server enforces
    /// `statement_timeout`, this catches a server that stopped answering altogether.
    pub(super) fn op_timeout(&self) -> Duration {
        self.limits.connect_timeout + self.limits.statement_timeout + Duration::from_secs(2)
    }

    /// The server of the DatabaseClass `name`, if the class passes the rules of
    /// `common::database_class` (a refused class is recorded on its status).
    pub(super) async fn server(&self, name: &str) -> DbResult<Server> {
        let api: Api<DatabaseClass> = Api::all(self.client.clone());
        let class = api
            .get_opt(name)
            .await?
            .ok_or_else(|| DatabaseError::ClassNotFound(name.to_owned()))?;
        if let Some(reason) = common::database_class::refusal(&class.spec) {
            let e = DatabaseError::ClassRefused {
                class: name.to_owned(),
                reason,
            };
            self.observe_class(&class, Err(&e)).await;
            return Err(e);
        }
        Ok(Server {
            class,
            name: name.to_owned(),
        })
    }

    /// Whether AppServices of `namespace` may use the class (reading the namespace's
    /// labels only when the class's selector must see them).
    pub(super) async fn check_namespace(&self, server: &Server, namespace: &str) -> DbResult<()> {
        let class = &server.class;
        let labels = match &class.spec.allowed_namespaces {
            Some(allowed) if allowed.needs_labels(namespace) => {
                let api: Api<Namespace> = Api::all(self.client.clone());
                api.get_metadata_opt(namespace)
                    .await?
                    .and_then(|n| n.metadata.labels)
            }
            _ => None,
        };
        if class.allows_namespace(namespace, labels.as_ref()) {
            Ok(())
        } else {
            Err(DatabaseError::NamespaceNotAllowed {
                class: server.name.clone(),
                namespace: namespace.to_owned(),
            })
        }
    }

    /// A connection to the class's server as its admin, and the class's CA (PEM).
    #[instrument(name = "db.connect", skip_all, fields(otel.kind = "client", db.system = "postgresql", server.address = %server.address()))]
    pub(super) async fn connect(&self, server: &Server) -> DbResult<(Object, Option<String>)> {
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

    pub(super) async fn pool(&self, server: &Server) -> DbResult<(Pool, Option<String>)> {
        let class = &server.class;
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
        // Only a Secret someone marked for it may be sent to a class's server as its
        // login: naming a Secret in a class is not enough.
        if !common::database_class::admin_secret_opted_in(admin_secret.metadata.labels.as_ref()) {
            return Err(DatabaseError::AdminSecretNotOptedIn {
                class: server.name.clone(),
                secret: format!("{}/{}", self.admin_namespace, admin.secret_name),
            });
        }
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
    pub(super) async fn ca(&self, server: &Server) -> DbResult<(Option<String>, String)> {
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

    /// A session on `server` over `conn`: its calls are bounded by the operation timeout.
    pub(super) fn session<'a>(&self, server: &'a Server, conn: &'a Object) -> Session<'a> {
        Session {
            server,
            conn,
            timeout: self.op_timeout(),
        }
    }
}

/// Statements on one connection to a class's server.
pub(super) struct Session<'a> {
    server: &'a Server,
    conn: &'a Object,
    timeout: Duration,
}

impl Session<'_> {
    /// Runs one call to the server, bounded by the operation timeout. Its span names the
    /// operation, never the statement text, which may hold a password.
    #[instrument(name = "db.statement", skip_all, fields(otel.kind = "client", db.system = "postgresql", db.operation = what, server.address = %self.server.address()))]
    async fn bounded<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> DbResult<Result<T, tokio_postgres::Error>> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| DatabaseError::Unreachable {
                class: self.server.name.clone(),
                address: self.server.address(),
                detail: format!("{what} did not finish in time"),
            })
    }

    /// Runs `statement`.
    pub(super) async fn execute(&self, what: &'static str, statement: &str) -> DbResult<()> {
        self.bounded(what, self.conn.batch_execute(statement))
            .await?
            .map_err(|e| self.server.pg_error(what, &e))
    }

    /// Like [`Self::execute`], with "already exists" counting as success; returns whether
    /// the statement created something.
    pub(super) async fn execute_create(
        &self,
        what: &'static str,
        statement: &str,
    ) -> DbResult<bool> {
        match self
            .bounded(what, self.conn.batch_execute(statement))
            .await?
        {
            Ok(()) => Ok(true),
            Err(e) if sql::classify(e.code()) == sql::Failure::AlreadyExists => Ok(false),
            Err(e) => Err(self.server.pg_error(what, &e)),
        }
    }

    /// The row `query` answers for `arg`, if any.
    pub(super) async fn query_opt(
        &self,
        what: &'static str,
        query: &str,
        arg: &str,
    ) -> DbResult<Option<tokio_postgres::Row>> {
        self.bounded(what, self.conn.query_opt(query, &[&arg]))
            .await?
            .map_err(|e| self.server.pg_error(what, &e))
    }

    /// Every row `query` answers for `arg`.
    pub(super) async fn query(
        &self,
        what: &'static str,
        query: &str,
        arg: &(dyn tokio_postgres::types::ToSql + Sync),
    ) -> DbResult<Vec<tokio_postgres::Row>> {
        self.bounded(what, self.conn.query(query, &[arg]))
            .await?
            .map_err(|e| self.server.pg_error(what, &e))
    }

    /// The boolean `query` answers for `arg`.
    pub(super) async fn query_bool(
        &self,
        what: &'static str,
        query: &str,
        arg: &str,
    ) -> DbResult<bool> {
        self.bounded(what, self.conn.query_one(query, &[&arg]))
            .await?
            .and_then(|row| row.try_get::<_, bool>(0))
            .map_err(|e| self.server.pg_error(what, &e))
    }
}
