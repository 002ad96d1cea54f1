//! Controller scale benchmark (a command, not a test):
//!
//! ```text
//! cargo bench -p appservice-controller --bench scale -- --n 1000
//! cargo bench -p appservice-controller --bench scale -- --n 10000 --no-floor
//! cargo bench -p appservice-controller --bench scale -- --n 5000 --precreate
//! ```
//!
//! On a private *plain* control plane (kube-apiserver and etcd, no Pods), so that the
//! controller rather than the pod pipeline is measured:
//!
//! 1. **Reaction**: the real controller binary runs; N AppServices are created in a burst;
//!    per object, the time from its create request to the first watch event showing
//!    `status.observedGeneration` (written after both children), p50/p99/max and in all.
//! 2. **Memory**: the controller's RSS idle, after converging and settling, and its peak;
//!    KiB per AppService (with its two children) at steady state.
//! 3. **Restart**: the controller is stopped and started again with everything converged:
//!    time until `/readyz` (caches synced), writes it makes (should be 0), its peak RSS
//!    during the initial list against its steady RSS.
//! 4. **Floor**: in another namespace, a plain client at the same QPS budget and
//!    concurrency reacts to the same burst with the same four writes per AppService
//!    (finalizer, Deployment, Service, status) and is timed the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use controller::subject::Subject;
use std::time::{Duration, Instant};

use clap::Parser;
use common::AppService;
use common::names::FIELD_MANAGER;
use controller::RateLimit;
use controller::desired::{desired_deployment, desired_service};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::converge::{burst, latencies, started_now, wait_done, watch_status};
use support::{
    CONTROLLER_RESOURCES, ControllerRun, apiserver_writes, delta, is_bench_run, keep_logs_hint,
    print_writes, rss_kib, stop, sum_for, wait_ready,
};

