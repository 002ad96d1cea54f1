//! Sharding benchmark (a command, not a test):
//!
//! ```text
//! cargo bench -p appservice-controller --bench shards -- --n 20000 --shards 0,1,4
//! cargo bench -p appservice-controller --bench shards -- --n 5000 --shards 0,1,4 \
//!   --baseline-bin ~/.cache/appservice-operator/cr-baseline/appservice-cr-baseline \
//!   --other-bin before=/path/to/an/earlier/appservice-controller
//! ```
//!
//! On a private *plain* control plane (no Pods), for each entry of `--shards` (0: one
//! leader, sharding off, the default; k ≥ 1: k controller processes with `--sharding`),
//! and for the controller-runtime baseline when `--baseline-bin` is given (measured first,
//! so the ratios are against it), in the same run:
//!
//! 1. **Converge**: N AppServices are created first, then the controllers start; the time
//!    until every one shows `status.observedGeneration` (read from a watch of our own),
//!    the API server's write requests per AppService (each configuration's breakdown by
//!    resource and verb is printed as it ends), and the CPU time the API server and etcd
//!    spent until then, and the controllers: on a machine whose cores they share, the
//!    cost of a configuration that wall-clock time alone hides.
//! 2. **Memory**: each process's peak RSS (VmHWM) and its RSS after settling.
//! 3. **Handover** (k ≥ 2): one shard that does not lead the ring is SIGKILLed, and every
//!    AppService it owned gets a spec edit at once; per object, the time from its edit to
//!    its new `observedGeneration` (p50/p99/max): how long an object waits for a
//!    controller when its shard dies.
//!
//! Each configuration runs on a control plane of its own, started fresh for it and stopped
//! after it: none inherits another's history (the API server's watch cache and heap,
//! etcd's revisions), which made the first configuration the cheapest when they shared
//! one, and none waits for another's objects to be deleted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use common::AppService;
use common::names::shard_lease_name;
use controller::sharding::buckets::Buckets;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::converge::{
    Latencies, burst_over, latencies, started_now, wait_done, watch_status_of,
};
use support::{
    CONTROLLER_RESOURCES, ControllerRun, apiserver_reads, apiserver_writes, control_plane_pids,
    cpu_of, delta, is_bench_run, keep_logs_hint, print_writes, rss_kib, stop, sum_for, wait_ready,
};

