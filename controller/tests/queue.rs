//! The work-queue metrics of a controller running against a real kube-apiserver: every
//! trigger is counted, each reconcile leaves the queue, requeues come back, a child's
//! deletion wakes its owner through the queue, and nothing stays queued once the
//! AppServices are gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::conditions::READY;
use harness::eventually;
use kube::api::{DeleteParams, ListParams};
use support::{Fixture, app, condition, create};

const WAIT: Duration = Duration::from_secs(30);

/// The value of the series `name{labels}` in a scrape, if present.
fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn queue_metrics_follow_the_work() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;
    let queue = ctl.metrics.queue().clone();

    for name in ["q1", "q2", "q3"] {
        create(&f.apps, &app(name, "registry.example.com/q:v1", 1)).await?;
    }
    for name in ["q1", "q2", "q3"] {
        eventually("status", WAIT, || async {
            Ok(condition(&f.apps.get(name).await?, READY).map(|_| ()))
        })
        .await?;
    }
    // Without kube-controller-manager no Pod becomes ready: every pass asks to look
    // again after the rollout requeue (10 s, as shipped).
    eventually("requeued reconciles", WAIT, || async {
        Ok((queue.reconciles(controller::queue::ReconcileResult::Requeue) >= 6).then_some(()))
    })
    .await?;
    let scrape = ctl.metrics.encode()?;
    let adds = value(&scrape, "workqueue_adds_total{name=\"appservice\"}").unwrap();
    let waits = value(
        &scrape,
        "workqueue_queue_duration_seconds_count{name=\"appservice\"}",
    )
    .unwrap();
    let works = value(
        &scrape,
        "workqueue_work_duration_seconds_count{name=\"appservice\"}",
    )
    .unwrap();
    let reconciled = value(
        &scrape,
        "controller_runtime_reconcile_total{controller=\"appservice\",result=\"requeue\"}",
    )
    .unwrap();
    assert!(
        adds >= 6.0,
        "3 creates and their requeues, saw {adds}\n{scrape}"
    );
    assert!(reconciled >= 6.0, "{scrape}");
    // Every reconcile that started left the queue (waits) and most have ended (works).
    assert!(waits >= works && works >= reconciled, "{scrape}");
    assert_eq!(
        value(
            &scrape,
            "controller_runtime_reconcile_total{controller=\"appservice\",result=\"error\"}"
        ),
        Some(0.0),
        "{scrape}"
    );
    assert_eq!(
        value(
            &scrape,
            "controller_runtime_max_concurrent_reconciles{controller=\"appservice\"}"
        ),
        Some(4.0)
    );
    // Three objects requeued every ten seconds by four workers: the queue stays short.
    let depth = value(&scrape, "workqueue_depth{name=\"appservice\"}").unwrap();
    assert!(depth <= 3.0, "{scrape}");

    // A deleted child wakes its owner: one more add, one more reconcile, and the
    // Deployment is back.
    let before = queue.adds();
    f.deployments.delete("q2", &DeleteParams::default()).await?;
    eventually("the Deployment recreated", WAIT, || async {
        Ok(f.deployments.get_opt("q2").await?)
    })
    .await?;
    assert!(queue.adds() > before);

    // Once every AppService is gone, nothing is waiting, running or scheduled.
    f.apps
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually("the AppServices gone", WAIT, || async {
        Ok(f.apps
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    eventually("an empty queue", WAIT, || async {
        Ok((queue.tracked() == 0).then_some(()))
    })
    .await?;
    let scrape = ctl.metrics.encode()?;
    assert_eq!(
        value(&scrape, "workqueue_depth{name=\"appservice\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &scrape,
            "workqueue_unfinished_work_seconds{name=\"appservice\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &scrape,
            "controller_runtime_active_workers{controller=\"appservice\"}"
        ),
        Some(0.0)
    );
    ctl.stop().await
}
