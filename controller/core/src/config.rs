//! Command-line and environment configuration of the controller.

use std::net::SocketAddr;
use std::time::Duration;

pub use common::duration::parse_duration;

use clap::Args;

/// Excluded when `--exclude-namespaces` is not given: the cluster's own namespace.
pub const DEFAULT_EXCLUDED_NAMESPACE: &str = "kube-system";

/// Everything [`crate::run`] needs besides a client. Flags double as environment
/// variables so the chart can set them either way.
#[derive(Args, Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (all namespaces when unset).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Namespaces never reconciled in (comma-separated). An AppService there gets
    /// nothing written: no finalizer, status, Event or child; it is logged and counted
    /// (`appservice_controller_excluded`). The chart passes kube-system, the release
    /// namespace and `controller.excludeNamespaces`, the list its admission policy
    /// enforces too.
    #[arg(long, env = "EXCLUDE_NAMESPACES", value_delimiter = ',', default_value = DEFAULT_EXCLUDED_NAMESPACE)]
    pub exclude_namespaces: Vec<String>,

    /// Reconciles running at once.
    #[arg(long, env = "CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,

    /// Address of the ops server (/healthz, /readyz, /metrics).
    #[arg(long, env = "OPS_ADDR", default_value = "0.0.0.0:8080")]
    pub ops_addr: Option<SocketAddr>,

    /// Elect a leader on a Lease before reconciling. Disable only when a single replica
    /// runs (or in tests that scope controllers by namespace).
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader Lease (the release namespace).
    #[arg(long, env = "LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, env = "LEASE_NAME", default_value = common::names::LEASE_NAME)]
    pub lease_name: String,

    /// Identity in the Lease; defaults to POD_NAME, else `<hostname>-<pid>`.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long a Lease stays valid without renewal.
    #[arg(long, env = "LEASE_DURATION", value_parser = parse_duration, default_value = "15s")]
    pub lease_duration: Duration,

    /// The leader gives up when it could not renew for this long (< lease duration).
    #[arg(long, env = "LEASE_RENEW_DEADLINE", value_parser = parse_duration, default_value = "10s")]
    pub renew_deadline: Duration,

    /// Interval between acquire and renew attempts.
    #[arg(long, env = "LEASE_RETRY_PERIOD", value_parser = parse_duration, default_value = "2s")]
    pub retry_period: Duration,

    /// Divide the AppServices among the replicas: each holds a membership Lease
    /// (`<ring>-shard-<identity>`) and claims in it the namespace buckets (64, by a hash
    /// of the namespace's name) a rendezvous hash over the live members assigns it; it
    /// reconciles, writes and caches only the AppServices of those namespaces. A replica
    /// alone serves every bucket. Nothing is written on the objects. Off: one leader
    /// reconciles everything, as without the flag.
    #[arg(long, env = "SHARDING", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub sharding: bool,

    /// With `--sharding`: the API server filters each member's lists and watches by its
    /// buckets (the alpha feature gate `ShardedListAndWatch`, Kubernetes 1.37+), so a
    /// member no longer receives and decodes the others' events. Without it the member
    /// filters them itself.
    #[arg(long, env = "SHARDED_WATCH", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub sharded_watch: bool,

    /// The ring of shards (with `--sharding`): the name in the labels and Leases, so two
    /// controller releases can shard side by side.
    #[arg(long, env = "SHARD_RING", default_value = common::names::DEFAULT_SHARD_RING)]
    pub shard_ring: String,

    /// The namespaces this ring owns (with `--sharding`), as a label selector on the
    /// Namespace (`operator-upgrade=canary`; `a!=b`, `k in (x,y)`, `k notin (x,y)`,
    /// `k`, `!k`, comma-joined). Two releases split the cluster with complementary
    /// selectors; a namespace relabelled from one to the other is handed over through
    /// the rings' member Leases, with no two writers, and a namespace both select is
    /// served by neither. Unset: every namespace no other ring selects.
    #[arg(long, env = "NAMESPACE_SELECTOR", value_parser = common::namespace_selector::NamespaceSelector::parse)]
    pub namespace_selector: Option<common::namespace_selector::NamespaceSelector>,

    /// With `--sharding`: where the member Leases of the other rings are (comma-separated;
    /// the lease namespace always counts; `*`: every namespace). Name only namespaces the
    /// admin controls: a Lease there that selects a namespace keeps this ring out of it.
    /// The chart passes `controller.sharding.peerReleaseNamespaces`, or `*` for a
    /// release with a namespace selector that names none.
    #[arg(long, env = "PEER_LEASE_NAMESPACES", value_delimiter = ',')]
    pub peer_lease_namespaces: Vec<String>,

    /// Re-check an object that is still rolling out after this long (watch events on the
    /// Deployment usually come first).
    #[arg(long, env = "ROLLOUT_REQUEUE", value_parser = parse_duration, default_value = "10s")]
    pub rollout_requeue: Duration,

    /// Re-check a converged object after this long, as a safety net for missed events.
    /// A converged re-check reads only from the cache and writes nothing.
    #[arg(long, env = "RESYNC_INTERVAL", value_parser = parse_duration, default_value = "10m")]
    pub resync_interval: Duration,

    /// How long in-flight reconciles may run after SIGTERM.
    #[arg(long, env = "SHUTDOWN_GRACE", value_parser = parse_duration, default_value = "20s")]
    pub shutdown_grace: Duration,

    /// Serve CPU and heap profiles on the ops port (`/debug/pprof/profile`,
    /// `/debug/pprof/heap`), to loopback connections only (`kubectl port-forward`).
    /// Also makes jemalloc sample allocations from the start.
    #[arg(long, env = "PROFILING", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub profiling: bool,

    /// With `--profiling`: serve profiles to any address that reaches the ops port.
    #[arg(long, env = "PROFILING_ALLOW_REMOTE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub profiling_allow_remote: bool,

    /// The Gateway (`namespace/name`) an AppService's `spec.expose` attaches its
    /// HTTPRoute to (the chart's `controller.expose.gateway`). Unset: no route is made,
    /// and an AppService that asks to be exposed says so in its status
    /// (`ExposureUnavailable`). Set, the Gateway API's CRDs must be served.
    #[arg(long, env = "EXPOSE_GATEWAY", value_parser = GatewayRef::parse)]
    pub expose_gateway: Option<GatewayRef>,

    /// The port of the HTTPS listeners added to that Gateway for `spec.expose.tls`: one
    /// the Gateway's implementation serves (the chart's
    /// `controller.expose.gateway.httpsPort`).
    #[arg(long, env = "EXPOSE_HTTPS_PORT", default_value_t = 443, value_parser = clap::value_parser!(i32).range(1..=65535))]
    pub expose_https_port: i32,

    /// cert-manager runs in the cluster (its CRDs are served): an AppService whose
    /// `spec.expose.tls` names an `issuerRef` gets a Certificate (the chart's
    /// `controller.expose.certManager`). Off: such an AppService says it cannot be served.
    #[arg(long, env = "EXPOSE_CERT_MANAGER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub expose_cert_manager: bool,

    /// Without a Gateway: the IngressClass an AppService's `spec.expose` gets an Ingress
    /// of (the chart's `controller.expose.ingressClassName`), for clusters that do not
    /// serve the Gateway API. Ignored when `--expose-gateway` is set.
    #[arg(long, env = "EXPOSE_INGRESS_CLASS")]
    pub expose_ingress_class: Option<String>,
}

