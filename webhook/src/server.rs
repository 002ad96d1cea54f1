//! The server: binds the TLS and operations listeners, starts the file watchers, serves
//! until told to stop, then drains.
//!
//! Every resource of the TLS listener is bounded ([`crate::listener`]), and per request
//! the body size, the in-flight body budget and the request timeout ([`crate::routes`]).
//!
//! The operations port runs on its own thread and single-threaded runtime, so `/healthz`,
//! `/readyz` and `/metrics` answer even when every admission worker is busy.
//!
//! Shutdown order: readiness turns false while everything keeps serving for the shutdown
//! delay (so endpoints drop the Pod first), then the TLS listener stops accepting, every
//! open connection is asked to finish its in-flight requests (HTTP/1 closes after the
//! current response or at the header timeout, HTTP/2 sends GOAWAY), and after they are
//! done, or after the shutdown timeout, the rest are closed and the operations server
//! stops too.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::appservices::AppServiceCache;
use crate::listener::{ListenerLimits, http_builder, serve_tls};
use crate::metrics::{Metrics, ReloadResult};
use crate::namespaces::NamespaceCache;
use crate::policy::{PolicyStore, Reload};
use crate::tls::{self, CertStore};
use crate::{Config, Error, Limits, Result, State, process, reload, routes};

/// A running webhook.
#[derive(Debug)]
pub struct Server {
    tls_addr: SocketAddr,
    ops_addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
    shutdown_delay: Duration,
    tls_task: JoinHandle<()>,
    ops_done: oneshot::Receiver<std::io::Result<()>>,
    reloaders: Vec<JoinHandle<()>>,
}

