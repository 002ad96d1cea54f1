//! Command-line flags, each with an environment-variable fallback, so the same binary is
//! configured by `args:` or `env:` in a Pod spec.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use common::duration::parse_duration;

use clap::Parser;

/// Request bodies larger than this are refused with 413. The API server caps an object
/// at 1.5 MiB in etcd; an AdmissionReview carries it twice (object and oldObject).
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Bodies held at once across all requests: eight maximal reviews.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 8 * DEFAULT_MAX_BODY_BYTES;
/// `/convert` bodies larger than this are refused with 413. A list read in the version
/// that is not stored is converted in one ConversionReview per page (kubectl and
/// kube-runtime page at 500 objects), and an unpaginated list in one: 8 MiB is several
/// thousand AppServices, a third of the in-flight budget.
pub const DEFAULT_MAX_CONVERT_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Connections one peer address may hold: an eighth of the default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 128;

pub use telemetry::LogFormat;

/// Configuration of the webhook server.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "appservice-webhook",
    version,
    about = "Admission webhook for AppService: defaults, validation and CEL policies over TLS"
)]
pub struct Config {
    /// Address of the TLS listener the API server calls (`/mutate`, `/validate`).
    #[arg(long, env = "WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// Address of the plain-HTTP operations listener (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "WEBHOOK_OPS_LISTEN", default_value = "0.0.0.0:8080")]
    pub ops_listen: SocketAddr,

