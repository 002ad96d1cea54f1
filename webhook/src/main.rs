//! `appservice-webhook`: parses flags, sets up logging and the rustls crypto provider,
//! and serves until SIGTERM or Ctrl-C, then drains.

use clap::Parser;
use webhook::{Config, logging, serve, tls};

// jemalloc returns freed pages to the system after a burst of large reviews (its
// background thread purges them); glibc's malloc kept a burst's peak resident
// (measured in tests/hostile.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    if let Err(error) = telemetry::profiling::enable_heap_profiling(config.profiling()) {
        eprintln!("cannot restart with heap profiling enabled: {error}");
        return std::process::ExitCode::FAILURE;
    }
    let telemetry = match logging::init(config.log_format, config.otlp_endpoint.clone()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("appservice-webhook: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tls::install_crypto_provider();
    let result = serve(config, shutdown_signal()).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "webhook failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// SIGTERM (the kubelet stopping the Pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = ctrl_c => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the webhook");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
