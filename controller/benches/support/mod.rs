//! Helpers shared by the controller benchmarks (`controller.rs`, `scale.rs`, `database.rs`,
//! `cache_cost.rs`).

#![allow(dead_code)]

pub mod converge;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::AppService;
use kube::Client;

/// Write verbs of `apiserver_request_total`.
const WRITE_VERBS: &[&str] = &[
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Read verbs of `apiserver_request_total` (a WATCH counts once, when it starts).
const READ_VERBS: &[&str] = &["GET", "LIST", "WATCH"];

/// `(resource, subresource, verb) -> count` of requests.
pub type Writes = BTreeMap<(String, String, String), f64>;

/// The API server's write requests so far.
pub async fn apiserver_writes(client: &Client) -> anyhow::Result<Writes> {
    apiserver_requests(client, WRITE_VERBS).await
}

/// The API server's read requests so far (GET, LIST, and WATCH starts).
pub async fn apiserver_reads(client: &Client) -> anyhow::Result<Writes> {
    apiserver_requests(client, READ_VERBS).await
}

async fn apiserver_requests(client: &Client, verbs: &[&str]) -> anyhow::Result<Writes> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = Writes::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let mut l = BTreeMap::new();
        for pair in labels.split("\",") {
            if let Some((k, v)) = pair.split_once("=\"") {
                l.insert(k, v.trim_end_matches('"'));
            }
        }
        let verb = l.get("verb").copied().unwrap_or_default();
        if !verbs.contains(&verb) {
            continue;
        }
        let key = (
            l.get("resource").copied().unwrap_or_default().to_owned(),
            l.get("subresource").copied().unwrap_or_default().to_owned(),
            verb.to_owned(),
        );
        *out.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

pub fn delta(after: &Writes, before: &Writes) -> Writes {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

pub fn sum_for(writes: &Writes, resources: &[(&str, &str)]) -> f64 {
    writes
        .iter()
        .filter(|((r, s, _), _)| resources.contains(&(r.as_str(), s.as_str())))
        .map(|(_, v)| v)
        .sum::<f64>()
        + 0.0 // an empty f64 sum is -0.0
}

pub fn print_writes(title: &str, writes: &Writes, per: f64) {
    println!("  {title}:");
    for ((r, s, verb), v) in writes {
        let name = if s.is_empty() {
            r.clone()
        } else {
            format!("{r}/{s}")
        };
        println!(
            "    {name:<28} {verb:<7} {v:>8.0}  ({:.2} per object)",
            v / per
        );
    }
}

pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub async fn wait_all<F, Fut>(
    timeout: Duration,
    what: &str,
    mut count: F,
    n: usize,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<usize>>,
{
    let start = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let done = count().await.unwrap_or(0);
        if done >= n {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("{what}: only {done}/{n} after {timeout:?}");
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!("  … {what}: {done}/{n} after {:.0?}", start.elapsed());
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// SIGTERM, then wait for the controller to exit (idempotent).
pub async fn stop(ctl: &mut tokio::process::Child, pid: u32) {
    if matches!(ctl.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = harness::process::signal(pid, "TERM");
    let _ = tokio::time::timeout(Duration::from_secs(30), ctl.wait()).await;
}

pub fn keep_logs_hint(dir: &Path) {
    println!(
        "  control-plane logs: {} (removed on exit unless APPSERVICE_KEEP_LOGS=1)",
        dir.display()
    );
}

/// `cargo test --benches` (and clippy's `--all-targets` runs) start bench targets without
/// `--bench`: a load run of minutes is not a test, so `main` returns at once then, saying
/// how to run benchmark `name`. True when this is a benchmark run.
pub fn is_bench_run(bench: bool, title: &str, name: &str) -> bool {
    if !bench {
        eprintln!("{title}: run it with `cargo bench -p appservice-controller --bench {name}`");
    }
    bench
}

/// The writes the controller makes (children, the AppService and its status). Events are
/// also written by kube-controller-manager and the scheduler, so they are reported from
/// the controller's own counter instead.
pub const CONTROLLER_RESOURCES: &[(&str, &str)] = &[
    ("deployments", ""),
    ("services", ""),
    ("poddisruptionbudgets", ""),
    ("horizontalpodautoscalers", ""),
    ("appservices", ""),
    ("appservices", "status"),
];

/// The `i`-th AppService of a benchmark.
pub fn app(i: usize, replicas: i32) -> AppService {
    common::testing::app(
        &format!("app-{i:05}"),
        &format!("registry.example.com/bench/app-{i}:v1"),
    )
    .replicas(replicas)
    .build()
}

/// The load settings of the scale and sharding benchmarks (the same flags and defaults
/// in both): `#[command(flatten)]` into a benchmark's arguments.
#[derive(clap::Args, Debug)]
pub struct Load {
    /// Client QPS of each controller process (and of scale's floor client).
    #[arg(long, default_value_t = 1000.0)]
    pub qps: f64,
    /// Client burst of each controller process (and of scale's floor client).
    #[arg(long, default_value_t = 2000)]
    pub burst: u32,
    /// Concurrency of each controller process (and of scale's floor).
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Concurrent create requests (and, in the sharding benchmark, edits) of the
    /// benchmark's own client.
    #[arg(long, default_value_t = 64)]
    pub create_concurrency: usize,
    /// Seconds to let things settle before reading steady-state memory.
    #[arg(long, default_value_t = 20)]
    pub settle_secs: u64,
}

/// How a benchmark runs the controller binary.
pub struct ControllerRun<'a> {
    pub bin: &'a Path,
    pub cp: &'a harness::ControlPlane,
    /// The namespace it watches (`--watch-namespace`); None: every namespace.
    pub ns: Option<&'a str>,
    pub ops_port: u16,
    pub qps: f64,
    pub burst: u32,
    pub concurrency: u16,
    /// Extra arguments.
    pub args: &'a [&'a str],
    /// Where its JSON log is appended: warnings only, or the filter in
    /// `APPSERVICE_BENCH_CONTROLLER_LOG` (a `RUST_LOG` value) to see what it did when.
    pub log: &'a Path,
}

impl ControllerRun<'_> {
    /// Starts the binary; returns it and its pid. The Lease lives outside the measured
    /// namespace: deleting that namespace deletes its content, and a leader that cannot
    /// re-create its Lease stops reconciling, leaving the remaining finalizers in place.
    pub fn spawn(&self) -> anyhow::Result<(tokio::process::Child, u32)> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let ctl = tokio::process::Command::new(self.bin)
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig_path())
            .args(
                self.ns
                    .map(|ns| ["--watch-namespace", ns])
                    .into_iter()
                    .flatten(),
            )
            .args(["--lease-namespace", "default"])
            .args(["--ops-addr", &format!("127.0.0.1:{}", self.ops_port)])
            .args([
                "--kube-api-qps",
                &self.qps.to_string(),
                "--kube-api-burst",
                &self.burst.to_string(),
                "--concurrency",
                &self.concurrency.to_string(),
            ])
            .args(["--log-format", "json"])
            .args(self.args)
            .env(
                "RUST_LOG",
                std::env::var("APPSERVICE_BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting the controller binary")?;
        let pid = ctl.id().context("controller pid")?;
        Ok((ctl, pid))
    }
}

/// Waits until the controller on `ops_port` is ready (its caches synced), at most
/// `timeout`; returns how long that took.
pub async fn wait_ready(ops_port: u16, timeout: Duration) -> anyhow::Result<Duration> {
    wait_all(
        timeout,
        "controller ready",
        || async {
            Ok(usize::from(
                harness::process::http_get(ops_port, "/readyz")
                    .await?
                    .contains(" 200 "),
            ))
        },
        1,
    )
    .await
}

/// The pids of `cp`'s kube-apiserver and etcd: the processes whose command line names
/// the control plane's own directory.
pub fn control_plane_pids(cp: &harness::ControlPlane) -> Vec<u32> {
    let Some(root) = cp
        .kubeconfig_path()
        .parent()
        .map(|p| p.display().to_string())
    else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            let program = cmdline.split('\0').next().unwrap_or_default();
            (program.ends_with("kube-apiserver") || program.ends_with("etcd"))
                && cmdline.contains(&root)
        })
        .collect()
}

/// The CPU seconds `pids` have used so far, together (a process gone counts 0). CPU
/// time, unlike wall-clock time, is what a configuration costs the machine: on a machine
/// whose cores the API server and the controllers share, it says who paid.
pub fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|&pid| telemetry::process::cpu_seconds_of(pid))
        .sum()
}
