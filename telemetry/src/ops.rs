//! The operations port both binaries serve, built one way: `/healthz` (the process
//! runs), `/readyz` (the binary's own readiness check), `/metrics` (its registry in
//! OpenMetrics text) and, with `--profiling`, the profiles of [`crate::profiling`]; and
//! the signal that stops both binaries.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::Profiling;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the operations router asks of a binary.
pub trait Probes: Send + Sync + 'static {
    /// `Ok` when the binary can do its work; otherwise why not (the `/readyz` body).
    fn readiness(&self) -> Result<(), &'static str>;

    /// Every metric, in OpenMetrics text.
    fn encode_metrics(&self) -> Result<String, std::fmt::Error>;
}

/// The operations router: `/healthz`, `/readyz` and `/metrics` from `probes`, merged with
/// the profile routes `profiling` allows. Serve it with [`serve`] (the peer address
/// decides who may fetch profiles).
pub fn router<P: Probes>(probes: Arc<P>, profiling: Profiling) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<P>))
        .route("/metrics", get(metrics::<P>))
        .with_state(probes)
        .merge(crate::profiling::router(profiling))
}

async fn readyz<P: Probes>(State(probes): State<Arc<P>>) -> Response {
    match probes.readiness() {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

async fn metrics<P: Probes>(State(probes): State<Arc<P>>) -> Response {
    match probes.encode_metrics() {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Pending connections a listener keeps before the kernel refuses more.
const BACKLOG: u32 = 1024;

/// Binds a TCP listener with `SO_REUSEADDR`, so a process restarted at once after a
/// crash binds its port again while the port still has connections in TIME-WAIT (the
/// kubelet's probes leave one behind after each answer); without it, the restart fails
/// with "Address already in use" until they expire. Every listener of both binaries is
/// bound here. Needs a Tokio runtime; [`tokio::net::TcpListener::into_std`] moves it
/// to another one.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Serves `router` (from [`router`]) on `listener` until `shutdown` completes, then lets
/// the requests in progress finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The peer address decides who may fetch profiles.
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Completes on SIGTERM (the kubelet stopping the Pod) or SIGINT (Ctrl-C), saying which.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
        }
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the process");
            if let Err(error) = tokio::signal::ctrl_c().await {
                tracing::error!(%error, "cannot listen for SIGINT either");
                std::future::pending::<()>().await;
            }
            tracing::info!("SIGINT received");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed {
        ready: Result<(), &'static str>,
        metrics: Result<String, std::fmt::Error>,
    }

    impl Probes for Fixed {
        fn readiness(&self) -> Result<(), &'static str> {
            self.ready
        }
        fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
            self.metrics.clone()
        }
    }

    async fn get(probes: Fixed, path: &str) -> (StatusCode, Option<String>, String) {
        let app = router(Arc::new(probes), Profiling::default());
        let (status, headers, body) = crate::test_support::get(app, path).await;
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        (status, content_type, String::from_utf8(body).unwrap())
    }

    #[tokio::test]
    async fn probes_and_metrics_answer_from_the_binary() {
        let up = || Fixed {
            ready: Ok(()),
            metrics: Ok("# EOF\n".into()),
        };
        assert_eq!(get(up(), "/healthz").await.2, "ok");
        assert_eq!(get(up(), "/readyz").await.0, StatusCode::OK);
        let (status, content_type, body) = get(up(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some(OPENMETRICS_CONTENT_TYPE));
        assert_eq!(body, "# EOF\n");
        assert_eq!(
            get(up(), "/debug/pprof/heap").await.0,
            StatusCode::NOT_FOUND
        );

        let down = || Fixed {
            ready: Err("caches not synced"),
            metrics: Err(std::fmt::Error),
        };
        let (status, _, body) = get(down(), "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
        );
        assert_eq!(
            get(down(), "/metrics").await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