/// A Gateway, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayRef {
    pub namespace: String,
    pub name: String,
}

impl GatewayRef {
    /// `namespace/name`, both DNS names.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (namespace, name) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: expected namespace/name"))?;
        for part in [namespace, name] {
            if !common::validation::is_dns1123_subdomain(part) {
                return Err(format!("`{s}`: `{part}` is not a lowercase RFC 1123 name"));
            }
        }
        Ok(GatewayRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl std::fmt::Display for GatewayRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Config {
    /// Settings for running in-process (tests): one namespace, no ops server, no
    /// leader election, and otherwise the flag defaults.
    pub fn for_namespace(namespace: &str) -> Self {
        Config {
            watch_namespace: Some(namespace.to_owned()),
            exclude_namespaces: vec![DEFAULT_EXCLUDED_NAMESPACE.to_owned()],
            concurrency: 4,
            ops_addr: None,
            leader_election: false,
            lease_namespace: namespace.to_owned(),
            lease_name: common::names::LEASE_NAME.to_owned(),
            identity: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            sharding: false,
            sharded_watch: false,
            shard_ring: common::names::DEFAULT_SHARD_RING.to_owned(),
            namespace_selector: None,
            peer_lease_namespaces: Vec::new(),
            rollout_requeue: Duration::from_secs(10),
            resync_interval: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(20),
            profiling: false,
            profiling_allow_remote: false,
            expose_gateway: None,
            expose_https_port: 443,
            expose_cert_manager: false,
            expose_ingress_class: None,
        }
    }

    /// Whether the controller stays out of `namespace` (`--exclude-namespaces`).
    pub fn is_excluded(&self, namespace: &str) -> bool {
        self.exclude_namespaces
            .iter()
            .map(|excluded| excluded.trim())
            .any(|excluded| !excluded.is_empty() && excluded == namespace)
    }

    /// Whether and to whom the ops port serves profiles.
    pub fn profiling(&self) -> telemetry::Profiling {
        telemetry::Profiling {
            enabled: self.profiling,
            allow_remote: self.profiling_allow_remote,
        }
    }

    /// The Lease identity: the flag/`POD_NAME`, else hostname and process id.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "unknown-host".to_owned());
            format!("{host}-{}", std::process::id())
        })
    }
}

/// Client-side request rate limit.
#[derive(Args, Clone, Copy, Debug)]
pub struct RateLimit {
    /// Sustained API requests per second.
    #[arg(long = "kube-api-qps", env = "KUBE_API_QPS", default_value_t = 50.0)]
    pub qps: f64,

    /// Requests allowed in a burst above the sustained rate.
    #[arg(long = "kube-api-burst", env = "KUBE_API_BURST", default_value_t = 100)]
    pub burst: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_falls_back_to_host_and_pid() {
        let c = Config::for_namespace("ns");
        assert!(c.identity().ends_with(&format!("-{}", std::process::id())));
        let named = Config {
            identity: Some("pod-0".into()),
            ..c
        };
        assert_eq!(named.identity(), "pod-0");
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn excluded_namespaces_come_from_a_comma_separated_list() {
        use clap::Parser;
        let default = Flags::try_parse_from(["controller"]).unwrap().config;
        assert!(default.is_excluded("kube-system"));
        assert!(!default.is_excluded("team-a"));
        let listed = Flags::try_parse_from([
            "controller",
            "--exclude-namespaces",
            "kube-system,appservice-system, team-b",
        ])
        .unwrap()
        .config;
        for ns in ["kube-system", "appservice-system", "team-b"] {
            assert!(listed.is_excluded(ns), "{ns}");
        }
        assert!(!listed.is_excluded("team-a"));
        assert!(!listed.is_excluded(""), "an empty entry excludes nothing");
    }
}
