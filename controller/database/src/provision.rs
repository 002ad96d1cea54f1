//! Provisioning and removing one AppService's role and database on its class's server,
//! and the credentials Secret that goes with them.

use common::{AppService, DeletionPolicy};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::{Instrument, info, info_span};

use super::error::DbResult;
use super::{
    DatabaseError, Databases, PASSWORD_PENDING_ANNOTATION, identity, reasons, secret, sql,
};
use crate::pod::PodDatabase;
use common::names::database_secret_name;
use controller_core::metrics::Written;
use controller_core::subject::Subject;

impl Databases {
    /// Provisions the database of `app` on `class_name`; returns what `DatabaseReady`
    /// should say, and what the Pods get from the Secret.
    pub(super) async fn provision(
        &self,
        app: &Subject<'_>,
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
                );
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
                let mut desired = secret::desired(app, class, &db, &pw, true, ca_pem.as_deref());
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
        let desired = secret::desired(app, class, &db, &password, false, ca_pem.as_deref());
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
    pub(super) async fn remove(
        &self,
        app: &Subject<'_>,
        class_name: &str,
    ) -> DbResult<(&'static str, String)> {
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
}
