//! Controller benchmark (a command, not a test):
//!
//! ```text
//! cargo bench -p appservice-controller --bench controller -- --n 1000
//! ```
//!
//! On a private full control plane (kube-apiserver, kube-controller-manager, scheduler,
//! kwok node) it runs the real controller binary, creates N AppServices at once and
//! measures the time until all are Ready, the API writes per AppService (from the
//! apiserver's `apiserver_request_total`, before and after), the writes per AppService
//! at steady state over a period, and the controller's memory (RSS). In the same run it
//! measures the floor: a plain client with the same QPS/burst creating the same
//! Deployments and Services directly, and the time until those Deployments are ready.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use controller::subject::Subject;
use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use common::AppService;
use common::conditions::{READY, TRUE};
use controller::RateLimit;
use controller::desired::{desired_deployment, desired_service};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::{
    CONTROLLER_RESOURCES, ControllerRun, apiserver_writes, app, delta, is_bench_run,
    keep_logs_hint, print_writes, rss_kib, stop, sum_for, wait_all, wait_ready,
};

#[derive(Parser, Debug)]
struct Args {
    /// Number of AppServices.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    /// Replicas per AppService.
    #[arg(long, default_value_t = 1)]
    replicas: i32,
    /// Client QPS of the controller and of the floor client.
    #[arg(long, default_value_t = 50.0)]
    qps: f64,
    /// Client burst of the controller and of the floor client.
    #[arg(long, default_value_t = 100)]
    burst: u32,
    /// Controller concurrency.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Seconds to observe writes at steady state.
    #[arg(long, default_value_t = 180)]
    steady_secs: u64,
    /// Controller resync interval during the run (shorter than the default so the steady
    /// window includes full re-checks of every object).
    #[arg(long, default_value = "60s")]
    resync: String,
    /// Give up waiting for Ready after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
    /// Skip the floor measurement.
    #[arg(long)]
    no_floor: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_bench_run(args.bench, "controller benchmark", "controller") {
        return Ok(());
    }
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let n = args.n;
    let timeout = Duration::from_secs(args.timeout_secs);
    let limit = RateLimit {
        qps: args.qps,
        burst: args.burst,
    };

    eprintln!("starting a full control plane …");
    let cp = harness::ControlPlane::start(harness::Options::full()).await?;
    let admin = cp.client();

    // ---- the controller ----------------------------------------------------------
    let ns = cp.namespace_with_prefix("bench-ctl").await?;
    let ops_port = harness::process::free_port()?;
    let log_path = cp.log_dir().join("controller-bench.log");
    let resync = ["--resync-interval", args.resync.as_str()];
    let (mut ctl, pid) = ControllerRun {
        bin: Path::new(env!("CARGO_BIN_EXE_appservice-controller")),
        cp: &cp,
        ns: Some(&ns),
        ops_port,
        qps: args.qps,
        burst: args.burst,
        concurrency: args.concurrency,
        args: &resync,
        log: &log_path,
    }
    .spawn()?;
    wait_ready(ops_port, Duration::from_secs(60)).await?;
    let (rss_idle, _) = rss_kib(pid);

    let apps: Api<AppService> = Api::namespaced(admin.clone(), &ns);
    let before = apiserver_writes(&admin).await?;
    eprintln!("creating {n} AppServices …");
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let apps = apps.clone();
            async move {
                apps.create(&PostParams::default(), &app(i, args.replicas))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created_in = started.elapsed();
    let all_ready = wait_all(
        timeout,
        "AppServices Ready",
        || async {
            let list = apps.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .filter(|a| {
                    a.status.as_ref().is_some_and(|s| {
                        common::conditions::find(&s.conditions, READY)
                            .is_some_and(|c| c.status == TRUE)
                    })
                })
                .count())
        },
        n,
    )
    .await?;
    let time_to_ready = started.elapsed();
    let _ = all_ready;
    let after_converge = apiserver_writes(&admin).await?;
    let (rss_converged, hwm) = rss_kib(pid);
    let converge = delta(&after_converge, &before);
    let ctl_metrics = harness::process::http_get(ops_port, "/metrics")
        .await
        .unwrap_or_default();

    eprintln!(
        "all Ready; observing steady state for {}s …",
        args.steady_secs
    );
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let after_steady = apiserver_writes(&admin).await?;
    let steady = delta(&after_steady, &after_converge);
    let (rss_steady, hwm_steady) = rss_kib(pid);
    let ctl_metrics_steady = harness::process::http_get(ops_port, "/metrics")
        .await
        .unwrap_or_default();