#[derive(Parser, Debug)]
struct Args {
    /// Number of AppServices per configuration.
    #[arg(long, default_value_t = 20000)]
    n: usize,
    /// The configurations: 0 is one leader without sharding; k ≥ 1 is k shards.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4")]
    shards: Vec<usize>,
    #[command(flatten)]
    load: support::Load,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    /// A controller-runtime build of the same job (see `cargo xtask build-cr-baseline`),
    /// measured as one more configuration (one process).
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Another build of this controller, as `LABEL=PATH` (an earlier commit's binary),
    /// measured as one leader without sharding right after the baseline: a before and
    /// an after in one run. Repeatable.
    #[arg(long = "other-bin", value_parser = label_and_path)]
    other_bins: Vec<(String, PathBuf)>,
    /// Every control plane with the alpha gate `ShardedListAndWatch`, and the shards with
    /// `--sharded-watch` (the API server filters their watches by bucket; without it each
    /// shard filters its own). Shards divide by namespace bucket either way, so spread the
    /// AppServices with `--namespaces`; the handover moves the AppServices of the
    /// namespaces whose buckets the killed shard's Lease claimed.
    #[arg(long)]
    sharded_watch: bool,
    /// How many namespaces the AppServices are spread over (round robin). With more than
    /// one the controllers watch every namespace (no `--watch-namespace`).
    #[arg(long, default_value_t = 1)]
    namespaces: usize,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `LABEL=PATH` of `--other-bin`.
fn label_and_path(arg: &str) -> Result<(String, PathBuf), String> {
    match arg.split_once('=') {
        Some((label, path)) if !label.is_empty() && !path.is_empty() => {
            Ok((label.to_owned(), PathBuf::from(path)))
        }
        _ => Err(format!("{arg:?}: expected LABEL=PATH")),
    }
}

/// What one configuration measured.
struct Run {
    name: String,
    converge: Latencies,
    writes_per_app: f64,
    /// Per process: (peak, steady) RSS in KiB.
    rss: Vec<(u64, u64)>,
    /// CPU seconds per 1,000 AppServices until converged: the API server and etcd
    /// together, and the controller processes together.
    cpu_control_plane: f64,
    cpu_controllers: f64,
    handover: Option<(usize, Latencies)>,
}

/// One running controller process.
struct Process {
    identity: String,
    child: tokio::process::Child,
    pid: u32,
    ops_port: u16,
}

/// Starts the processes of one configuration: one `bin` process when `shards` is 0,
/// else `shards` of them with `--sharding` on the ring `ring`.
fn spawn(
    cp: &harness::ControlPlane,
    args: &Args,
    bin: &Path,
    ns: Option<&str>,
    shards: usize,
    ring: &str,
    log: &Path,
) -> anyhow::Result<Vec<Process>> {
    let mut processes = Vec::new();
    for i in 0..shards.max(1) {
        let identity = format!("{ring}-{i}");
        let ops_port = harness::process::free_port()?;
        let mut extra: Vec<String> = Vec::new();
        if shards >= 1 && args.sharded_watch {
            extra.push("--sharded-watch".to_owned());
        }
        if shards >= 1 {
            extra.extend(
                [
                    "--sharding",
                    "--shard-ring",
                    ring,
                    "--lease-name",
                    ring,
                    "--identity",
                    &identity,
                ]
                .map(str::to_owned),
            );
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (child, pid) = ControllerRun {
            bin,
            cp,
            ns,
            ops_port,
            qps: args.load.qps,
            burst: args.load.burst,
            concurrency: args.load.concurrency,
            args: &extra,
            log,
        }
        .spawn()?;
        processes.push(Process {
            identity,
            child,
            pid,
            ops_port,
        });
    }
    Ok(processes)
}

/// With `APPSERVICE_APISERVER_PROFILING` set (the harness then turns on the API server's
/// `/debug/pprof`): a CPU profile of the API server over `seconds`, taken once half the
/// AppServices have converged, written to `path` (read it with `go tool pprof -top`).
/// The same point of every configuration's convergence, so their profiles compare.
/// With `APPSERVICE_APISERVER_PROFILING=whole`: back-to-back profiles of `seconds` from
/// the start until every AppService converged, to `path` with `.<i>` before its
/// extension (merge them with `go tool pprof -proto`), so the whole run's cost compares.
fn profile_midway(
    client: kube::Client,
    done: support::converge::Done,
    n: usize,
    seconds: u64,
    path: PathBuf,
) -> Option<tokio::task::JoinHandle<()>> {
    let mode = std::env::var("APPSERVICE_APISERVER_PROFILING").ok()?;
    let converged = move || done.lock().map(|d| d.len()).unwrap_or(0);
    if mode == "whole" {
        return Some(tokio::spawn(async move {
            let mut window = 0;
            while converged() < n {
                let part = path.with_extension(format!("{window}.pprof"));
                if let Err(e) = take_profile(&client, seconds, &part).await {
                    eprintln!("API server CPU profile {window} not taken: {e:#}");
                    return;
                }
                window += 1;
            }
            eprintln!(
                "API server CPU profiles ({window} × {seconds} s from the start): {}",
                path.with_extension("*.pprof").display()
            );
        }));
    }
    Some(tokio::spawn(async move {
        while converged() < n / 2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        match take_profile(&client, seconds, &path).await {
            Ok(bytes) => eprintln!(
                "API server CPU profile ({seconds} s from half converged, {bytes} bytes): go tool pprof -top {}",
                path.display()
            ),
            Err(e) => eprintln!("API server CPU profile not taken: {e:#}"),
        }
    }))
}

/// One CPU profile of the API server over `seconds`, written to `path`; its size.
async fn take_profile(client: &kube::Client, seconds: u64, path: &Path) -> anyhow::Result<usize> {
    use futures::AsyncReadExt as _;
    let req =
        http::Request::get(format!("/debug/pprof/profile?seconds={seconds}")).body(Vec::new())?;
    let mut body = Vec::new();
    client
        .request_stream(req)
        .await?
        .read_to_end(&mut body)
        .await?;
    std::fs::write(path, &body)?;
    Ok(body.len())
}

/// Edits every AppService of `names` (namespace and name: a new spec.replicas),
/// returning when each edit was sent.
async fn edit_all(
    client: &kube::Client,
    names: Vec<(String, String)>,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let edited = futures::stream::iter(names)
        .map(|(ns, name)| {
            let apps: Api<AppService> = Api::namespaced(client.clone(), &ns);
            async move {
                let at = Instant::now();
                apps.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": 2}})),
                )
                .await?;
                anyhow::Ok((name, at))
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    edited.into_iter().collect()
}

/// One configuration, on a fresh control plane of its own: precreate, start, converge,
/// settle, and for two shards or more the handover of a killed one.
async fn measure(args: &Args, name: &str, bin: &Path, shards: usize) -> anyhow::Result<Run> {
    eprintln!("{name}: starting a plain control plane …");
    let options = if args.sharded_watch {
        harness::Options::plain().with_sharded_watch()
    } else {
        harness::Options::plain()
    };
    let cp = &harness::ControlPlane::start(options).await?;
    let admin = &cp.client();
    let n = args.n;
    let timeout = Duration::from_secs(args.timeout_secs);
    let ring = format!("bench-{}", name.replace([' ', ','], "-"));
    let mut namespaces = Vec::new();
    for _ in 0..args.namespaces.max(1) {
        namespaces.push(cp.namespace_with_prefix("shards").await?);
    }
    let apis: Vec<Api<AppService>> = namespaces
        .iter()
        .map(|ns| Api::namespaced(admin.clone(), ns))
        .collect();
    // One namespace: the controllers watch it alone; more: every namespace.
    let (scope, every): (Option<&str>, Api<AppService>) = match namespaces.as_slice() {
        [ns] => (Some(ns), Api::namespaced(admin.clone(), ns)),
        _ => (None, Api::all(admin.clone())),
    };
    eprintln!(
        "{name}: creating {n} AppServices in {} namespace(s) with no controller running …",
        namespaces.len()
    );
    let created = burst_over(&apis, n, args.load.create_concurrency).await?;
    let done = watch_status_of(every.clone(), 1);
    let before = apiserver_writes(admin).await?;
    let reads_before = apiserver_reads(admin).await?;
    let control_plane = control_plane_pids(cp);
    let cpu_before = cpu_of(&control_plane);
    let log = cp.log_dir().join(format!("{ring}.log"));
    eprintln!("{name}: starting {} process(es) …", shards.max(1));
    let started = started_now(created);
    let mut processes = spawn(cp, args, bin, scope, shards, &ring, &log)?;
    let profile = profile_midway(
        admin.clone(),
        done.clone(),
        n,
        30,
        cp.log_dir().join(format!("apiserver-{ring}.pprof")),
    );
    wait_done(&done, n, timeout, &format!("{name}: converged")).await?;
    let converge = latencies(&started, &done);
    let per_thousand = 1000.0 / n as f64;
    let cpu_control_plane = (cpu_of(&control_plane) - cpu_before) * per_thousand;
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let cpu_controllers = cpu_of(&pids) * per_thousand;
    let written = delta(&apiserver_writes(admin).await?, &before);
    let writes = sum_for(&written, CONTROLLER_RESOURCES);
    print_writes(
        &format!("{name}: API writes until converged"),
        &written,
        n as f64,
    );
    print_writes(
        &format!("{name}: API reads until converged (WATCH: when one starts)"),
        &delta(&apiserver_reads(admin).await?, &reads_before),
        n as f64,
    );
    if let Some(profile) = profile {
        let _ = profile.await;
    }
    for p in &processes {
        wait_ready(p.ops_port, Duration::from_secs(60)).await?;
    }
    tokio::time::sleep(Duration::from_secs(args.load.settle_secs)).await;
    let rss = processes
        .iter()
        .map(|p| {
            let (now, peak) = rss_kib(p.pid);
            (peak, now)
        })
        .collect();

    let handover = if shards >= 2 {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
        let leader = leases
            .get_opt(&ring)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        let victim = processes
            .iter()
            .position(|p| p.identity != leader)
            .expect("two shards or more: one does not lead");
        // What the victim owns: the namespaces of the buckets its Lease claims.
        let identity = &processes[victim].identity;
        let lease = leases.get(&shard_lease_name(&ring, identity)).await?;
        let claims = lease
            .annotations()
            .get(controller::sharding::claims::ANNOTATION)
            .and_then(|hex| Buckets::from_hex(hex))
            .unwrap_or(Buckets::NONE);
        let owned: Vec<(String, String)> = every
            .list_metadata(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|a| (a.namespace().unwrap_or_default(), a.name_any()))
            .filter(|(ns, _)| claims.contains_namespace(ns))
            .collect();
        let edited_done = watch_status_of(every.clone(), 2);
        eprintln!(
            "{name}: SIGKILL of {} (owns {}), then an edit of each of its AppServices …",
            processes[victim].identity,
            owned.len()
        );
        harness::process::signal(processes[victim].pid, "KILL")?;
        let count = owned.len();
        let edited = edit_all(admin, owned, args.load.create_concurrency).await?;
        wait_done(
            &edited_done,
            count,
            timeout,
            &format!("{name}: handed over"),
        )
        .await?;
        Some((count, latencies(&edited, &edited_done)))
    } else {
        None
    };
    // Each configuration's figures as soon as they are measured, before the clean-up (a
    // long run can be read early, and a clean-up that fails loses nothing).
    eprintln!(
        "{name}: converged in {:.1} s, {:.2} writes per AppService, CPU s per 1,000 AppServices: control plane {cpu_control_plane:.1}, controllers {cpu_controllers:.1}; RSS KiB (peak, steady) {rss:?}{}",
        converge.total.as_secs_f64(),
        writes / n as f64,
        handover
            .as_ref()
            .map(|(count, h)| format!(
                "; handover of {count}: p50 {:.1} s, p99 {:.1} s, max {:.1} s",
                h.p50.as_secs_f64(),
                h.p99.as_secs_f64(),
                h.max.as_secs_f64()
            ))
            .unwrap_or_default()
    );
    for p in &mut processes {
        stop(&mut p.child, p.pid).await;
    }
    keep_logs_hint(cp.log_dir());
    Ok(Run {
        name: name.to_owned(),
        converge,
        writes_per_app: writes / n as f64,
        rss,
        cpu_control_plane,
        cpu_controllers,
        handover,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_bench_run(args.bench, "sharding benchmark", "shards") {
        return Ok(());
    }
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let ours = PathBuf::from(env!("CARGO_BIN_EXE_appservice-controller"));
    let mut runs = Vec::new();
    // The baseline first: the ratios below are against it, and a run cut short still
    // has it.
    if let Some(bin) = &args.baseline_bin {
        runs.push(measure(&args, "controller-runtime baseline", bin, 0).await?);
    }
    for (label, bin) in &args.other_bins {
        runs.push(measure(&args, label, bin, 0).await?);
    }
    for &shards in &args.shards {
        let name = match shards {
            0 => "one leader (no sharding)".to_owned(),
            1 => "1 shard".to_owned(),
            k => format!("{k} shards"),
        };
        runs.push(measure(&args, &name, &ours, shards).await?);
    }

    let secs = |d: Duration| d.as_secs_f64();
    println!();
    println!(
        "sharding benchmark: N={} AppServices in {} namespace(s) created first, then the controllers started; plain control plane (no Pods){}; per process {} QPS / burst {}, concurrency {}",
        args.n,
        args.namespaces.max(1),
        if args.sharded_watch {
            " with ShardedListAndWatch, shards with --sharded-watch"
        } else {
            ""
        },
        args.load.qps,
        args.load.burst,
        args.load.concurrency
    );
    let base = runs.first().map(|r| secs(r.converge.total)).unwrap_or(0.0);
    let base_cpu = runs.first().map(|r| r.cpu_control_plane).unwrap_or(0.0);
    for r in &runs {
        let peak: Vec<String> = r
            .rss
            .iter()
            .map(|(p, s)| format!("{:.0}/{:.0}", *p as f64 / 1024.0, *s as f64 / 1024.0))
            .collect();
        println!(
            "  {:<30} converged in {:>7.1} s ({:.2}× the first run); per object p50 {:.1} s, p99 {:.1} s; {:.2} writes per AppService; CPU s per 1,000 AppServices: control plane {:.1} ({:.2}× the first run), controllers {:.1}; RSS MiB peak/steady per process: {}",
            r.name,
            secs(r.converge.total),
            secs(r.converge.total) / base.max(0.001),
            secs(r.converge.p50),
            secs(r.converge.p99),
            r.writes_per_app,
            r.cpu_control_plane,
            r.cpu_control_plane / base_cpu.max(0.001),
            r.cpu_controllers,
            peak.join(", ")
        );
        if let Some((count, h)) = &r.handover {
            println!(
                "  {:<30} handover after SIGKILL of a shard ({count} AppServices edited at once): p50 {:.1} s, p99 {:.1} s, max {:.1} s",
                "",
                secs(h.p50),
                secs(h.p99),
                secs(h.max)
            );
        }
    }
    Ok(())
}
