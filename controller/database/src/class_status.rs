//! The DatabaseClass's status: whether the controller could log in to its server, the
//! server's version, and the status contract (Stalled, Reconciling) kstatus reads.

use common::conditions::{FALSE, TRUE};
use common::database_class::REACHABLE;
use common::{DatabaseClass, DatabaseClassStatus};
use deadpool_postgres::Object;
use kube::{Api, ResourceExt};
use tracing::warn;

use super::server::Server;
use super::{DatabaseError, Databases};
use controller_core::metrics::Written;
use controller_core::status_writer::{Guard, apply_status};

impl Databases {
    /// Records on the class whether its server could be reached (only when that changed).
    pub(super) async fn observe_class(
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
        let now = self.clock.now();
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
        if let Err(e) = apply_status(
            &api,
            class,
            &new,
            Guard::None,
            &[],
            &self.metrics,
            Written::DatabaseClassStatus,
        )
        .await
        {
            warn!(error = %e, class = %class.name_any(), "could not write DatabaseClass status")
        }
    }

    /// Asks the server its version when the class's status does not show it yet.
    pub(super) async fn observe_class_version(&self, server: &Server, conn: &Object) {
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
}