#[derive(Parser, Debug)]
struct Args {
    /// Number of AppServices.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    #[command(flatten)]
    load: support::Load,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
    /// Skip the floor measurement.
    #[arg(long)]
    no_floor: bool,
    /// Skip the restart measurement.
    #[arg(long)]
    no_restart: bool,
    /// Create the AppServices first and only then start the controller (and the floor's
    /// client): times are measured from its start, as for a controller deployed into a
    /// cluster full of AppServices.
    #[arg(long)]
    precreate: bool,
    /// The controller binary to measure (default: the one built with this benchmark),
    /// e.g. a copy of an earlier build for a before/after comparison.
    #[arg(long)]
    controller_bin: Option<std::path::PathBuf>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn start_controller(
    cp: &harness::ControlPlane,
    args: &Args,
    ns: &str,
    ops_port: u16,
    log: &std::path::Path,
) -> anyhow::Result<(tokio::process::Child, u32)> {
    let default_bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_appservice-controller"));
    ControllerRun {
        bin: args.controller_bin.as_ref().unwrap_or(&default_bin),
        cp,
        ns: Some(ns),
        ops_port,
        qps: args.load.qps,
        burst: args.load.burst,
        concurrency: args.load.concurrency,
        args: &[],
        log,
    }
    .spawn()
}

fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            rest.rsplit_once(' ')
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        })
        .sum()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_bench_run(args.bench, "controller scale benchmark", "scale") {
        return Ok(());
    }
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let n = args.n;
    let nf = n as f64;
    let timeout = Duration::from_secs(args.timeout_secs);
    let settle = Duration::from_secs(args.load.settle_secs);

    eprintln!("starting a plain control plane …");
    let cp = harness::ControlPlane::start(harness::Options::plain()).await?;
    let admin = cp.client();

    // ---- reaction and memory ------------------------------------------------------
    let ns = cp.namespace_with_prefix("scale-ctl").await?;
    let ops_port = harness::process::free_port()?;
    let log_path = cp.log_dir().join("controller-scale.log");
    let (mut ctl, pid) = start_controller(&cp, &args, &ns, ops_port, &log_path)?;
    wait_ready(ops_port, Duration::from_secs(600)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_idle, _) = rss_kib(pid);

    let apps: Api<AppService> = Api::namespaced(admin.clone(), &ns);
    let done = watch_status(admin.clone(), &ns, 1);
    let before = apiserver_writes(&admin).await?;
    let (created, pid) = if args.precreate {
        stop(&mut ctl, pid).await;
        eprintln!("creating {n} AppServices with the controller stopped …");
        let created = burst(&apps, n, args.load.create_concurrency).await?;
        eprintln!("starting the controller …");
        let (ctl2, pid2) = start_controller(&cp, &args, &ns, ops_port, &log_path)?;
        ctl = ctl2;
        (started_now(created), pid2)
    } else {
        eprintln!("creating {n} AppServices in a burst …");
        (burst(&apps, n, args.load.create_concurrency).await?, pid)
    };
    wait_done(&done, n, timeout, "AppServices with children and status").await?;
    let reaction = latencies(&created, &done);
    let converge = delta(&apiserver_writes(&admin).await?, &before);
    eprintln!("converged; settling for {settle:?} …");
    tokio::time::sleep(settle).await;
    let (rss_steady, hwm) = rss_kib(pid);

    // ---- restart ------------------------------------------------------------------
    let restart = if args.no_restart {
        None
    } else {
        stop(&mut ctl, pid).await;
        eprintln!("restarting the controller with {n} converged AppServices …");
        let before = apiserver_writes(&admin).await?;
        let started = Instant::now();
        let (ctl2, pid2) = start_controller(&cp, &args, &ns, ops_port, &log_path)?;
        ctl = ctl2;
        wait_ready(ops_port, Duration::from_secs(600)).await?;
        let ready_in = started.elapsed();
        tokio::time::sleep(settle).await;
        let writes = sum_for(
            &delta(&apiserver_writes(&admin).await?, &before),
            CONTROLLER_RESOURCES,
        );
        let metrics = harness::process::http_get(ops_port, "/metrics")
            .await
            .unwrap_or_default();
        let own_writes = metric_sum(&metrics, "appservice_controller_api_writes_total{");
        let (rss2, hwm2) = rss_kib(pid2);
        stop(&mut ctl, pid2).await;
        Some((ready_in, writes, own_writes, rss2, hwm2))
    };
    stop(&mut ctl, pid).await;

    // ---- floor --------------------------------------------------------------------
    let floor = if args.no_floor {
        None
    } else {
        let fns = cp.namespace_with_prefix("scale-floor").await?;
        let client = controller::client::build_client(
            cp.admin_config(),
            RateLimit {
                qps: args.load.qps,
                burst: args.load.burst,
            },
        )?;
        let fdone = watch_status(admin.clone(), &fns, 1);
        let fapps: Api<AppService> = Api::namespaced(admin.clone(), &fns);
        let before = apiserver_writes(&admin).await?;
        eprintln!("floor: the same burst, a plain client making the same writes …");
        let (workers, fcreated) = if args.precreate {
            let fcreated = burst(&fapps, n, args.load.create_concurrency).await?;
            let fcreated = started_now(fcreated);
            let workers = floor_workers(client, fns.to_string(), args.load.concurrency as usize);
            (workers, fcreated)
        } else {
            let workers = floor_workers(client, fns.to_string(), args.load.concurrency as usize);
            (
                workers,
                burst(&fapps, n, args.load.create_concurrency).await?,
            )
        };
        wait_done(&fdone, n, timeout, "floor AppServices with status").await?;
        let writes = sum_for(
            &delta(&apiserver_writes(&admin).await?, &before),
            CONTROLLER_RESOURCES,
        ) - nf;
        workers.abort();
        Some((latencies(&fcreated, &fdone), writes))
    };

    // ---- report -------------------------------------------------------------------
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!();
    println!(
        "controller scale benchmark: N={n} AppServices {}, plain control plane (no Pods), client {} QPS / burst {}, concurrency {}",
        if args.precreate {
            "created first, then the controller started (times from its start)"
        } else {
            "in a burst"
        },
        args.load.qps,
        args.load.burst,
        args.load.concurrency
    );
    println!(
        "  controller: all converged in {:.1?}; per object p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        reaction.total,
        ms(reaction.p50),
        ms(reaction.p99),
        ms(reaction.max)
    );
    // The burst's own creates are not the controller's.
    let ctl_writes = sum_for(&converge, CONTROLLER_RESOURCES) - nf;
    println!(
        "  controller writes to converge: {ctl_writes:.0} ({:.2} per AppService)",
        ctl_writes / nf
    );
    print_writes("apiserver write requests while converging", &converge, nf);
    println!(
        "  controller RSS: {:.1} MiB idle, {:.1} MiB at steady state, peak {:.1} MiB; {:.1} KiB per AppService (steady minus idle, children included)",
        rss_idle as f64 / 1024.0,
        rss_steady as f64 / 1024.0,
        hwm as f64 / 1024.0,
        rss_steady.saturating_sub(rss_idle) as f64 / nf
    );
    if let Some((ready_in, writes, own, rss2, hwm2)) = restart {
        println!(
            "  restart: ready (caches synced) after {ready_in:.1?}; {writes:.0} writes at the API server ({own:.0} by the controller's count); RSS {:.1} MiB after settling, peak {:.1} MiB ({:.2}× steady)",
            rss2 as f64 / 1024.0,
            hwm2 as f64 / 1024.0,
            hwm2 as f64 / rss2.max(1) as f64
        );
    }
    if let Some((f, writes)) = floor {
        println!(
            "  floor (plain client, same QPS and concurrency, {writes:.0} writes): all done in {:.1?}; per object p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            f.total,
            ms(f.p50),
            ms(f.p99),
            ms(f.max)
        );
        println!(
            "  ratio controller/floor: total {:.2}×, p50 {:.2}×, p99 {:.2}×",
            reaction.total.as_secs_f64() / f.total.as_secs_f64().max(0.001),
            reaction.p50.as_secs_f64() / f.p50.as_secs_f64().max(0.000_001),
            reaction.p99.as_secs_f64() / f.p99.as_secs_f64().max(0.000_001)
        );
    }
    println!("  controller log: {}", log_path.display());
    keep_logs_hint(cp.log_dir());
    Ok(())
}

