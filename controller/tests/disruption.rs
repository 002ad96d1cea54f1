//! Disruption budgets and spread on a full control plane (the Deployment controller, the
//! disruption controller, the garbage collector, kwok's Pods), with the controller at its
//! shipped defaults: a PodDisruptionBudget exactly while an AppService runs two or more
//! Pods, put back when another writer edits or deletes it, never made beside someone
//! else's budget in its name, and collected with its AppService; the Pods' spread over
//! nodes ours, a spread another writer adds theirs. After each, the controller writes
//! nothing over several reconciles.
//!
//! That the real API server refuses an eviction the budget forbids, with real Pods
//! serving traffic meanwhile, is in `real_pods.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::AppServiceSpec;
use common::conditions::{READY, TRUE, reasons};
use common::names::{SPREAD_TOPOLOGY_KEY, selector_labels};
use harness::eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::world::World;
use support::{Fixture, condition};

const IMAGE: &str = "registry.example.com/web:v1";
/// How long healing may take: events, not the resync, must do it.
const HEAL: Duration = Duration::from_secs(10);
/// Until Ready, which also waits for the Deployment controller and kwok's Pods.
const READY_BOUND: Duration = Duration::from_secs(60);

async fn world() -> anyhow::Result<World> {
    World::start(Fixture::setup().full()).await
}

fn spec(replicas: i32) -> AppServiceSpec {
    AppServiceSpec {
        image: IMAGE.to_owned(),
        replicas: Some(replicas),
        ..AppServiceSpec::default()
    }
}

