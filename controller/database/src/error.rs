//! Why a database step did not complete, and what each failure means for status,
//! metrics and retries.

use controller_core::error::{Error, ErrorReason};

/// Condition reasons of `DatabaseReady` (and of `Ready` while it is not true).
pub mod reasons {
    pub const PROVISIONED: &str = "Provisioned";
    pub const CLASS_NOT_FOUND: &str = "DatabaseClassNotFound";
    pub const ADMIN_SECRET_INVALID: &str = "AdminSecretInvalid";
    pub const ADMIN_SECRET_NOT_OPTED_IN: &str = "AdminSecretNotOptedIn";
    pub const CLASS_REFUSED: &str = "DatabaseClassRefused";
    pub const NAMESPACE_NOT_ALLOWED: &str = "DatabaseClassNotAllowed";
    pub const CA_INVALID: &str = "DatabaseCAInvalid";
    pub const ADMIN_CREDENTIALS_REJECTED: &str = "AdminCredentialsRejected";
    pub const ADMIN_PRIVILEGE_MISSING: &str = "AdminPrivilegeMissing";
    pub const SERVER_UNREACHABLE: &str = "DatabaseServerUnreachable";
    pub const PROVISIONING_FAILED: &str = "DatabaseProvisioningFailed";
    pub const SECRET_CONFLICT: &str = "DatabaseSecretConflict";
    pub const RETAINED: &str = "DatabaseRetained";
    pub const DELETED: &str = "DatabaseDeleted";
}

