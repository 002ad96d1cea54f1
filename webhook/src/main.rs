//! `appservice-webhook`: parses flags, sets up logging and the rustls crypto provider,
//! and serves until SIGTERM or SIGINT ([`telemetry::shutdown_signal`]), then drains.

use std::process::ExitCode;

use clap::Parser;
use webhook::{Config, logging, serve, tls};

// jemalloc returns freed pages to the system after a burst of large reviews (its
// background thread purges them); glibc's malloc kept a burst's peak resident
// (measured in tests/hostile.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(error) = telemetry::profiling::enable_heap_profiling(config.profiling()) {
        eprintln!("cannot restart with heap profiling enabled: {error}");
        return ExitCode::FAILURE;
    }
    let telemetry = match logging::init(config.log_format, config.otlp_endpoint.clone()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("appservice-webhook: {error}");
            return ExitCode::FAILURE;
        }
    };
    tls::install_crypto_provider();
    let result = serve(config, telemetry::shutdown_signal()).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(%error, "webhook failed");
            ExitCode::FAILURE
        }
    }
}
