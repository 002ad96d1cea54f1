//! `appservice-migrate-storage`: rewrites every AppService in the storage version
//! (`v1beta1`) and then sets the CRD's `status.storedVersions` to it. Safe to run twice
//! and while the controller runs. Run it after the new CRD and webhook are installed
//! (the chart runs it as a post-upgrade hook Job); see docs/operators/upgrading.md.

use std::process::ExitCode;

use clap::Parser;

/// Migrate stored AppServices to the storage version.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Kubeconfig to use; in a Pod the service account is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = Args::parse();
    let client = match client(args.kubeconfig).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: creating a Kubernetes client: {error}");
            return ExitCode::FAILURE;
        }
    };
    match controller::migrate::run(client).await {
        Ok(report) => {
            println!(
                "rewrote {} AppServices ({} deleted meanwhile, {} conflicts retried); storedVersions: {:?}",
                report.rewritten, report.gone, report.conflicts, report.stored_versions
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn client(kubeconfig: Option<std::path::PathBuf>) -> Result<kube::Client, kube::Error> {
    let config = controller::client::kube_config(kubeconfig.as_deref()).await?;
    kube::Client::try_from(controller::client::with_user_agent(
        config,
        "appservice-migrate-storage",
    ))
}
