//! The controller binary: flags, logging, client, signals; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use controller::database::{DatabaseConfig, Databases};
use controller::metrics::Metrics;
use controller::{Config, Hooks, RateLimit};
use std::sync::Arc;
use tracing::{error, info};

// jemalloc, for heap profiles on demand (`--profiling`); it samples nothing without it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "appservice-controller",
    version,
    about = "Reconciles AppServices into Deployments and Services"
)]
struct Args {
    #[command(flatten)]
    config: Config,

    #[command(flatten)]
    rate_limit: RateLimit,

    #[command(flatten)]
    database: DatabaseConfig,

    /// Kubeconfig file; in-cluster configuration or $KUBECONFIG when unset.
    #[arg(long, env = "KUBECONFIG_PATH")]
    kubeconfig: Option<PathBuf>,

    /// Log format; default json unless stderr is a terminal.
    #[arg(long, env = "LOG_FORMAT", value_enum)]
    log_format: Option<telemetry::LogFormat>,

    /// Export traces over OTLP/gRPC to this endpoint (e.g. `http://otel-collector:4317`):
    /// a span per reconcile with its API calls and database statements as children.
    /// Unset: no traces, and no cost.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

fn init_logging(args: &Args) -> anyhow::Result<telemetry::Telemetry> {
    use std::io::IsTerminal;
    let json = match args.log_format {
        Some(format) => format == telemetry::LogFormat::Json,
        None => !std::io::stderr().is_terminal(),
    };
    Ok(telemetry::logs::init(&telemetry::LogOptions {
        json,
        flatten_json: false,
        service_name: "appservice-controller",
        otlp_endpoint: args.otlp_endpoint.clone(),
    })?)
}

async fn kube_config(path: Option<&PathBuf>) -> anyhow::Result<kube::Config> {
    Ok(match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
            }
        }
        Err(e) => {
            error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the controller");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = telemetry::profiling::enable_heap_profiling(args.config.profiling()) {
        eprintln!("cannot restart with heap profiling enabled: {e}");
        return ExitCode::FAILURE;
    }
    let telemetry = match init_logging(&args) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("appservice-controller: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // One crypto provider for every TLS connection; installing twice is harmless.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();

    let result = async {
        let config = kube_config(args.kubeconfig.as_ref()).await?;
        let client = controller::client::build_client(config, args.rate_limit)?;
        info!(
            namespace = args.config.watch_namespace.as_deref().unwrap_or("<all>"),
            qps = args.rate_limit.qps,
            burst = args.rate_limit.burst,
            "starting controller"
        );
        let metrics = Arc::new(Metrics::default());
        let databases = Databases::new(
            client.clone(),
            &args.database,
            &args.config.lease_namespace,
            metrics.clone(),
        );
        let hooks = Hooks {
            metrics,
            external: Arc::new(databases),
            ..Hooks::default()
        };
        controller::run_with(args.config, client, hooks, shutdown_signal()).await
    }
    .await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %format!("{e:#}"), "controller failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_log_format_is_refused_not_read_as_text() {
        let parse = |format: &str| {
            Args::try_parse_from(["appservice-controller", "--log-format", format])
                .map(|a| a.log_format)
        };
        assert_eq!(parse("text").ok(), Some(Some(telemetry::LogFormat::Text)));
        assert_eq!(parse("json").ok(), Some(Some(telemetry::LogFormat::Json)));
        assert!(parse("jsn").is_err());
    }
}
