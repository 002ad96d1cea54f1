//! The TLS listener. Every resource it holds is bounded: a connection cap (a semaphore
//! taken before `accept`, so excess clients wait in the kernel's backlog and use no
//! descriptor here), a share of it per peer address (a connection past it is closed at
//! once, so one client cannot fill the cap), the TLS handshake timeout, the HTTP/1.1 header-read timeout, an
//! idle timeout for connections without a request in progress, and HTTP/2 stream limits
//! (concurrent streams and reset streams, against rapid-reset floods). On shutdown it
//! stops accepting, asks every connection to finish its in-flight requests, and closes
//! the rest at the drain timeout.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::metrics::{HandshakeFailure, Metrics};
use crate::{Config, State};

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
pub(crate) struct ListenerLimits {
    pub(crate) max_connections: usize,
    /// Connections one peer address may hold; 0: no limit below `max_connections`.
    pub(crate) max_connections_per_peer: usize,
    pub(crate) handshake_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) drain_timeout: Duration,
}

/// Completes once `shutdown` turns true (or its sender is gone).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// The connection builder: HTTP/1.1 header timeout, HTTP/2 stream limits.
pub(crate) fn http_builder(config: &Config) -> auto::Builder<TokioExecutor> {
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
pub(crate) async fn serve_tls(
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
    let peers = Arc::new(Peers::new(limits.max_connections_per_peer));
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
        let Some(peer_slot) = peers.admit(peer.ip()) else {
            state.metrics.peer_refused();
            tracing::debug!(%peer, max = limits.max_connections_per_peer, "peer holds its share of connections; closing");
            drop(tcp);
            continue;
        };
        tokio::spawn(connection(
            tcp,
            peer,
            peer_slot,
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

/// Whether the connection's client presented a certificate of `--client-ca` (always
/// false without it), in every request's extensions.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClientCertificate(pub(crate) bool);

/// Open connections per peer address, each at most `max` (0: no limit).
#[derive(Debug)]
struct Peers {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Peers {
    fn new(max: usize) -> Self {
        Peers {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for one more connection of `ip`, unless it holds its share already.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        // An IPv4 client of a dual-stack listener is the same peer as over IPv4.
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if self.max > 0 && *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PeerSlot(self.clone(), ip))
    }
}

/// One open connection of a peer; gives its place back when dropped.
struct PeerSlot(Arc<Peers>, IpAddr);

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.0.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.1) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.1);
            }
        }
    }
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
    _peer_slot: PeerSlot,
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
    // Whether the client presented a certificate; the verifier has checked its CA.
    let client = ClientCertificate(stream.get_ref().1.peer_certificates().is_some());
    let activity = Arc::new(Activity::new());
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            request.extensions_mut().insert(client);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_gets_its_share_and_returns_it() {
        let peers = Arc::new(Peers::new(2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = peers.admit(a).unwrap();
        let _second = peers.admit(a).unwrap();
        assert!(peers.admit(a).is_none(), "a third connection of one peer");
        // The same peer over a dual-stack listener is counted once.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(peers.admit(mapped).is_none());
        // Another peer is not affected.
        let _other = peers.admit(b).unwrap();
        drop(first);
        assert!(
            peers.admit(a).is_some(),
            "a closed connection's place is back"
        );
        drop(_other);
        assert!(
            !peers.open.lock().unwrap().contains_key(&b),
            "a peer without connections is forgotten"
        );
    }

    #[test]
    fn zero_is_no_per_peer_limit() {
        let peers = Arc::new(Peers::new(0));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let slots: Vec<_> = (0..1000).map(|_| peers.admit(a).unwrap()).collect();
        assert_eq!(slots.len(), 1000);
    }
}
