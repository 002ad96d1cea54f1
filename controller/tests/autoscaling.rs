//! `spec.autoscaling` on a full control plane (kube-controller-manager's autoscaler
//! controller, the Deployment controller, the garbage collector, kwok's Pods), with the
//! controller at its shipped defaults: the HorizontalPodAutoscaler it makes scales the
//! AppService through its scale subresource, the controller never writes `replicas`
//! itself (so nothing fights the autoscaler over it), the autoscaler is healed, removed
//! with `spec.autoscaling`, collected with the AppService, and someone else's in its
//! name is never adopted. Below `minReplicas` the autoscaler scales without metrics,
//! which kwok's Pods have none of; scaling on real CPU load is in `real_pods.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use common::conditions::{READY, TRUE, reasons};
use common::{AppServiceSpec, AutoscalingSpec};
use harness::eventually;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::world::World;
use support::{Fixture, condition};

const IMAGE: &str = "registry.example.com/web:v1";
/// How long healing may take: events, not the resync, must do it.
const HEAL: Duration = Duration::from_secs(10);
/// The autoscaler controller looks every 15 s (its default sync period); then the
/// Deployment controller and kwok's Pods.
const SCALED: Duration = Duration::from_secs(90);

async fn world() -> anyhow::Result<World> {
    World::start(Fixture::setup().full()).await
}

fn spec(min: i32, max: i32) -> AppServiceSpec {
    AppServiceSpec {
        image: IMAGE.to_owned(),
        replicas: Some(1),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), Quantity("100m".into()))])),
            ..ResourceRequirements::default()
        }),
        autoscaling: Some(AutoscalingSpec {
            min_replicas: Some(min),
            max_replicas: max,
            target_cpu_utilization_percentage: Some(50),
        }),
        ..AppServiceSpec::default()
    }
}

/// Waits until `name` is Ready with `replicas` ready for its generation.
async fn ready(w: &World, name: &str, replicas: i32) -> anyhow::Result<()> {
    eventually(&format!("{name} Ready with {replicas}"), SCALED, || async {
        let a = w.apps.get(name).await?;
        let status = a.status.clone().unwrap_or_default();
        let ok = a.spec.replicas == Some(replicas)
            && status.ready_replicas == Some(replicas)
            && status.observed_generation == a.metadata.generation
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        Ok(ok.then_some(()))
    })
    .await?;
    Ok(())
}

/// The autoscaler of `name` once it is ours and as built.
async fn our_autoscaler(
    w: &World,
    name: &str,
    (min, max): (i32, i32),
) -> anyhow::Result<HorizontalPodAutoscaler> {
    let uid = w.apps.get(name).await?.uid().unwrap_or_default();
    let hpas: Api<HorizontalPodAutoscaler> = w.api();
    Ok(eventually(
        &format!("{name}'s autoscaler at {min}..{max}"),
        HEAL,
        || async {
            let hpa = hpas.get_opt(name).await?;
            Ok(hpa.filter(|h| {
                let spec = h.spec.clone();
                let metric = spec
                    .metrics
                    .as_ref()
                    .and_then(|m| m.first())
                    .and_then(|m| m.resource.clone());
                h.owner_references()
                    .iter()
                    .any(|r| r.uid == uid && r.controller == Some(true))
                    && spec.scale_target_ref.kind == "AppService"
                    && spec.scale_target_ref.name == name
                    && (spec.min_replicas, spec.max_replicas) == (Some(min), max)
                    && metric.is_some_and(|m| {
                        m.name == "cpu" && m.target.average_utilization == Some(50)
                    })
            }))
        },
    )
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_autoscaler_scales_the_appservice_and_the_controller_never_writes_replicas()
-> anyhow::Result<()> {
    let w = world().await?;
    let hpas: Api<HorizontalPodAutoscaler> = w.api();
    w.create("web", spec(3, 6)).await?;
    let hpa = our_autoscaler(&w, "web", (3, 6)).await?;
    // Below its minimum, the autoscaler scales the AppService (through /scale), and the
    // Deployment follows; with three Pods the budget comes too.
    ready(&w, "web", 3).await?;
    let app = w.apps.get("web").await?;
    let owners_of_replicas: Vec<String> = app
        .managed_fields()
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !owners_of_replicas
            .iter()
            .any(|m| m == common::names::FIELD_MANAGER),
        "the controller never writes replicas: {owners_of_replicas:?}"
    );
    assert!(
        w.api::<PodDisruptionBudget>()
            .get_opt("web")
            .await?
            .is_some(),
        "three Pods: a budget"
    );
    w.quiet(2).await?;

    // Loosened by someone: put back. Deleted: made again.
    hpas.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maxReplicas": 100, "minReplicas": 1}})),
    )
    .await?;
    our_autoscaler(&w, "web", (3, 6)).await?;
    hpas.delete("web", &DeleteParams::default()).await?;
    let again = our_autoscaler(&w, "web", (3, 6)).await?;
    assert_ne!(again.uid(), hpa.uid());

    // New bounds: the autoscaler is applied, and it scales to the new minimum.
    w.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": {"minReplicas": 4, "maxReplicas": 8}}})),
        )
        .await?;
    our_autoscaler(&w, "web", (4, 8)).await?;
    ready(&w, "web", 4).await?;

    // Removed: the autoscaler goes; the replicas stay where it left them.
    w.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": null}})),
        )
        .await?;
    eventually("the autoscaler gone", HEAL, || async {
        Ok(hpas.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    ready(&w, "web", 4).await?;
    w.quiet(2).await?;

    // Collected with the AppService.
    w.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": {
                "minReplicas": 4, "maxReplicas": 8, "targetCPUUtilizationPercentage": 50,
            }}})),
        )
        .await?;
    our_autoscaler(&w, "web", (4, 8)).await?;
    w.apps.delete("web", &DeleteParams::foreground()).await?;
    eventually("web and its autoscaler gone", SCALED, || async {
        let gone = w.apps.get_opt("web").await?.is_none() && hpas.get_opt("web").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_autoscaler_in_its_name_blocks_it_and_is_never_adopted() -> anyhow::Result<()>
{
    let w = world().await?;
    let hpas: Api<HorizontalPodAutoscaler> = w.api();
    let theirs: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"team": "theirs"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "other"},
            "minReplicas": 1, "maxReplicas": 2,
        },
    }))?;
    let theirs = hpas.create(&PostParams::default(), &theirs).await?;
    w.create("web", spec(2, 4)).await?;
    let app = eventually("ResourceConflict", SCALED, || async {
        let a = w.apps.get("web").await?;
        let hit = condition(&a, READY)
            .is_some_and(|(s, r, _)| s != TRUE && r == reasons::RESOURCE_CONFLICT);
        Ok(hit.then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&app, READY).unwrap();
    assert!(
        message.contains(&format!("HorizontalPodAutoscaler {}/web", w.ns.name())),
        "{message}"
    );
    let now = hpas.get("web").await?;
    assert_eq!(now.spec, theirs.spec, "their autoscaler untouched");
    assert!(now.owner_references().is_empty());

    hpas.delete("web", &DeleteParams::default()).await?;
    our_autoscaler(&w, "web", (2, 4)).await?;
    ready(&w, "web", 2).await?;
    w.quiet(2).await?;
    Ok(())
}