    // ---- the floor ---------------------------------------------------------------
    let floor = if args.no_floor {
        None
    } else {
        // Free the first run's Service IPs (the harness's service range is small) and
        // its Pods before measuring the floor on the same control plane. The controller
        // still runs: it removes the finalizers of any AppService that has one, so the
        // namespace can go.
        eprintln!("deleting the controller's namespace …");
        let ctl_services: Api<Service> = Api::namespaced(admin.clone(), &ns);
        let ns_name = ns.to_string();
        ns.cleanup().await?;
        wait_all(
            timeout,
            "controller namespace emptied",
            || async {
                let left = ctl_services
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items.len())
                    .unwrap_or(0);
                let ns_gone = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
                    .get_opt(&ns_name)
                    .await?
                    .is_none();
                Ok(usize::from(left == 0 && ns_gone))
            },
            1,
        )
        .await?;
        stop(&mut ctl, pid).await;
        let fns = cp.namespace_with_prefix("bench-floor").await?;
        let floor_client = controller::client::build_client(cp.admin_config(), limit)?;
        let deployments: Api<Deployment> = Api::namespaced(floor_client.clone(), &fns);
        let services: Api<Service> = Api::namespaced(floor_client.clone(), &fns);
        let before = apiserver_writes(&admin).await?;
        eprintln!(
            "floor: creating {n} Deployments and Services at {} QPS …",
            args.qps
        );
        let started = Instant::now();
        futures::stream::iter(0..n)
            .map(|i| {
                let (deployments, services, fns) =
                    (deployments.clone(), services.clone(), fns.to_string());
                async move {
                    let mut a = app(i, args.replicas);
                    a.metadata.namespace = Some(fns);
                    a.metadata.uid = Some(format!("00000000-0000-0000-0000-{i:012}"));
                    // Same objects, but no owner (the garbage collector would delete
                    // dependents of an owner that does not exist).
                    let mut d = desired_deployment(
                        &Subject::of(&a)?,
                        &controller::external::PodAdditions::default(),
                    );
                    d.metadata.owner_references = None;
                    let mut s = desired_service(&Subject::of(&a)?);
                    s.metadata.owner_references = None;
                    deployments.create(&PostParams::default(), &d).await?;
                    services.create(&PostParams::default(), &s).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let ready_in = {
            let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &fns);
            let replicas = args.replicas;
            wait_all(
                timeout,
                "floor Deployments ready",
                || async {
                    let list = deployments.list(&ListParams::default()).await?;
                    Ok(list
                        .items
                        .iter()
                        .filter(|d| {
                            d.status
                                .as_ref()
                                .and_then(|s| s.ready_replicas)
                                .unwrap_or(0)
                                >= replicas
                        })
                        .count())
                },
                n,
            )
            .await?;
            started.elapsed()
        };
        let after = apiserver_writes(&admin).await?;
        Some((ready_in, delta(&after, &before)))
    };

    stop(&mut ctl, pid).await;

    // ---- report ------------------------------------------------------------------
    let nf = n as f64;
    let metric = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .filter_map(|l| {
                l.strip_prefix(prefix)
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .sum()
    };
    let events_converge = metric(
        &ctl_metrics,
        "appservice_controller_api_writes_total{resource=\"events\"}",
    );
    let events_total = metric(
        &ctl_metrics_steady,
        "appservice_controller_api_writes_total{resource=\"events\"}",
    );
    let ctl_writes_converge = sum_for(&converge, CONTROLLER_RESOURCES);
    let ctl_writes_steady = sum_for(&steady, CONTROLLER_RESOURCES);

    println!();
    println!(
        "controller benchmark: N={n} AppServices × {} replicas, client {} QPS / burst {}, concurrency {}",
        args.replicas, args.qps, args.burst, args.concurrency
    );
    println!("  created {n} AppServices in {created_in:.1?}; all Ready after {time_to_ready:.1?}");
    println!(
        "  controller writes to converge: {ctl_writes_converge:.0} ({:.2} per AppService) + {events_converge:.0} events ({:.2} per AppService)",
        ctl_writes_converge / nf,
        events_converge / nf
    );
    print_writes(
        "apiserver write requests while converging (all clients)",
        &converge,
        nf,
    );
    println!(
        "  steady state over {}s (resync every {}): {ctl_writes_steady:.0} controller writes ({:.4} per AppService), {:.0} events",
        args.steady_secs,
        args.resync,
        ctl_writes_steady / nf,
        (events_total - events_converge).max(0.0)
    );
    print_writes(
        "apiserver write requests at steady state (all clients)",
        &steady,
        nf,
    );
    println!(
        "  controller RSS: {:.1} MiB idle, {:.1} MiB after converging, {:.1} MiB at steady state, peak {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_converged as f64 / 1024.0,
        rss_steady as f64 / 1024.0,
        hwm.max(hwm_steady) as f64 / 1024.0
    );
    if let Some((floor_time, floor_writes)) = floor {
        let floor_ctl = sum_for(&floor_writes, &[("deployments", ""), ("services", "")]);
        println!(
            "  floor (plain client, same QPS): {floor_ctl:.0} writes ({:.2} per app), Deployments ready after {floor_time:.1?}",
            floor_ctl / nf
        );
        println!(
            "  ratio controller/floor: writes {:.2}× (incl. events {:.2}×), time to ready {:.2}×",
            ctl_writes_converge / floor_ctl.max(1.0),
            (ctl_writes_converge + events_converge) / floor_ctl.max(1.0),
            time_to_ready.as_secs_f64() / floor_time.as_secs_f64().max(0.001)
        );
    }
    println!("  controller log: {}", log_path.display());
    keep_logs_hint(cp.log_dir());
    Ok(())
}