/// Loads certificate and policies, binds both listeners and starts serving. Fails when
/// the certificate or the policy file cannot be loaded or a port cannot be bound. With
/// `--namespace-labels`, `--watch-appservices` or `--ca-secret` the Kubernetes client
/// comes from the environment (in-cluster or kubeconfig).
pub async fn start(config: &Config) -> Result<Server> {
    let client = if config.namespace_labels || config.watch_appservices || config.ca().is_some() {
        let mut kube_config = kube::Config::infer()
            .await
            .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
        // The API server's audit log and metrics tell our requests by it.
        let agent = format!(
            "appservice-webhook/{} ({}/{})",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        if let Ok(agent) = http::HeaderValue::from_str(&agent) {
            kube_config.headers.push((http::header::USER_AGENT, agent));
        }
        Some(kube::Client::try_from(kube_config).map_err(Error::Client)?)
    } else {
        None
    };
    start_with_client(config, client).await
}

/// [`start`] with an explicit client for the namespace-label and AppService watches and
/// the runtime CA (used when `config.namespace_labels`, `config.watch_appservices` or
/// `config.ca_secret` is set; ignored otherwise).
pub async fn start_with_client(config: &Config, client: Option<kube::Client>) -> Result<Server> {
    let metrics = Arc::new(Metrics::new());
    let ca = config.ca();
    if let Some(ca) = &ca
        && ca.sans.is_empty()
    {
        return Err(Error::Config(
            "--ca-secret needs --tls-sans, the names the API server calls the webhook by".into(),
        ));
    }
    // With a runtime CA the certificate is issued in memory; else it comes from files.
    let certs = Arc::new(match &ca {
        Some(_) => CertStore::empty(metrics.clone()),
        None => CertStore::load(
            config.tls_cert.clone(),
            config.tls_key.clone(),
            metrics.clone(),
        )?,
    });
    let policies = match &config.policies {
        Some(path) => {
            let store = PolicyStore::load(path.clone(), config.namespace_labels)?;
            let count = store.current().len();
            metrics.policy_reload(ReloadResult::Success, count);
            tracing::info!(policies = count, path = %path.display(), "policies loaded");
            store
        }
        None => PolicyStore::empty(),
    };
    let limits = Limits {
        max_body_bytes: config.max_body_bytes,
        max_convert_body_bytes: config.max_convert_body_bytes,
        max_in_flight_bytes: config.max_in_flight_bytes,
        request_timeout: config.request_timeout,
        body_timeout: config.body_timeout,
        policy_timeout: config.policy_timeout,
        require_client_certificate: config.client_ca.is_some(),
    };
    let fd_limit = process::raise_fd_limit();
    let max_connections = process::connection_cap(config.max_connections, fd_limit);
    if max_connections < config.max_connections {
        tracing::warn!(
            requested = config.max_connections,
            max_connections,
            fd_limit,
            "connection cap lowered to stay below the file-descriptor limit"
        );
    }
    let listener_limits = ListenerLimits {
        max_connections,
        max_connections_per_peer: config.max_connections_per_peer,
        handshake_timeout: config.tls_handshake_timeout,
        idle_timeout: config.idle_timeout,
        drain_timeout: config.shutdown_timeout,
    };
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut reloaders = Vec::new();
    let mut state = State::new(policies, metrics, limits)
        .with_certs(certs.clone())
        .with_profiling(config.profiling());
    if let (true, Some(client)) = (config.namespace_labels, &client) {
        let (cache, task) = NamespaceCache::spawn(client.clone(), shutdown_rx.clone());
        state = state.with_namespaces(cache);
        reloaders.push(task);
    }
    if let (true, Some(client)) = (config.watch_appservices, &client) {
        let (cache, task) = AppServiceCache::spawn(
            client.clone(),
            config.appservice_cache_bytes,
            shutdown_rx.clone(),
        );
        state = state.with_appservices(cache);
        reloaders.push(task);
    }
    if let Some(ca) = ca {
        let client = client
            .ok_or_else(|| Error::Config("--ca-secret needs a Kubernetes client".to_owned()))?;
        tracing::info!(secret = %ca.secret, namespace = %ca.namespace, targets = ca.targets.len(), "keeping the webhook CA and caBundles current");
        let (status, task) = crate::ca::spawn(
            client,
            ca,
            certs.clone(),
            state.metrics.clone(),
            shutdown_rx.clone(),
        );
        state = state.with_ca(status);
        reloaders.push(task);
    }
    let state = Arc::new(state);
    let acceptor = TlsAcceptor::from(tls::server_config(
        certs.clone(),
        config.client_ca.as_deref(),
    )?);
    if let Some(path) = &config.client_ca {
        tracing::info!(client_ca = %path.display(), "admission requests need a client certificate of this CA");
    }

    // Both with SO_REUSEADDR (`telemetry::ops::bind`): a restart right after a crash
    // binds again while the ports have connections in TIME-WAIT.
    let tls_listener = bind(config.listen)?;
    // The operations port is served by its own runtime: moved there as a std listener.
    let ops_listener = bind(config.ops_listen)?
        .into_std()
        .map_err(|error| Error::Bind {
            addr: config.ops_listen,
            error,
        })?;
    let tls_addr = tls_listener.local_addr().map_err(|error| Error::Bind {
        addr: config.listen,
        error,
    })?;
    let ops_addr = ops_listener.local_addr().map_err(|error| Error::Bind {
        addr: config.ops_listen,
        error,
    })?;

    if let Some(paths) = certs.paths().map(|p| p.map(ToOwned::to_owned)) {
        let certs = certs.clone();
        reloaders.push(reload::spawn(
            "certificate",
            &[&paths[0], &paths[1]],
            config.reload_interval,
            shutdown_rx.clone(),
            move || certs.reload_and_log(),
        ));
    }
    if let Some(path) = state.policies.path().map(ToOwned::to_owned) {
        let reload_state = state.clone();
        reloaders.push(reload::spawn(
            "policies",
            &[&path],
            config.reload_interval,
            shutdown_rx.clone(),
            move || reload_policies(&reload_state),
        ));
    }

    // The operations port outlives the drain so /readyz can report it.
    let (ops_stop, ops_stop_rx) = watch::channel(false);
    let ops_done = spawn_ops(ops_listener, routes::ops_router(state.clone()), ops_stop_rx)?;
    // The listener is bound: connections wait in its backlog until the accept loop runs.
    // Ready from here, before the line below says so.
    state.tls_accepting.store(true, Ordering::SeqCst);
    let tls_task = tokio::spawn(serve_tls(
        tls_listener,
        acceptor,
        routes::router(state.clone()),
        state.clone(),
        shutdown_rx,
        listener_limits,
        Arc::new(http_builder(config)),
        ops_stop,
    ));
    tracing::info!(%tls_addr, %ops_addr, max_connections, "webhook serving");
    Ok(Server {
        tls_addr,
        ops_addr,
        state,
        shutdown,
        shutdown_delay: config.shutdown_delay,
        tls_task,
        ops_done,
        reloaders,
    })
}

/// Serves the operations router on its own thread and runtime until `stop` turns true.
fn spawn_ops(
    listener: std::net::TcpListener,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> Result<oneshot::Receiver<std::io::Result<()>>> {
    let (done, done_rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("webhook-ops".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .and_then(|runtime| {
                    runtime.block_on(async move {
                        let listener = TcpListener::from_std(listener)?;
                        telemetry::ops::serve(listener, app, async move {
                            let _ = stop.wait_for(|stop| *stop).await;
                        })
                        .await
                    })
                });
            let _ = done.send(result);
        });
    thread.map_err(Error::Ops)?;
    Ok(done_rx)
}

/// Runs the webhook until `signal` completes, then drains and returns.
pub async fn serve(config: Config, signal: impl Future<Output = ()>) -> Result<()> {
    let server = start(&config).await?;
    signal.await;
    server.shutdown().await
}

impl Server {
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_addr
    }

    pub fn ops_addr(&self) -> SocketAddr {
        self.ops_addr
    }

    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Turns readiness false and keeps serving for the shutdown delay, then stops
    /// accepting, drains in-flight requests (bounded by the shutdown timeout) and stops
    /// the operations port.
    pub async fn shutdown(self) -> Result<()> {
        // Not ready first, then say so: whoever reads the log line finds /readyz failing.
        self.state.draining.store(true, Ordering::SeqCst);
        tracing::info!("shutdown requested; draining");
        if !self.shutdown_delay.is_zero() {
            tracing::info!(delay = ?self.shutdown_delay, "not ready; serving until endpoints are updated");
            tokio::time::sleep(self.shutdown_delay).await;
        }
        let _ = self.shutdown.send(true);
        self.tls_task.await.map_err(|e| Error::Task("TLS", e))?;
        for task in self.reloaders {
            task.await.map_err(|e| Error::Task("reload", e))?;
        }
        match self.ops_done.await {
            Ok(result) => result.map_err(Error::Ops)?,
            Err(_) => {
                return Err(Error::Ops(std::io::Error::other(
                    "the operations thread ended without a result",
                )));
            }
        }
        tracing::info!("webhook stopped");
        Ok(())
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener> {
    telemetry::ops::bind(addr).map_err(|error| Error::Bind { addr, error })
}

fn reload_policies(state: &State) {
    let path = state
        .policies
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    match state.policies.reload() {
        Ok(Reload::Unchanged) => {}
        Ok(Reload::Loaded(count)) => {
            state.metrics.policy_reload(ReloadResult::Success, count);
            tracing::info!(policies = count, %path, "policies reloaded");
        }
        Err(error) => {
            let active = state.policies.current().len();
            state.metrics.policy_reload(ReloadResult::Failure, active);
            tracing::error!(%error, %path, active, "policy file refused; the previous policies stay active");
        }
    }
}