/// Why a database step did not complete. Messages name objects and servers, never a
/// password or any other Secret value. The message ([`std::fmt::Display`]) is for the
/// operator's logs and the DatabaseClass's status, and may name the admin Secret and
/// the server's words (which can name the admin user); what tenants see is
/// [`DatabaseError::condition_message`], which names neither.
#[derive(thiserror::Error, Debug)]
pub enum DatabaseError {
    #[error("DatabaseClass {0:?} does not exist")]
    ClassNotFound(String),
    #[error("admin credentials of DatabaseClass {class:?}: {reason}")]
    AdminSecret { class: String, reason: String },
    #[error(
        "admin credentials of DatabaseClass {class:?}: Secret {secret} does not carry the label {label}=\"true\", so no DatabaseClass may use it",
        label = common::database_class::ADMIN_SECRET_LABEL
    )]
    AdminSecretNotOptedIn { class: String, secret: String },
    #[error("DatabaseClass {class:?} is refused: {reason}")]
    ClassRefused { class: String, reason: String },
    #[error(
        "DatabaseClass {class:?} may not be used from namespace {namespace:?} (its spec.allowedNamespaces); ask a cluster admin, or choose another class"
    )]
    NamespaceNotAllowed { class: String, namespace: String },
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
        /// The SQLSTATE, when the server answered.
        code: Option<String>,
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
            DatabaseError::AdminSecretNotOptedIn { .. } => {
                (reasons::ADMIN_SECRET_NOT_OPTED_IN, M::AdminSecret, true)
            }
            DatabaseError::ClassRefused { .. } => (reasons::CLASS_REFUSED, M::ClassRefused, true),
            DatabaseError::NamespaceNotAllowed { .. } => {
                (reasons::NAMESPACE_NOT_ALLOWED, M::NamespaceNotAllowed, true)
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

    /// The message tenants see (the AppService's conditions and Events): it names the
    /// class, the server's address and the tenant's own objects, never the admin
    /// Secret, the admin user or the server's words about them; a problem of the class
    /// itself says that a cluster admin must act, and the detail is on the class's
    /// status and in the operator's logs. It also leaves out the volatile detail of an
    /// unreachable server (connection refused, reset, shutting down, ...), so that a
    /// continuing outage does not rewrite status (and wake the object) at every retry.
    pub fn condition_message(&self) -> String {
        let admin_must_fix = |class: &str, what: &str| {
            format!(
                "DatabaseClass {class:?} is not usable: {what}; a cluster admin must fix the class (see its status and the operator's logs)"
            )
        };
        match self {
            DatabaseError::Unreachable { class, address, .. } => format!(
                "the server of DatabaseClass {class:?} ({address}) is unreachable; retrying with backoff"
            ),
            DatabaseError::AdminSecret { class, .. } => {
                admin_must_fix(class, "its admin credentials cannot be read")
            }
            DatabaseError::AdminSecretNotOptedIn { class, .. } => admin_must_fix(
                class,
                "its admin credentials are not approved for use by DatabaseClasses",
            ),
            DatabaseError::Ca { class, .. } => {
                admin_must_fix(class, "its CA certificate cannot be used")
            }
            DatabaseError::Credentials { class, .. } => {
                admin_must_fix(class, "the server rejected the admin login")
            }
            DatabaseError::Privilege { class, .. } => admin_must_fix(
                class,
                "its admin login lacks a privilege (CREATEROLE, CREATEDB)",
            ),
            DatabaseError::ClassRefused { class, reason } => admin_must_fix(class, reason),
            DatabaseError::Sql {
                class, what, code, ..
            } => format!(
                "{what} on the server of DatabaseClass {class:?} failed (SQLSTATE {}); the operator's logs have the detail",
                code.as_deref().unwrap_or("none")
            ),
            DatabaseError::ClassNotFound(_)
            | DatabaseError::NamespaceNotAllowed { .. }
            | DatabaseError::SecretConflict(_)
            | DatabaseError::Kube(_)
            | DatabaseError::Internal(_) => self.to_string(),
        }
    }

    /// Whether the failure is the class's (its spec, admin Secret, CA or server), which
    /// the class's `Reachable` condition reports to admins.
    pub fn is_class_level(&self) -> bool {
        matches!(
            self,
            DatabaseError::Unreachable { .. }
                | DatabaseError::Credentials { .. }
                | DatabaseError::Ca { .. }
                | DatabaseError::AdminSecret { .. }
                | DatabaseError::AdminSecretNotOptedIn { .. }
                | DatabaseError::ClassRefused { .. }
                | DatabaseError::Privilege { .. }
        )
    }

    /// Short, fixed label for metrics.
    pub fn metric_label(&self) -> DatabaseErrorReason {
        self.meaning().1
    }

    /// The controller's error for a failed `ensure`: backed off from, counted as
    /// `database`, its message the whole story (for the operator's logs).
    pub fn into_ensure_error(self) -> Error {
        Error::External {
            reason: ErrorReason::Database,
            message: format!("database: {self}"),
        }
    }

    /// The controller's error for a failed `cleanup`: counted as `cleanup`; its message
    /// becomes the Degraded condition's, so it is the tenant's message
    /// ([`DatabaseError::condition_message`]), without what changes at every retry.
    pub fn into_cleanup_error(self) -> Error {
        Error::External {
            reason: ErrorReason::Cleanup,
            message: format!("database cleanup: {}", self.condition_message()),
        }
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
        ClassRefused => "class_refused",
        NamespaceNotAllowed => "namespace_not_allowed",
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

pub(super) type DbResult<T> = std::result::Result<T, DatabaseError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every failure's tenant message, with the admin Secret's name and the admin
    /// user in every field they could reach.
    #[test]
    fn tenant_messages_name_neither_the_admin_secret_nor_the_admin_user() {
        let secret = "ops/pg-admin-secret";
        let user = "pg_superuser_name";
        let detail =
            format!("28P01: password authentication failed for user \"{user}\" ({secret})");
        let class = || "shared".to_owned();
        let all = [
            DatabaseError::AdminSecret {
                class: class(),
                reason: format!("Secret {secret} not found"),
            },
            DatabaseError::AdminSecretNotOptedIn {
                class: class(),
                secret: secret.to_owned(),
            },
            DatabaseError::Ca {
                class: class(),
                reason: format!("Secret {secret} has no key"),
            },
            DatabaseError::Credentials {
                class: class(),
                detail: detail.clone(),
            },
            DatabaseError::Privilege {
                class: class(),
                detail: detail.clone(),
            },
            DatabaseError::Unreachable {
                class: class(),
                address: "db:5432".into(),
                detail: format!("53300: too many connections for role \"{user}\""),
            },
            DatabaseError::Sql {
                class: class(),
                what: "CREATE ROLE",
                code: Some("42501".into()),
                detail: detail.clone(),
            },
        ];
        for e in all {
            let message = e.condition_message();
            assert!(
                !message.contains(secret) && !message.contains("pg-admin-secret"),
                "{message}"
            );
            assert!(!message.contains(user), "{message}");
            assert!(message.contains("\"shared\""), "names the class: {message}");
            assert!(e.is_class_level() || matches!(e, DatabaseError::Sql { .. }));
            // The full story stays available to admins.
            assert!(e.to_string().contains("shared"));
        }
    }

    #[test]
    fn refusals_wait_for_an_admin() {
        let refused = DatabaseError::ClassRefused {
            class: "c".into(),
            reason: "tls.mode is disable".into(),
        };
        assert!(refused.is_waiting());
        assert_eq!(refused.reason(), reasons::CLASS_REFUSED);
        assert!(refused.condition_message().contains("tls.mode is disable"));
        let elsewhere = DatabaseError::NamespaceNotAllowed {
            class: "c".into(),
            namespace: "team-b".into(),
        };
        assert!(elsewhere.is_waiting());
        assert!(!elsewhere.is_class_level());
        assert_eq!(elsewhere.reason(), reasons::NAMESPACE_NOT_ALLOWED);
        assert!(elsewhere.condition_message().contains("\"team-b\""));
    }
}
