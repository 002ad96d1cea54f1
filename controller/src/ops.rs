//! The ops server: `/healthz` (the process runs), `/readyz` (caches synced), `/metrics`,
//! and with `--profiling` the profiles of [`telemetry::profiling`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::context::Context;

pub fn router(ctx: Arc<Context>) -> Router {
    let profiles = telemetry::profiling::router(ctx.config().profiling());
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ctx)
        .merge(profiles)
}

async fn readyz(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    if ctx.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

async fn metrics(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    match ctx.metrics().encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Serves the ops endpoints on `addr` until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "ops server listening");
    // The peer address decides who may fetch profiles.
    axum::serve(
        listener,
        router(ctx).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