async fn scale(w: &World, name: &str, replicas: i32) -> anyhow::Result<()> {
    w.apps
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

/// What is off about `name`'s budget, empty when it is ours and as the controller
/// builds it.
fn budget_problems(b: &PodDisruptionBudget, name: &str, uid: &str) -> Vec<String> {
    let mut p = Vec::new();
    if !b
        .owner_references()
        .iter()
        .any(|r| r.uid == uid && r.controller == Some(true) && r.kind == "AppService")
    {
        p.push(format!("owner references {:?}", b.owner_references()));
    }
    let spec = b.spec.clone().unwrap_or_default();
    if spec.max_unavailable != Some(IntOrString::Int(1)) || spec.min_available.is_some() {
        p.push(format!(
            "maxUnavailable {:?}, minAvailable {:?}",
            spec.max_unavailable, spec.min_available
        ));
    }
    if spec.selector.and_then(|s| s.match_labels) != Some(selector_labels(name)) {
        p.push("selector".into());
    }
    if spec.unhealthy_pod_eviction_policy.as_deref() != Some("AlwaysAllow") {
        p.push(format!(
            "unhealthyPodEvictionPolicy {:?}",
            spec.unhealthy_pod_eviction_policy
        ));
    }
    if b.labels()
        .get("app.kubernetes.io/managed-by")
        .map(String::as_str)
        != Some("appservice-operator")
    {
        p.push(format!("labels {:?}", b.labels()));
    }
    p
}

/// Waits until `name` has our budget, as built, and returns it.
async fn our_budget(w: &World, name: &str, bound: Duration) -> anyhow::Result<PodDisruptionBudget> {
    let uid = w.apps.get(name).await?.uid().unwrap_or_default();
    let budgets: Api<PodDisruptionBudget> = w.api();
    Ok(eventually(&format!("{name}'s budget"), bound, || async {
        let b = budgets.get_opt(name).await?;
        Ok(b.filter(|b| budget_problems(b, name, &uid).is_empty()))
    })
    .await?)
}

async fn no_budget(w: &World, name: &str, bound: Duration) -> anyhow::Result<()> {
    let budgets: Api<PodDisruptionBudget> = w.api();
    eventually(&format!("no budget of {name}"), bound, || async {
        Ok(budgets.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

async fn ready(w: &World, name: &str) -> anyhow::Result<()> {
    eventually(&format!("{name} Ready"), READY_BOUND, || async {
        let a = w.apps.get(name).await?;
        let ok = a.status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        Ok(ok.then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_exactly_while_two_or_more_pods_run_and_it_goes_with_the_appservice()
-> anyhow::Result<()> {
    let w = world().await?;
    let budgets: Api<PodDisruptionBudget> = w.api();

    // One Pod: no budget (one that allowed no eviction would block every drain).
    w.create("solo", spec(1)).await?;
    ready(&w, "solo").await?;
    assert!(budgets.get_opt("solo").await?.is_none());

    w.create("web", spec(3)).await?;
    ready(&w, "web").await?;
    our_budget(&w, "web", HEAL).await?;
    // The disruption controller counts the AppService's Pods through it.
    let b = eventually(
        "the budget's status counting 3 Pods",
        READY_BOUND,
        || async {
            let b = budgets.get("web").await?;
            let status = b.status.clone().unwrap_or_default();
            Ok((status.expected_pods == Some(3) && status.current_healthy == Some(3)).then_some(b))
        },
    )
    .await?;
    assert_eq!(b.status.unwrap().disruptions_allowed, Some(1));
    w.quiet(3).await?;

    // Scaled to one Pod, the budget goes; back at two, it is there again.
    scale(&w, "web", 1).await?;
    no_budget(&w, "web", HEAL).await?;
    ready(&w, "web").await?;
    scale(&w, "solo", 2).await?;
    our_budget(&w, "solo", HEAL).await?;
    w.quiet(3).await?;

    // Deleted with its AppService, by the garbage collector through its owner reference.
    w.apps.delete("solo", &DeleteParams::foreground()).await?;
    eventually("solo and its children gone", READY_BOUND, || async {
        let gone = w.apps.get_opt("solo").await?.is_none()
            && budgets.get_opt("solo").await?.is_none()
            && w.deployments.get_opt("solo").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_edited_or_deleted_by_another_writer_is_put_back() -> anyhow::Result<()> {
    let w = world().await?;
    let budgets: Api<PodDisruptionBudget> = w.api();
    w.create("web", spec(2)).await?;
    ready(&w, "web").await?;
    let before = our_budget(&w, "web", HEAL).await?;
    w.quiet(2).await?;

    // A tenant loosens it: no Pod protected, by a minAvailable instead of ours.
    budgets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "remove", "path": "/spec/maxUnavailable"},
                {"op": "add", "path": "/spec/minAvailable", "value": 0},
                {"op": "add", "path": "/spec/unhealthyPodEvictionPolicy", "value": "IfHealthyBudget"},
            ]))?),
        )
        .await?;
    let healed = our_budget(&w, "web", HEAL).await?;
    assert_eq!(
        healed.uid(),
        before.uid(),
        "repaired in place, not replaced"
    );

    // Its selector pointed at nothing, and our label taken off.
    budgets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"app.kubernetes.io/managed-by": null}},
                "spec": {"selector": {"matchLabels": {"app": "nothing"}}},
            })),
        )
        .await?;
    our_budget(&w, "web", HEAL).await?;

    // Deleted: made again.
    budgets.delete("web", &DeleteParams::default()).await?;
    let again = eventually("a new budget", HEAL, || async {
        let b = budgets.get_opt("web").await?;
        Ok(b.filter(|b| b.uid() != before.uid()))
    })
    .await?;
    assert!(budget_problems(&again, "web", &w.apps.get("web").await?.uid().unwrap()).is_empty());
    w.quiet(3).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_budget_in_its_name_blocks_it_and_is_never_adopted() -> anyhow::Result<()> {
    let w = world().await?;
    let budgets: Api<PodDisruptionBudget> = w.api();
    let theirs: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"team": "theirs"}},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"team": "theirs"}}},
    }))?;
    let theirs = budgets.create(&PostParams::default(), &theirs).await?;

    // With one Pod no budget is asked for: theirs is none of its business.
    w.create("web", spec(1)).await?;
    ready(&w, "web").await?;

    // With two, ours would sit beside theirs: a conflict, said in status, nothing taken.
    scale(&w, "web", 2).await?;
    let app = eventually("ResourceConflict", READY_BOUND, || async {
        let a = w.apps.get("web").await?;
        let hit = condition(&a, READY)
            .is_some_and(|(s, r, _)| s != TRUE && r == reasons::RESOURCE_CONFLICT);
        Ok(hit.then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&app, READY).unwrap();
    assert!(
        message.contains(&format!("PodDisruptionBudget {}/web", w.ns.name())),
        "{message}"
    );
    // Untouched: the disruption controller writes its status, nobody else writes it.
    let now = budgets.get("web").await?;
    assert_eq!(now.spec, theirs.spec, "their budget's spec untouched");
    assert_eq!(now.labels(), theirs.labels());
    assert!(now.owner_references().is_empty());
    let managers: Vec<_> = now
        .managed_fields()
        .iter()
        .filter(|m| m.subresource.is_none())
        .filter_map(|m| m.manager.clone())
        .collect();
    let creators: Vec<_> = theirs
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(
        managers, creators,
        "no other writer of its spec or metadata"
    );

    // Theirs deleted: ours is made, and the AppService is Ready.
    budgets.delete("web", &DeleteParams::default()).await?;
    our_budget(&w, "web", READY_BOUND).await?;
    ready(&w, "web").await?;
    w.quiet(3).await?;
    Ok(())
}

/// The spread entries of `d`'s Pod template, as (topologyKey, whenUnsatisfiable).
fn spreads(d: &Deployment) -> Vec<(String, String)> {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.topology_key, c.when_unsatisfiable))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_spread_is_ours_and_a_zone_spread_another_writer_adds_stays() -> anyhow::Result<()>
{
    const ZONE: &str = "topology.kubernetes.io/zone";
    let w = world().await?;
    w.create("web", spec(2)).await?;
    ready(&w, "web").await?;
    let ours = (SPREAD_TOPOLOGY_KEY.to_owned(), "ScheduleAnyway".to_owned());
    let d = w.deployments.get("web").await?;
    assert_eq!(spreads(&d), vec![ours.clone()]);
    let spread = d.spec.template.spec.as_ref().unwrap();
    let constraint = &spread.topology_spread_constraints.as_ref().unwrap()[0];
    assert_eq!(
        constraint.label_selector.as_ref().unwrap().match_labels,
        Some(selector_labels("web"))
    );
    w.quiet(2).await?;

    // A platform policy adds a zone spread: theirs, kept.
    w.deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "add", "path": "/spec/template/spec/topologySpreadConstraints/-", "value": {
                    "maxSkew": 2, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": selector_labels("web")},
                }},
            ]))?),
        )
        .await?;
    let zone = (ZONE.to_owned(), "ScheduleAnyway".to_owned());
    ready(&w, "web").await?;
    w.quiet(3).await?;
    assert_eq!(
        spreads(&w.deployments.get("web").await?),
        vec![ours.clone(), zone.clone()]
    );

    // Ours made a hard rule by someone: put back as ours was, theirs left as it is.
    w.deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "test", "path": "/spec/template/spec/topologySpreadConstraints/0/topologyKey", "value": SPREAD_TOPOLOGY_KEY},
                {"op": "replace", "path": "/spec/template/spec/topologySpreadConstraints/0/whenUnsatisfiable", "value": "DoNotSchedule"},
            ]))?),
        )
        .await?;
    eventually("our spread put back", HEAL, || async {
        let d = w.deployments.get("web").await?;
        Ok((spreads(&d) == vec![ours.clone(), zone.clone()]).then_some(()))
    })
    .await?;
    ready(&w, "web").await?;
    w.quiet(3).await?;
    Ok(())
}