/// The floor: a watch-driven worker pool making, per new AppService, the writes the
/// controller makes, with nothing else (no caches of children, no comparison).
fn floor_workers(client: Client, ns: String, concurrency: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let apps: Api<AppService> = Api::namespaced(client.clone(), &ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        let stream = watcher(apps.clone(), watcher::Config::default())
            .applied_objects()
            .filter_map(|r| async move { r.ok() })
            .filter(|a| futures::future::ready(a.status.is_none()));
        stream
            .for_each_concurrent(concurrency, |a| {
                let (apps, deployments, services) =
                    (apps.clone(), deployments.clone(), services.clone());
                async move {
                    let name = a.name_any();
                    let apply = PatchParams::apply(FIELD_MANAGER).force();
                    let r = async {
                        // No finalizer: these AppServices have no database.
                        deployments
                            .patch(
                                &name,
                                &apply,
                                &Patch::Apply(&desired_deployment(
                                    &Subject::of(&a)?,
                                    &controller::external::PodAdditions::default(),
                                )),
                            )
                            .await?;
                        services
                            .patch(
                                &name,
                                &apply,
                                &Patch::Apply(&desired_service(&Subject::of(&a)?)),
                            )
                            .await?;
                        apps.patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(
                                json!({"status": {"observedGeneration": a.metadata.generation}}),
                            ),
                        )
                        .await?;
                        anyhow::Ok(())
                    }
                    .await;
                    if let Err(e) = r {
                        eprintln!("floor: {name}: {e}");
                    }
                }
            })
            .await;
    })
}
