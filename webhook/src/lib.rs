//! The AppService admission and conversion webhook as a library: the admission decisions
//! ([`admission`]), CRD version conversion ([`conversion`]), the CEL policies ([`policy`]), TLS with certificate reload ([`tls`]),
//! the runtime CA that keeps its own certificate and the caBundles current ([`ca`]),
//! the routes ([`routes`]) and the server that ties them together ([`server`]). The
//! binary only parses flags, sets up logging and the crypto provider, and runs
//! [`server::serve`]; tests and the benchmark use the same entry points.

pub mod admission;
pub mod appservices;
pub mod ca;
pub mod config;
pub mod conversion;
pub mod expression;
mod listener;
pub mod logging;
pub mod metrics;
pub mod namespaces;
pub mod policy;
/// `process_*` metrics and the file-descriptor limit, shared with the controller.
pub use telemetry::process;
pub mod reload;
pub mod review;
pub mod routes;
pub mod server;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use config::Config;
pub use routes::{ops_router, router};
pub use server::{Server, serve, start, start_with_client};

use appservices::AppServiceCache;
use metrics::Metrics;
use namespaces::NamespaceCache;
use policy::PolicyStore;
use tls::CertStore;

/// Errors that stop the server from starting or running. Each message carries its
/// cause; none is a `source`, so the cause is printed once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Tls(tls::TlsError),
    #[error("{0}")]
    Policy(policy::PolicyError),
    #[error("binding {addr}: {error}")]
    Bind {
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("the {0} server task failed: {1}")]
    Task(&'static str, tokio::task::JoinError),
    #[error("the operations server failed: {0}")]
    Ops(std::io::Error),
    #[error(
        "creating a Kubernetes client (for --namespace-labels, --watch-appservices or --ca-secret): {0}"
    )]
    Client(kube::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl From<tls::TlsError> for Error {
    fn from(error: tls::TlsError) -> Self {
        Error::Tls(error)
    }
}

impl From<policy::PolicyError> for Error {
    fn from(error: policy::PolicyError) -> Self {
        Error::Policy(error)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Limits applied to every admission request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Largest `/convert` body.
    pub max_convert_body_bytes: usize,
    /// Bytes of bodies held at once across requests (see [`State::body_budget`]).
    pub max_in_flight_bytes: usize,
    pub request_timeout: Duration,
    /// Longest time a client may take to send a body (waiting for budget not counted);
    /// 408 past it.
    pub body_timeout: Duration,
    /// Longest time the policies of one review may take; past it the review is denied.
    pub policy_timeout: Duration,
    /// `/mutate` and `/validate` need a client certificate (`--client-ca` is set).
    pub require_client_certificate: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: config::DEFAULT_MAX_BODY_BYTES,
            max_convert_body_bytes: config::DEFAULT_MAX_CONVERT_BODY_BYTES,
            max_in_flight_bytes: config::DEFAULT_MAX_IN_FLIGHT_BYTES,
            request_timeout: Duration::from_secs(4),
            body_timeout: Duration::from_secs(2),
            policy_timeout: Duration::from_secs(2),
            require_client_certificate: false,
        }
    }
}

/// Everything the handlers share: policies, metrics, limits, and what readiness needs.
#[derive(Debug)]
pub struct State {
    pub policies: PolicyStore,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Bytes of request bodies that may be held at once: a request takes each piece of
    /// its body as it arrives and returns it all when answered, so the memory of all
    /// reviews in progress is bounded and a client that declares a large body and stalls
    /// holds nothing (`routes::read_body`).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// Reviews whose policies are being evaluated at once, on blocking threads (one per
    /// CPU), so CEL never runs on the async workers that serve other requests.
    pub policy_slots: Arc<tokio::sync::Semaphore>,
    /// Whether the operations port serves profiles.
    pub profiling: telemetry::Profiling,
    certs: Option<Arc<CertStore>>,
    ca: Option<Arc<ca::CaStatus>>,
    namespaces: Option<NamespaceCache>,
    appservices: Option<AppServiceCache>,
    tls_accepting: AtomicBool,
    draining: AtomicBool,
}

impl State {
    /// State without a certificate (for in-process tests of the routes); never ready.
    pub fn new(policies: PolicyStore, metrics: Arc<Metrics>, limits: Limits) -> Self {
        // At least one request of the largest kind always fits.
        let budget = limits
            .max_in_flight_bytes
            .max(limits.max_body_bytes)
            .max(limits.max_convert_body_bytes);
        State {
            policies,
            metrics,
            limits,
            body_budget: Arc::new(tokio::sync::Semaphore::new(
                budget.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            policy_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            )),
            profiling: telemetry::Profiling::default(),
            certs: None,
            ca: None,
            namespaces: None,
            appservices: None,
            tls_accepting: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    fn with_certs(mut self, certs: Arc<CertStore>) -> Self {
        self.certs = Some(certs);
        self
    }

    fn with_ca(mut self, status: Arc<ca::CaStatus>) -> Self {
        self.ca = Some(status);
        self
    }

    /// Serves profiles on the operations port as `profiling` says.
    pub fn with_profiling(mut self, profiling: telemetry::Profiling) -> Self {
        self.profiling = profiling;
        self
    }

    /// Binds `namespaceObject` for policies from this cache.
    pub fn with_namespaces(mut self, namespaces: NamespaceCache) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// Judges scale writes on the AppServices of this cache.
    pub fn with_appservices(mut self, appservices: AppServiceCache) -> Self {
        self.appservices = Some(appservices);
        self
    }

    /// The AppServices scale writes are judged on, when they are watched.
    pub fn appservices(&self) -> Option<&AppServiceCache> {
        self.appservices.as_ref()
    }

    /// `namespaceObject` for a namespace, when namespace labels are watched.
    pub fn namespace_object(&self, namespace: Option<&str>) -> Option<serde_json::Value> {
        let cache = self.namespaces.as_ref()?;
        namespace.map(|name| cache.object(name))
    }

    /// `Ok` when the webhook can answer the API server: a certificate is loaded and
    /// still valid, the TLS listener accepts connections, and no drain has started.
    pub fn readiness(&self) -> std::result::Result<(), &'static str> {
        let Some(certs) = &self.certs else {
            return Err("no serving certificate loaded");
        };
        if certs.current().is_none() {
            return Err("no serving certificate issued yet");
        }
        if certs.not_after() <= jiff::Timestamp::now().as_second() {
            return Err("the serving certificate has expired");
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err("shutting down");
        }
        // The API server would refuse this certificate: not ready until every caBundle
        // holds its CA.
        if self.ca.as_ref().is_some_and(|ca| !ca.is_trusted()) {
            return Err("the serving certificate's CA is not in every caBundle yet");
        }
        if self.namespaces.as_ref().is_some_and(|n| !n.is_synced()) {
            return Err("namespace labels are not cached yet");
        }
        if self.appservices.as_ref().is_some_and(|a| !a.is_synced()) {
            return Err("AppServices are not cached yet");
        }
        if !self.tls_accepting.load(Ordering::SeqCst) {
            return Err("the TLS listener is not accepting yet");
        }
        Ok(())
    }

    /// The certificate store, when serving TLS.
    pub fn certs(&self) -> Option<&Arc<CertStore>> {
        self.certs.as_ref()
    }
}
