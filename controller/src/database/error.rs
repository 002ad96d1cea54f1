//! Why a database step did not complete, and what each failure means for status,
//! metrics and retries.

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

pub(super) type DbResult<T> = std::result::Result<T, DatabaseError>;
