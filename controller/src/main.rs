//! The controller binary: flags, logging, client, signals; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use controller::database::{DatabaseConfig, Databases};
use controller::images::{ImageConfig, Verifier};
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

    #[command(flatten)]
    images: ImageConfig,

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

/// Why the controller could not start or stopped with an error; printed once, by `main`.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("reading the Kubernetes configuration: {0}")]
    Config(kube::Error),
    #[error("creating the Kubernetes client: {0}")]
    Client(kube::Error),
    #[error("{0}")]
    Run(controller::RunError),
    #[error("image verification: {0}")]
    Images(controller::images::SetupError),
}

fn init_logging(args: &Args) -> Result<telemetry::Telemetry, telemetry::logs::Error> {
    telemetry::logs::init(&telemetry::LogOptions {
        format: telemetry::LogFormat::or_detect(args.log_format),
        service_name: "appservice-controller",
        otlp_endpoint: args.otlp_endpoint.clone(),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = telemetry::profiling::enable_heap_profiling(args.config.profiling()) {
        eprintln!("cannot restart with heap profiling enabled: {error}");
        return ExitCode::FAILURE;
    }
    let telemetry = match init_logging(&args) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("appservice-controller: {error}");
            return ExitCode::FAILURE;
        }
    };
    // One crypto provider for every TLS connection; installing twice is harmless.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let result = run(args).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            error!(%error, "controller failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    let config = controller::client::kube_config(args.kubeconfig.as_deref())
        .await
        .map_err(Error::Config)?;
    let metrics = Arc::new(Metrics::default());
    let identity = args.config.identity();
    let shard = args.config.sharding.then_some(identity.as_str());
    // With sharding every write passes the fence as it leaves the rate limit's queue (and
    // once more on joining it, `controller::run_with`), the databases' writes (their
    // Secrets) included. With the sharded watch they also stay within the namespaces this
    // shard serves.
    let fence = controller::fence::Fence::default();
    let client = controller::client::build_client_as(
        config,
        args.rate_limit,
        metrics.api(),
        shard,
        shard.map(|_| fence.clone()),
    )
    .map_err(Error::Client)?;
    // Exported at 0 without sharding all the same: dashboards and alerts find the series.
    let _ = metrics.families::<controller::sharding::ShardMetrics>();
    let share = args.config.sharding.then(|| {
        Arc::new(controller::sharding::Served::new(args.config.sharded_watch))
            as Arc<dyn controller::ring::Ringed>
    });
    let database_client = match &share {
        Some(share) => (share.clone() as Arc<dyn controller::share::Share>).bound(
            controller::fence::fenced(client.clone(), fence.clone()),
            &args.config.lease_namespace,
        ),
        None => client.clone(),
    };
    info!(
        namespace = args.config.watch_namespace.as_deref().unwrap_or("<all>"),
        qps = args.rate_limit.qps,
        burst = args.rate_limit.burst,
        "starting controller"
    );
    let databases = Databases::new(
        database_client,
        &args.database,
        &args.config.lease_namespace,
        metrics.clone(),
    );
    let images = if args.images.enabled {
        let verifier = Verifier::new(
            client.clone(),
            args.images.clone(),
            &args.config.lease_namespace,
            &metrics,
        )
        .map_err(Error::Images)?
        .scoped_to(args.config.watch_namespace.as_deref());
        Some(Arc::new(verifier) as Arc<dyn controller::image_gate::ImageGate>)
    } else {
        // Exported at 0 all the same: dashboards and alerts find the series.
        let _ = metrics.families::<controller::images::metrics::ImageMetrics>();
        None
    };
    let hooks = Hooks {
        metrics,
        external: Arc::new(databases),
        fence,
        share,
        images,
        ..Hooks::default()
    };
    controller::run_with(args.config, client, hooks, telemetry::shutdown_signal())
        .await
        .map_err(Error::Run)
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
