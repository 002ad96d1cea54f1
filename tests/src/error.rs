//! The harness's error type: every failure says what it was waiting for and, for a
//! component that did not start, where its log is and how it ends.

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the test harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control-plane binaries are missing and could not be built.
    #[error("test assets: {0}")]
    Assets(String),

    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

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
    Certs(#[from] certs::Error),

    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },

    /// Something did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what} (logs: {})", log_dir.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log_dir: PathBuf,
    },

    /// A CRD file could not be read or parsed.
    #[error("CRD {}: {reason}", path.display())]
    Crd { path: PathBuf, reason: String },

    /// The shared control plane of this test binary failed to start earlier; the first
    /// failure is repeated so that every test reports it without retrying for minutes.
    #[error("the shared control plane failed to start (first failure, not retried): {0}")]
    Shared(String),

    /// A PostgreSQL operation of the harness failed.
    #[error("PostgreSQL: {0}")]
    Postgres(String),

    /// Building a client configuration failed.
    #[error("client configuration: {0}")]
    Config(String),
}

/// `Result` with the harness's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

impl From<kube::Error> for Error {
    fn from(source: kube::Error) -> Self {
        Error::Kube {
            what: "API call".to_owned(),
            source,
        }
    }
}
