//! The controller binary: flags, logging, client, signals; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use controller::database::{DatabaseConfig, Databases};
use controller::metrics::Metrics;
use controller::{Config, Hooks, RateLimit};
use std::sync::Arc;
use tracing::{error, info};

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

    /// Log format: `json` (production) or `text`; default json unless stderr is a terminal.
    #[arg(long, env = "LOG_FORMAT")]
    log_format: Option<String>,
}

fn init_logging(format: Option<&str>) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        Some(f) => f == "json",
        None => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
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
    init_logging(args.log_format.as_deref());
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
