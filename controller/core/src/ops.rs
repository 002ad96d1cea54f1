//! The ops server: `/healthz` (the process runs), `/readyz` (caches synced), `/metrics`,
//! and with `--profiling` the profiles of [`telemetry::profiling`]; the router is the
//! webhook's too ([`telemetry::ops::router`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;

use crate::context::Context;

impl telemetry::ops::Probes for Context {
    fn readiness(&self) -> Result<(), &'static str> {
        if self.is_ready() {
            Ok(())
        } else {
            Err("caches not synced")
        }
    }

    fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics().encode()
    }
}

pub fn router(ctx: Arc<Context>) -> Router {
    let profiling = ctx.config().profiling();
    telemetry::ops::router(ctx, profiling)
}

/// Serves the ops endpoints on `addr` until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // SO_REUSEADDR: a restart after a crash binds at once (telemetry::ops::bind).
    let listener = telemetry::ops::bind(addr)?;
    tracing::info!(addr = %listener.local_addr()?, "ops server listening");
    telemetry::ops::serve(listener, router(ctx), shutdown).await
}