    /// PEM file with the serving certificate chain (leaf first).
    #[arg(
        long,
        env = "WEBHOOK_TLS_CERT",
        default_value = "/etc/webhook/tls/tls.crt"
    )]
    pub tls_cert: PathBuf,

    /// PEM file with the private key of the serving certificate.
    #[arg(
        long,
        env = "WEBHOOK_TLS_KEY",
        default_value = "/etc/webhook/tls/tls.key"
    )]
    pub tls_key: PathBuf,

    /// Keep a CA of the webhook's own in this Secret (created when absent), the caBundle
    /// of every `--ca-bundle-target` current, and the serving certificate in memory,
    /// issued by that CA; `--tls-cert`/`--tls-key` are then not read. Needs a Kubernetes
    /// client (in-cluster or kubeconfig) with access to exactly these objects.
    #[arg(long, env = "WEBHOOK_CA_SECRET")]
    pub ca_secret: Option<String>,

    /// Namespace of `--ca-secret` (the chart passes the release namespace).
    #[arg(long, env = "WEBHOOK_CA_SECRET_NAMESPACE", default_value = "default")]
    pub ca_secret_namespace: String,

    /// With `--ca-secret`: the DNS names (or IP addresses) of the serving certificate,
    /// comma-separated (the chart passes the webhook Service's names).
    #[arg(long, env = "WEBHOOK_TLS_SANS", value_delimiter = ',')]
    pub tls_sans: Vec<String>,

    /// With `--ca-secret`: the configurations whose caBundle is kept current,
    /// comma-separated `mutating/NAME`, `validating/NAME`, `crd/NAME` (a CRD only while its
    /// conversion is a webhook).
    #[arg(long, env = "WEBHOOK_CA_BUNDLE_TARGETS", value_delimiter = ',')]
    pub ca_bundle_targets: Vec<crate::ca::Target>,

    /// With `--ca-secret`: lifetime in days of a CA the webhook mints; it is replaced,
    /// with overlap, at two thirds of it.
    #[arg(long, env = "WEBHOOK_CA_VALIDITY_DAYS", default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub ca_validity_days: u32,

    /// PEM file of the CA(s) that sign the API server's client certificate. When set,
    /// `/mutate` and `/validate` answer only a client that presented a certificate of
    /// one of them (403 otherwise), and a certificate of another CA fails the handshake.
    /// The API server presents one given a kubeconfig for the webhook in its
    /// AdmissionConfiguration (`--admission-control-config-file`); it presents none to
    /// conversion webhooks, so `/convert` stays open (bounded like the rest). Read at start.
    #[arg(long, env = "WEBHOOK_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,

    /// YAML file of CEL admission policies; reloaded when it changes. None: no policies.
    #[arg(long, env = "WEBHOOK_POLICIES")]
    pub policies: Option<PathBuf>,

    /// Watch Namespaces' labels (metadata only) so policies can use `namespaceObject`.
    /// Needs RBAC to list and watch namespaces.
    #[arg(long, env = "WEBHOOK_NAMESPACE_LABELS")]
    pub namespace_labels: bool,

    /// Watch AppServices (the hub version, without managedFields) so a write of the
    /// scale subresource (`kubectl scale`, an HPA) is judged by the same rules as the
    /// AppService itself, and a write claiming a host name (`spec.expose.hostnames`)
    /// another AppService of the cluster holds is refused. Needs RBAC to list and watch
    /// appservices. Without it, every scale review is refused and host names are not
    /// checked (any AppService may claim any host name).
    #[arg(long, env = "WEBHOOK_WATCH_APPSERVICES", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub watch_appservices: bool,

    /// Bytes of AppService JSON the `--watch-appservices` cache holds at most; an
    /// AppService past it is kept by name only and its scale writes are refused.
    #[arg(long, env = "WEBHOOK_APPSERVICE_CACHE_BYTES", default_value_t = crate::appservices::DEFAULT_CACHE_BYTES)]
    pub appservice_cache_bytes: usize,

    /// How often certificate and policy files are re-read even without a change event
    /// (a fallback for file systems that do not report changes).
    #[arg(long, env = "WEBHOOK_RELOAD_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub reload_interval: Duration,

    /// Longest time one admission request may take, including reading its body (408
    /// past it). Below the API server's webhook timeout (`timeoutSeconds`, 5 s in the
    /// chart), so the webhook answers before the API server gives up.
    #[arg(long, env = "WEBHOOK_REQUEST_TIMEOUT", default_value = "4s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Longest time a client may take to send a request's whole body, from its headers
    /// on (time the webhook makes it wait for in-flight budget not counted; the request
    /// timeout bounds that); past it the request gets 408 and its budget is freed. The
    /// API server sends a review in one piece, so only a stalled client hits this.
    #[arg(long, env = "WEBHOOK_BODY_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub body_timeout: Duration,

    /// Longest time the CEL policies of one review may take; past it the review is
    /// denied (the evaluation runs on a blocking thread, never on the request workers).
    #[arg(long, env = "WEBHOOK_POLICY_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub policy_timeout: Duration,

    /// Longest time to drain in-flight requests after SIGTERM before exiting anyway.
    #[arg(long, env = "WEBHOOK_SHUTDOWN_TIMEOUT", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, env = "WEBHOOK_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// Largest accepted `/convert` body in bytes (a ConversionReview carries a whole
    /// page of a list); larger ones get 413. Counted in the in-flight budget too.
    #[arg(long, env = "WEBHOOK_MAX_CONVERT_BODY_BYTES", default_value_t = DEFAULT_MAX_CONVERT_BODY_BYTES)]
    pub max_convert_body_bytes: usize,

    /// Bytes of request bodies held at once, across all requests. Counted as the bytes
    /// arrive (a declared Content-Length reserves nothing), and held until the answer; a
    /// review costs at most a few times its body while it is decoded, so this bounds the
    /// memory of reviews in progress. A request that does not fit waits, holding
    /// nothing, within the request timeout.
    #[arg(long, env = "WEBHOOK_MAX_IN_FLIGHT_BYTES", default_value_t = DEFAULT_MAX_IN_FLIGHT_BYTES)]
    pub max_in_flight_bytes: usize,

    /// Most open TLS connections; further clients wait in the listen backlog. Kept below
    /// the file-descriptor limit so the operations port always has descriptors left.
    #[arg(long, env = "WEBHOOK_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Most open TLS connections from one peer address; a connection past it is closed
    /// at once (and counted), so one client cannot take every slot of
    /// `--max-connections`. The API server needs few: it multiplexes reviews over HTTP/2.
    #[arg(long, env = "WEBHOOK_MAX_CONNECTIONS_PER_PEER", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: usize,

    /// Most concurrent HTTP/2 streams per connection.
    #[arg(long, env = "WEBHOOK_MAX_CONCURRENT_STREAMS", default_value_t = 64)]
    pub max_concurrent_streams: u32,

    /// Longest time a TLS handshake may take.
    #[arg(long, env = "WEBHOOK_TLS_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,

    /// Longest time to receive a request's headers (HTTP/1.1); also how long an idle
    /// HTTP/1.1 connection waits for its next request.
    #[arg(long, env = "WEBHOOK_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// A connection with no request in progress for this long is closed (HTTP/2 with a
    /// GOAWAY, which the API server's client honours by opening a new connection for its
    /// next review; HTTP/1.1 after the current response). An idle connection holds a slot
    /// of `--max-connections`, so this is well below the API server's own 90 s.
    #[arg(long, env = "WEBHOOK_IDLE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// After SIGTERM, keep serving (and accepting) this long with /readyz failing, so
    /// Service endpoints drop the Pod before its listener closes.
    #[arg(long, env = "WEBHOOK_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Log format; default json unless stderr is a terminal. The level comes from
    /// `RUST_LOG` (default `info`).
    #[arg(long, env = "WEBHOOK_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Serve CPU and heap profiles on the operations port (`/debug/pprof/profile`,
    /// `/debug/pprof/heap`), to loopback connections only (`kubectl port-forward`).
    /// Also makes jemalloc sample allocations from the start.
    #[arg(long, env = "WEBHOOK_PROFILING", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub profiling: bool,

    /// With `--profiling`: serve profiles to any address that reaches the operations port.
    #[arg(long, env = "WEBHOOK_PROFILING_ALLOW_REMOTE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub profiling_allow_remote: bool,

    /// Export traces over OTLP/gRPC to this endpoint (e.g. `http://otel-collector:4317`):
    /// a span per admission review. Unset: no traces, and no cost.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl Config {
    /// A configuration for tests and the benchmark: both listeners on ephemeral
    /// loopback ports, the given files, defaults elsewhere.
    pub fn local(tls_cert: PathBuf, tls_key: PathBuf, policies: Option<PathBuf>) -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ops_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls_cert,
            tls_key,
            ca_secret: None,
            ca_secret_namespace: "default".to_owned(),
            tls_sans: Vec::new(),
            ca_bundle_targets: Vec::new(),
            ca_validity_days: 3650,
            client_ca: None,
            policies,
            namespace_labels: false,
            watch_appservices: false,
            appservice_cache_bytes: crate::appservices::DEFAULT_CACHE_BYTES,
            reload_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(4),
            body_timeout: Duration::from_secs(2),
            policy_timeout: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(25),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_convert_body_bytes: DEFAULT_MAX_CONVERT_BODY_BYTES,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            max_connections: 1024,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_concurrent_streams: 64,
            tls_handshake_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            shutdown_delay: Duration::ZERO,
            log_format: Some(LogFormat::Text),
            profiling: false,
            profiling_allow_remote: false,
            otlp_endpoint: None,
        }
    }

    /// The runtime CA's settings, when `--ca-secret` is given.
    pub fn ca(&self) -> Option<crate::ca::CaConfig> {
        let secret = self.ca_secret.clone().filter(|s| !s.is_empty())?;
        Some(crate::ca::CaConfig {
            secret,
            namespace: self.ca_secret_namespace.clone(),
            sans: self
                .tls_sans
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            targets: self.ca_bundle_targets.clone(),
            ca_validity: Duration::from_secs(u64::from(self.ca_validity_days) * 24 * 3600),
        })
    }

    /// Whether and to whom the operations port serves profiles.
    pub fn profiling(&self) -> telemetry::Profiling {
        telemetry::Profiling {
            enabled: self.profiling,
            allow_remote: self.profiling_allow_remote,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_defaults() {
        let config = Config::try_parse_from([
            "appservice-webhook",
            "--listen",
            "127.0.0.1:9443",
            "--policies",
            "/p.yaml",
            "--request-timeout",
            "3s",
            "--log-format",
            "text",
        ])
        .unwrap();
        assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 9443)));
        assert_eq!(config.policies, Some(PathBuf::from("/p.yaml")));
        assert_eq!(config.request_timeout, Duration::from_secs(3));
        assert_eq!(config.log_format, Some(LogFormat::Text));
        assert_eq!(config.max_body_bytes, 3 * 1024 * 1024);
        assert_eq!(config.shutdown_delay, Duration::from_secs(5));
        assert_eq!(config.max_connections, 1024);
        assert_eq!(config.max_connections_per_peer, 128);
        assert_eq!(config.body_timeout, Duration::from_secs(2));
        assert_eq!(config.idle_timeout, Duration::from_secs(30));
        assert_eq!(config.tls_cert, PathBuf::from("/etc/webhook/tls/tls.crt"));
        assert!(config.ca().is_none());
    }

    #[test]
    fn runtime_ca_flags() {
        let config = Config::try_parse_from([
            "appservice-webhook",
            "--ca-secret",
            "aso-webhook-ca",
            "--ca-secret-namespace",
            "ops",
            "--tls-sans",
            "aso-webhook,aso-webhook.ops.svc",
            "--ca-bundle-targets",
            "mutating/aso-webhook,validating/aso-webhook,crd/appservices.platform.example.com",
        ])
        .unwrap();
        let ca = config.ca().unwrap();
        assert_eq!(
            (ca.secret.as_str(), ca.namespace.as_str()),
            ("aso-webhook-ca", "ops")
        );
        assert_eq!(ca.sans, ["aso-webhook", "aso-webhook.ops.svc"]);
        assert_eq!(ca.targets.len(), 3);
        assert_eq!(ca.ca_validity, Duration::from_secs(3650 * 24 * 3600));
        assert!(
            Config::try_parse_from(["appservice-webhook", "--ca-bundle-targets", "pods/x"])
                .is_err()
        );
    }
}
