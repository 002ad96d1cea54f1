//! `appservice-certs`: writes development certificates (a CA, a serving certificate and
//! optionally a client certificate) into a directory, e.g. for running the webhook locally.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Write development certificates: ca.crt/ca.key, tls.crt/tls.key and, with
/// --client-cn, client.crt/client.key.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Directory to write into (created if missing).
    #[arg(long, short, default_value = "certs-dev")]
    out: PathBuf,
    /// Subject alternative names of the serving certificate: DNS names or IP addresses.
    #[arg(long = "san", default_values = ["localhost", "127.0.0.1", "::1"])]
    sans: Vec<String>,
    /// Also write a client certificate with this common name (the Kubernetes user).
    #[arg(long)]
    client_cn: Option<String>,
    /// Organisations (Kubernetes groups) of the client certificate; repeatable.
    #[arg(long = "client-org")]
    client_orgs: Vec<String>,
    /// Sign with this existing CA certificate instead of creating a new CA (needs --ca-key).
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    /// Private key of --ca-cert.
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// Validity of new certificates, in days.
    #[arg(long, default_value_t = certs::DEFAULT_VALIDITY_DAYS)]
    days: u32,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let existing_ca = args.ca_cert.as_deref().zip(args.ca_key.as_deref());
    let spec = certs::DevCerts {
        sans: args.sans,
        client_cn: args.client_cn,
        client_orgs: args.client_orgs,
        existing_ca,
        validity_days: args.days,
    };
    match certs::write_dev_certs(&args.out, &spec) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
