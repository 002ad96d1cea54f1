//! The controller on a full control plane: kube-controller-manager, kube-scheduler and a
//! kwok node, so Deployments get ready Pods and owned objects are garbage-collected.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::conditions::{DEGRADED, FALSE, PROGRESSING, READY, TRUE, reasons};
use harness::eventually;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{Fixture, app, condition, create};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn becomes_ready_then_deletion_removes_everything() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().start().await?;

    create(&f.apps, &app("shop", "registry.example.com/shop:v1", 2)).await?;
    let a = eventually("Ready=True", WAIT, || async {
        let a = f.apps.get("shop").await?;
        Ok(condition(&a, READY)
            .is_some_and(|(s, _, _)| s == TRUE)
            .then_some(a))
    })
    .await?;
    let status = a.status.clone().unwrap();
    assert_eq!(status.ready_replicas, Some(2));
    assert_eq!(status.observed_generation, Some(1));
    let (_, reason, message) = condition(&a, READY).unwrap();
    assert_eq!(reason, reasons::AVAILABLE);
    assert_eq!(message, "2/2 replicas ready");
    assert_eq!(condition(&a, PROGRESSING).unwrap().0, FALSE);
    assert_eq!(condition(&a, DEGRADED).unwrap().0, FALSE);

    // Scale up through the spec: Ready drops while the new Pod starts, then returns.
    f.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    eventually("3 ready replicas", WAIT, || async {
        let a = f.apps.get("shop").await?;
        let ok = a.status.as_ref().and_then(|s| s.ready_replicas) == Some(3)
            && a.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        Ok(ok.then_some(()))
    })
    .await?;

    f.apps.delete("shop", &DeleteParams::default()).await?;
    eventually(
        "AppService, Deployment and Service to be gone",
        WAIT,
        || async {
            let gone = f.apps.get_opt("shop").await?.is_none()
                && f.deployments.get_opt("shop").await?.is_none()
                && f.services.get_opt("shop").await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    ctl.stop().await?;
    Ok(())
}
