//! The server: binds the TLS and operations listeners, starts the file watchers, serves
//! until told to stop, then drains.
//!
//! Shutdown order: readiness turns false, the TLS listener stops accepting, every open
//! connection is asked to finish its in-flight requests (HTTP/1 closes after the current
//! response, HTTP/2 sends GOAWAY), and after they are done, or after the shutdown
//! timeout, the operations server stops too.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::metrics::{Metrics, ReloadResult};
use crate::namespaces::NamespaceCache;
use crate::policy::{PolicyStore, Reload};
use crate::tls::{self, CertStore};
use crate::{Config, Error, Limits, Result, State, reload, routes};

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running webhook.
#[derive(Debug)]
pub struct Server {
    tls_addr: SocketAddr,
    ops_addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
    tls_task: JoinHandle<()>,
    ops_task: JoinHandle<std::io::Result<()>>,
    reloaders: Vec<JoinHandle<()>>,
}

/// Loads certificate and policies, binds both listeners and starts serving. Fails when
/// the certificate or the policy file cannot be loaded or a port cannot be bound. With
/// `--namespace-labels` the Kubernetes client comes from the environment (in-cluster or
/// kubeconfig).
pub async fn start(config: &Config) -> Result<Server> {
    let client = if config.namespace_labels {
        Some(kube::Client::try_default().await.map_err(Error::Client)?)
    } else {
        None
    };
    start_with_client(config, client).await
}

/// [`start`] with an explicit client for the namespace-label watch (used when
/// `config.namespace_labels` is set; ignored otherwise).
pub async fn start_with_client(config: &Config, client: Option<kube::Client>) -> Result<Server> {
    let metrics = Arc::new(Metrics::new());
    let certs = Arc::new(CertStore::load(
        config.tls_cert.clone(),
        config.tls_key.clone(),
        metrics.clone(),
    )?);
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
        request_timeout: config.request_timeout,
    };
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut reloaders = Vec::new();
    let mut state = State::new(policies, metrics, limits).with_certs(certs.clone());
    if let (true, Some(client)) = (config.namespace_labels, client) {
        let (cache, task) = NamespaceCache::spawn(client, shutdown_rx.clone());
        state = state.with_namespaces(cache);
        reloaders.push(task);
    }
    let state = Arc::new(state);
    let acceptor = TlsAcceptor::from(tls::server_config(certs.clone())?);

    let tls_listener = bind(config.listen).await?;
    let ops_listener = bind(config.ops_listen).await?;
    let tls_addr = tls_listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let ops_addr = ops_listener.local_addr().map_err(|source| Error::Bind {
        addr: config.ops_listen,
        source,
    })?;

    {
        let paths = certs.paths().map(ToOwned::to_owned);
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
    let (ops_stop, mut ops_stop_rx) = watch::channel(false);
    let ops_task = tokio::spawn({
        let app = routes::ops_router(state.clone());
        async move {
            axum::serve(ops_listener, app)
                .with_graceful_shutdown(async move {
                    let _ = ops_stop_rx.wait_for(|stop| *stop).await;
                })
                .await
        }
    });
    let tls_task = tokio::spawn(serve_tls(
        tls_listener,
        acceptor,
        routes::router(state.clone()),
        state.clone(),
        shutdown_rx,
        config.shutdown_timeout,
        ops_stop,
    ));
    tracing::info!(%tls_addr, %ops_addr, "webhook serving");
    Ok(Server {
        tls_addr,
        ops_addr,
        state,
        shutdown,
        tls_task,
        ops_task,
        reloaders,
    })
}

/// Runs the webhook until `signal` completes, then drains and returns.
pub async fn serve(config: Config, signal: impl Future<Output = ()>) -> Result<()> {
    let server = start(&config).await?;
    signal.await;
    tracing::info!("shutdown requested; draining");
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

    /// Stops accepting, drains in-flight requests (bounded by the shutdown timeout) and
    /// stops the operations port.
    pub async fn shutdown(self) -> Result<()> {
        self.state.draining.store(true, Ordering::SeqCst);
        let _ = self.shutdown.send(true);
        self.tls_task.await.map_err(|e| Error::Task("TLS", e))?;
        for task in self.reloaders {
            task.await.map_err(|e| Error::Task("reload", e))?;
        }
        self.ops_task
            .await
            .map_err(|e| Error::Task("operations", e))?
            .map_err(Error::Ops)?;
        tracing::info!("webhook stopped");
        Ok(())
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
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

/// Completes once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
    drain_timeout: Duration,
    ops_stop: watch::Sender<bool>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    state.tls_accepting.store(true, Ordering::SeqCst);
    loop {
        let accepted = tokio::select! {
            biased;
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%error, %peer, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                app.clone().oneshot(request)
            });
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%error, %peer, "connection closed with an error");
            }
        });
    }
    state.tls_accepting.store(false, Ordering::SeqCst);
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections drained"),
        () = tokio::time::sleep(drain_timeout) => {
            tracing::warn!(?drain_timeout, "drain timed out; closing remaining connections");
        }
    }
    let _ = ops_stop.send(true);
}
