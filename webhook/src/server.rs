//! The server: binds the TLS and operations listeners, starts the file watchers, serves
//! until told to stop, then drains.
//!
//! Every resource of the TLS listener is bounded: a connection cap (a semaphore taken
//! before `accept`, so excess clients wait in the kernel's backlog and use no descriptor
//! here), the TLS handshake timeout, the HTTP/1.1 header-read timeout, an idle timeout
//! for connections without a request in progress, HTTP/2 stream limits (concurrent
//! streams and reset streams, against rapid-reset floods), and per request the body
//! size, the in-flight body budget and the request timeout.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::metrics::{HandshakeFailure, Metrics, ReloadResult};
use crate::namespaces::NamespaceCache;
use crate::policy::{PolicyStore, Reload};
use crate::tls::{self, CertStore};
use crate::{Config, Error, Limits, Result, State, process, reload, routes};

/// HTTP/2 streams a client may reset before the server has answered them, per
/// connection, before the connection is closed (rapid-reset protection).
const MAX_PENDING_RESET_STREAMS: usize = 20;
/// HTTP/2 streams the server may reset because of client errors, per connection.
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;

/// How long an idle connection asked to close may take to do so.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Sleeps until `deadline`; never completes without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Timeouts and limits of the TLS listener.
#[derive(Clone, Copy, Debug)]
struct ListenerLimits {
    max_connections: usize,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    drain_timeout: Duration,
}

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
        max_convert_body_bytes: config.max_convert_body_bytes,
        max_in_flight_bytes: config.max_in_flight_bytes,
        request_timeout: config.request_timeout,
        policy_timeout: config.policy_timeout,
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
        handshake_timeout: config.tls_handshake_timeout,
        idle_timeout: config.idle_timeout,
        drain_timeout: config.shutdown_timeout,
    };
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut reloaders = Vec::new();
    let mut state = State::new(policies, metrics, limits)
        .with_certs(certs.clone())
        .with_profiling(config.profiling());
    if let (true, Some(client)) = (config.namespace_labels, client) {
        let (cache, task) = NamespaceCache::spawn(client, shutdown_rx.clone());
        state = state.with_namespaces(cache);
        reloaders.push(task);
    }
    let state = Arc::new(state);
    let acceptor = TlsAcceptor::from(tls::server_config(certs.clone())?);

    let tls_listener = bind(config.listen).await?;
    let ops_listener = std::net::TcpListener::bind(config.ops_listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
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

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| Error::Bind { addr, error })
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

/// The connection builder: HTTP/1.1 header timeout, HTTP/2 stream limits.
fn http_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_headers(64);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_pending_accept_reset_streams(MAX_PENDING_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .max_header_list_size(64 * 1024);
    builder
}

#[allow(clippy::too_many_arguments)]
async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
    limits: ListenerLimits,
    builder: Arc<auto::Builder<TokioExecutor>>,
    ops_stop: watch::Sender<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Closes the connections still open when the drain times out.
    let (abort, abort_rx) = watch::channel(false);
    loop {
        // A free slot first: at the cap, clients wait in the backlog, not in our fds.
        let slot = tokio::select! {
            biased;
            () = stopped(&mut shutdown) => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
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
        tokio::spawn(connection(
            tcp,
            peer,
            acceptor.clone(),
            app.clone(),
            builder.clone(),
            state.metrics.clone(),
            limits,
            shutdown.clone(),
            abort_rx.clone(),
            slot,
        ));
    }
    state.tls_accepting.store(false, Ordering::SeqCst);
    drop(listener);
    // Every connection holds a slot until it is closed: all slots back means drained.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = slots.acquire_many(all) => tracing::info!("all connections drained"),
        () = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!(drain_timeout = ?limits.drain_timeout, "drain timed out; closing remaining connections");
            let _ = abort.send(true);
        }
    }
    let _ = ops_stop.send(true);
}

/// When the last request of a connection ended, and how many are in progress.
#[derive(Debug)]
struct Activity {
    origin: Instant,
    active: AtomicUsize,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            origin: Instant::now(),
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveRequest(self.clone())
    }

    /// Completes once no request has been in progress for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline = if self.active.load(Ordering::SeqCst) == 0 {
                let last = self.origin + Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
                let deadline = last + timeout;
                if Instant::now() >= deadline {
                    return;
                }
                deadline
            } else {
                Instant::now() + timeout
            };
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A request in progress on a connection; ends with the response (or its cancellation).
struct ActiveRequest(Arc<Activity>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let elapsed = u64::try_from(self.0.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.store(elapsed, Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One TLS connection: handshake within its timeout, then HTTP until the client closes,
/// the connection has been idle too long, or shutdown.
#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    app: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    metrics: Arc<Metrics>,
    limits: ListenerLimits,
    mut shutdown: watch::Receiver<bool>,
    mut abort: watch::Receiver<bool>,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let _open = metrics.connection();
    let _ = tcp.set_nodelay(true);
    let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            metrics.handshake_failed(HandshakeFailure::Error);
            tracing::debug!(%error, %peer, "TLS handshake failed");
            return;
        }
        Err(_) => {
            metrics.handshake_failed(HandshakeFailure::Timeout);
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let activity = Arc::new(Activity::new());
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let active = activity.begin();
            let response = app.clone().oneshot(request);
            async move {
                let response = response.await;
                drop(active);
                response
            }
        })
    };
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut closing = false;
    // An idle connection asked to close gets this long to do so; an HTTP/2 client that
    // never acknowledges the GOAWAY must not keep it open.
    let mut close_by: Option<Instant> = None;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, %peer, "connection closed with an error");
                }
                return;
            }
            () = stopped(&mut shutdown), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = activity.idle_for(limits.idle_timeout), if !closing => {
                tracing::debug!(%peer, "closing an idle connection");
                connection.as_mut().graceful_shutdown();
                closing = true;
                close_by = Some(Instant::now() + IDLE_CLOSE_GRACE);
            }
            () = sleep_until_some(close_by) => return,
            () = stopped(&mut abort) => return,
        }
    }
}
