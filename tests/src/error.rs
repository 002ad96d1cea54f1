//! The harness's error type: every failure says what it was waiting for and, for a
//! component that did not start, where its log is and how it ends. A message includes
//! its cause, so no field is a `#[source]`: the cause is printed exactly once.

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the test harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control-plane binaries are missing and could not be built.
    #[error("test assets: {0}")]
    Assets(String),

    /// A file or process operation failed.
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },

    /// A component exited or never became ready.
    #[error(
        "{component} did not start: {reason}\n  log: {}\n  all logs: {}\n--- last lines of {component}'s log ---\n{tail}",
        log.display(),
        log_dir.display()
    )]
    Startup {
        component: String,
        reason: String,
        log: PathBuf,
        log_dir: PathBuf,
        tail: String,
    },

    /// Generating certificates failed.
    #[error("certificates: {0}")]
    Certs(certs::Error),

    /// A call to the API server failed.
    #[error("{what}: {error}")]
    Kube { what: String, error: kube::Error },

    /// Something did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what} (logs: {})", log_dir.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log_dir: PathBuf,
    },

    /// A condition a test waited for with [`crate::eventually`] did not hold in time.
    #[error(
        "timed out after {timeout:?} waiting for {what}{}",
        last.as_ref().map(|l| format!("; last failure: {l}")).unwrap_or_default()
    )]
    GaveUp {
        what: String,
        timeout: Duration,
        last: Option<String>,
    },

    /// A CRD file could not be read or parsed.
    #[error("CRD {}: {reason}", path.display())]
    Crd { path: PathBuf, reason: String },

    /// The chart's webhook rules could not be parsed.
    #[error("webhook rules {}: {reason}", path.display())]
    WebhookRules { path: PathBuf, reason: String },

    /// The shared control plane of this test binary failed to start earlier; the first
    /// failure is repeated so that every test reports it without retrying for minutes.
    #[error("the shared control plane failed to start (first failure, not retried): {0}")]
    Shared(String),

    /// A binary under test did not start or log what was expected.
    #[error("binary under test: {0}")]
    Binary(String),

    /// A profile a binary served is not what `go tool pprof` reads.
    #[error("profile: {0}")]
    Profile(String),

    /// A PostgreSQL operation of the harness failed.
    #[error("PostgreSQL: {0}")]
    Postgres(String),

    /// What a Pod would get could not be resolved (a missing object or key that is not
    /// optional, something the pod view does not simulate).
    #[error("pod view: {0}")]
    PodView(String),

    /// The test OCI registry, crane or cosign failed (the message names the command and
    /// what it printed).
    #[error("registry: {0}")]
    Registry(String),

    /// The real node could not start or answer (the message names what is missing and
    /// how to get it).
    #[error("real node: {0}")]
    Node(String),

    /// Building a client configuration failed.
    #[error("client configuration: {0}")]
    Config(String),
}

/// `Result` with the harness's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |error| Error::Io { what, error }
}

pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |error| Error::Kube { what, error }
}

impl From<kube::Error> for Error {
    fn from(error: kube::Error) -> Self {
        Error::Kube {
            what: "API call".to_owned(),
            error,
        }
    }
}

impl From<certs::Error> for Error {
    fn from(error: certs::Error) -> Self {
        Error::Certs(error)
    }
}
