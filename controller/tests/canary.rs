//! Canary releases on a full control plane (the Deployment controller, the EndpointSlice
//! controller, the garbage collector, kwok's Pods), with the controller at its shipped
//! defaults (resync 10 minutes): a canary beside the stable Deployment behind one
//! Service, promoted and aborted by an edit, its Deployment perturbed and healed by
//! events, a restart with a canary in flight, and a foreign object in its name. After
//! each, the controller writes nothing over several reconciles.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use common::conditions::{READY, TRUE, reasons};
use common::names::{
    LABEL_TRACK, TRACK_CANARY, canary_deployment_name, canary_labels, selector_labels,
};
use common::{AppServiceSpec, CanarySpec, CanaryStatus, RolloutSpec};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::world::World;
use support::{Fixture, ROLLOUT, condition, image_of, start_controller};

const V1: &str = "registry.example.com/web:v1";
const V2: &str = "registry.example.com/web:v2";
/// How long healing may take: events, not the resync, must do it.
const HEAL: Duration = Duration::from_secs(10);
/// Until Ready again, which also waits for the Deployment controller and kwok's Pods.
const READY_BOUND: Duration = Duration::from_secs(60);
const INTRUDER: &str = "intruder";

async fn world() -> anyhow::Result<World> {
    World::start(Fixture::setup().full()).await
}

fn spec(replicas: i32, canary: Option<(&str, i32)>) -> AppServiceSpec {
    AppServiceSpec {
        image: V1.to_owned(),
        replicas: Some(replicas),
        rollout: Some(RolloutSpec {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }),
        canary: canary.map(|(image, replicas)| CanarySpec {
            image: image.to_owned(),
            replicas: Some(replicas),
        }),
        ..AppServiceSpec::default()
    }
}

/// Whether `d` has rolled out `replicas` Pods of its current template, all ready.
fn rolled_out(d: &Deployment, replicas: i32) -> Option<String> {
    let st = d.status.clone().unwrap_or_default();
    let counts = (
        st.ready_replicas.unwrap_or(0),
        st.replicas.unwrap_or(0),
        st.updated_replicas.unwrap_or(0),
    );
    if st.observed_generation != d.metadata.generation || counts != (replicas, replicas, replicas) {
        Some(format!(
            "{ROLLOUT}{} at generation {:?}/{:?}: ready/total/updated {counts:?} of {replicas}",
            d.name_any(),
            st.observed_generation,
            d.metadata.generation
        ))
    } else {
        None
    }
}

/// The Deployment's strategy, if it is not the rolling update `spec.rollout` asks for.
fn strategy_problem(what: &str, d: &Deployment, spec: &AppServiceSpec) -> Option<String> {
    let rollout = spec.rollout.as_ref()?;
    let rolling = d.spec.strategy.as_ref().filter(|s| {
        s.type_.as_deref() == Some("RollingUpdate")
            && s.rolling_update.as_ref().is_some_and(|r| {
                r.max_surge == rollout.max_surge && r.max_unavailable == rollout.max_unavailable
            })
    });
    rolling
        .is_none()
        .then(|| format!("{what} strategy {:?}", d.spec.strategy))
}

impl support::Converges for World {
    fn problems<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(self.problems_of(name))
    }
}

impl World {
    /// Everything about `name` that does not match its spec, empty when converged: the
    /// stable Deployment with its share of the replicas, the canary Deployment exactly
    /// while `spec.canary` asks for it, both rolled out, and status saying so.
    async fn problems_of(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let mut p = Vec::new();
        let app = self.apps.get(name).await?;
        let spec = &app.spec;
        let uid = app.uid().context("uid")?;
        let ours = |d: &Deployment| {
            d.owner_references()
                .iter()
                .any(|r| r.uid == uid && r.controller == Some(true))
        };
        let status = app.status.clone().unwrap_or_default();
        if status.observed_generation != app.metadata.generation {
            p.push(format!(
                "status.observedGeneration {:?} != {:?}",
                status.observed_generation, app.metadata.generation
            ));
        }
        match condition(&app, READY) {
            Some((s, _, _)) if s == TRUE => {}
            other => p.push(format!("{ROLLOUT}Ready is {other:?}")),
        }
        if status.ready_replicas != Some(spec.replicas()) {
            p.push(format!(
                "{ROLLOUT}status.readyReplicas {:?} != {}",
                status.ready_replicas,
                spec.replicas()
            ));
        }
        match self.deployments.get_opt(name).await? {
            None => p.push("no stable Deployment".into()),
            Some(d) => {
                if !ours(&d) {
                    p.push("stable Deployment not ours".into());
                }
                if d.spec.replicas != Some(spec.stable_replicas()) {
                    p.push(format!("stable replicas {:?}", d.spec.replicas));
                }
                if image_of(&d).as_deref() != Some(spec.image.as_str()) {
                    p.push(format!("stable image {:?}", image_of(&d)));
                }
                p.extend(strategy_problem("stable", &d, spec));
                p.extend(rolled_out(&d, spec.stable_replicas()));
            }
        }
        let canary_name = canary_deployment_name(name);
        match (&spec.canary, self.deployments.get_opt(&canary_name).await?) {
            (None, None) => {}
            (None, Some(d)) => p.push(format!(
                "canary Deployment still there (deleting: {})",
                d.metadata.deletion_timestamp.is_some()
            )),
            (Some(_), None) => p.push("no canary Deployment".into()),
            (Some(want), Some(d)) => {
                if !ours(&d) {
                    p.push("canary Deployment not ours".into());
                }
                if d.spec.replicas != Some(want.replicas()) {
                    p.push(format!("canary replicas {:?}", d.spec.replicas));
                }
                if image_of(&d).as_deref() != Some(want.image.as_str()) {
                    p.push(format!("canary image {:?}", image_of(&d)));
                }
                p.extend(strategy_problem("canary", &d, spec));
                let template_labels = d
                    .spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default();
                for (what, labels) in [
                    ("canary", d.labels()),
                    ("canary template", &template_labels),
                ] {
                    if !canary_labels(name)
                        .iter()
                        .all(|(k, v)| labels.get(k) == Some(v))
                    {
                        p.push(format!("{what} labels {labels:?}"));
                    }
                }
                let mut selector = selector_labels(name);
                selector.insert(LABEL_TRACK.into(), TRACK_CANARY.into());
                if d.spec.selector.match_labels.as_ref() != Some(&selector) {
                    p.push(format!("canary selector {:?}", d.spec.selector));
                }
                p.extend(rolled_out(&d, want.replicas()));
            }
        }
        let want_status = spec.canary.as_ref().map(|c| CanaryStatus {
            image: c.image.clone(),
            replicas: c.replicas(),
            ready_replicas: c.replicas(),
        });
        if status.canary != want_status {
            p.push(format!(
                "{ROLLOUT}status.canary {:?} != {want_status:?}",
                status.canary
            ));
        }
        Ok(p)
    }

    async fn within(&self, name: &str, bound: Duration, rollout: bool) -> anyhow::Result<Duration> {
        support::no_problems_within(self, name, bound, rollout).await
    }

    async fn converged(&self, name: &str) -> anyhow::Result<Duration> {
        self.within(name, READY_BOUND, true).await
    }

    /// The children back within [`HEAL`], then Ready; prints both times after `what`.
    async fn recovers(&self, name: &str, what: &str) -> anyhow::Result<()> {
        support::recovers(self, name, what, HEAL, READY_BOUND).await
    }

    /// [`World::quiet`], poking the `<name>-canary` Deployments too: their events must
    /// not cause writes either.
    async fn quiet_canaries(&self, n: u64) -> anyhow::Result<()> {
        self.quiet_with(n, async |names| self.poke_canary(names, n).await)
            .await
    }

    /// An unrelated label on each existing canary Deployment, each awaited by a reconcile.
    async fn poke_canary(&self, names: &[String], n: u64) -> anyhow::Result<()> {
        let (params, nonce) = (support::poke_params(), support::poke_nonce()?);
        for i in 0..n {
            for name in names {
                let canary = canary_deployment_name(name);
                if self.deployments.get_opt(&canary).await?.is_none() {
                    continue;
                }
                let before = self.ctl.metrics.reconcile_count();
                self.deployments
                    .patch(&canary, &params, &support::poke_patch(nonce, i))
                    .await?;
                let what = format!("a reconcile after a poke of {canary}");
                support::reconciled_since(&self.ctl.metrics, before, &what).await?;
            }
        }
        Ok(())
    }

    async fn intrude(&self, deployment: &str, ops: Value) -> anyhow::Result<()> {
        let patch: json_patch::Patch = serde_json::from_value(ops)?;
        self.deployments
            .patch(
                deployment,
                &PatchParams {
                    field_manager: Some(INTRUDER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Json::<()>(patch),
            )
            .await?;
        Ok(())
    }

    async fn edit(&self, name: &str, spec: Value) -> anyhow::Result<()> {
        self.apps
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    /// The images of the ready Pods the Service `name` selects, by image, as listed by
    /// the Service's own selector; and the ready endpoints of its EndpointSlices.
    async fn behind_the_service(
        &self,
        name: &str,
    ) -> anyhow::Result<(BTreeMap<String, usize>, usize)> {
        let service = self.services.get(name).await?;
        let selector = service
            .spec
            .and_then(|s| s.selector)
            .context("Service without a selector")?;
        let selector = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods: Api<Pod> = self.api();
        let mut images = BTreeMap::new();
        for pod in pods.list(&ListParams::default().labels(&selector)).await? {
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if !ready || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let image = pod
                .spec
                .and_then(|s| s.containers.into_iter().next())
                .and_then(|c| c.image)
                .unwrap_or_default();
            *images.entry(image).or_insert(0) += 1;
        }
        let slices: Api<EndpointSlice> = self.api();
        let endpoints = slices
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
            .await?
            .into_iter()
            .flat_map(|s| s.endpoints)
            .flatten()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
            .count();
        Ok((images, endpoints))
    }
}

/// A canary beside the stable Deployment: two Deployments, one Service that selects the
/// Pods of both, status.canary, Ready once both are rolled out; then promoted mid-rollout.
#[tokio::test]
async fn a_canary_runs_behind_the_same_service_and_is_promoted() -> anyhow::Result<()> {
    let f = world().await?;
    let name = "promote";
    f.create(name, spec(4, Some((V2, 1)))).await?;
    let took = f.converged(name).await?;
    println!("canary created and Ready in {} ms", took.as_millis());

    let want = BTreeMap::from([(V1.to_owned(), 3), (V2.to_owned(), 1)]);
    let seen = harness::eventually("the Service's Pods and endpoints", READY_BOUND, || async {
        let (images, endpoints) = f.behind_the_service(name).await?;
        Ok(((images == want) && endpoints == 4).then_some((images, endpoints)))
    })
    .await?;
    println!("behind the Service: {seen:?}");
    let app = f.apps.get(name).await?;
    let (_, reason, message) = condition(&app, READY).context("Ready")?;
    assert_eq!(reason, reasons::AVAILABLE);
    assert_eq!(message, "4/4 replicas ready");
    f.quiet_canaries(3).await?;

    // Promote while the canary Deployment is still rolling: its image edited first,
    // then, before it is rolled out, the promotion.
    f.edit(
        name,
        json!({"canary": {"image": "registry.example.com/web:v3"}}),
    )
    .await?;
    harness::eventually("the canary rolling to v3", HEAL, || async {
        let d = f.deployments.get(&canary_deployment_name(name)).await?;
        Ok((image_of(&d).as_deref() == Some("registry.example.com/web:v3")).then_some(()))
    })
    .await?;
    f.edit(
        name,
        json!({"image": "registry.example.com/web:v3", "canary": null}),
    )
    .await?;
    f.recovers(name, "promoted").await?;
    let want = BTreeMap::from([("registry.example.com/web:v3".to_owned(), 4)]);
    harness::eventually("only v3 behind the Service", READY_BOUND, || async {
        let (images, endpoints) = f.behind_the_service(name).await?;
        Ok((images == want && endpoints == 4).then_some(()))
    })
    .await?;
    assert_eq!(
        f.apps.get(name).await?.status.unwrap_or_default().canary,
        None
    );
    f.quiet_canaries(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// Abort: the canary goes, the stable Deployment's Pod template is untouched (no
/// rollout: the same ReplicaSet grows back to every replica).
#[tokio::test]
async fn abort_removes_the_canary_and_leaves_the_stable_template_alone() -> anyhow::Result<()> {
    let f = world().await?;
    let name = "abort";
    f.create(name, spec(3, Some((V2, 1)))).await?;
    f.converged(name).await?;
    let before = f.deployments.get(name).await?;
    let sets: Api<ReplicaSet> = f.api();
    let stable_sets = || async {
        let mut names: Vec<String> = sets
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|rs| {
                rs.owner_references()
                    .iter()
                    .any(|r| Some(&r.uid) == before.metadata.uid.as_ref())
            })
            .map(|rs| rs.name_any())
            .collect();
        names.sort();
        anyhow::Ok(names)
    };
    let sets_before = stable_sets().await?;
    f.edit(name, json!({"canary": null})).await?;
    f.recovers(name, "aborted").await?;
    let after = f.deployments.get(name).await?;
    assert_eq!(after.spec.template, before.spec.template);
    assert_eq!(after.spec.replicas, Some(3));
    // One generation more: the replicas it took back, nothing else.
    assert_eq!(
        after.metadata.generation,
        before.metadata.generation.map(|g| g + 1)
    );
    assert_eq!(stable_sets().await?, sets_before, "no new ReplicaSet");
    f.quiet_canaries(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// The canary Deployment deleted, its image and replicas edited by another writer, our
/// label removed: each healed by events (the resync is 10 minutes), then no writes.
#[tokio::test]
async fn perturbations_of_the_canary_deployment_are_healed() -> anyhow::Result<()> {
    let f = world().await?;
    let name = "perturb";
    let canary = canary_deployment_name(name);
    f.create(name, spec(3, Some((V2, 1)))).await?;
    f.converged(name).await?;
    f.quiet_canaries(2).await?;

    f.deployments
        .delete(&canary, &DeleteParams::default())
        .await?;
    f.recovers(name, "canary deleted").await?;
    let c = "/spec/template/spec/containers/0";
    for (what, ops) in [
        (
            "canary image edited",
            json!([{"op": "replace", "path": format!("{c}/image"), "value": "registry.example.com/other:v9"}]),
        ),
        (
            "canary replicas edited",
            json!([{"op": "replace", "path": "/spec/replicas", "value": 3}]),
        ),
        (
            "canary managed-by label removed",
            json!([{"op": "remove", "path": "/metadata/labels/app.kubernetes.io~1managed-by"}]),
        ),
        (
            "canary track label removed",
            json!([{"op": "remove", "path": "/metadata/labels/platform.example.com~1track"}]),
        ),
        (
            "canary Pods' name label removed",
            json!([{"op": "remove", "path": "/spec/template/metadata/labels/app.kubernetes.io~1name"}]),
        ),
        (
            "canary strategy set to Recreate",
            json!([{"op": "replace", "path": "/spec/strategy", "value": {"type": "Recreate"}}]),
        ),
    ] {
        f.converged(name).await?;
        f.intrude(&canary, ops).await?;
        f.recovers(name, what).await?;
    }
    // The stable Deployment's strategy is ours too while `spec.rollout` is set.
    f.converged(name).await?;
    f.intrude(
        name,
        json!([{"op": "replace", "path": "/spec/strategy/rollingUpdate/maxSurge", "value": "50%"}]),
    )
    .await?;
    f.recovers(name, "stable maxSurge edited").await?;
    f.quiet_canaries(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// A restarted controller with a canary in flight (and one settled) writes nothing once
/// the in-flight one has settled.
#[tokio::test]
async fn a_restart_with_canaries_in_flight_writes_nothing() -> anyhow::Result<()> {
    let f = world().await?;
    f.create("settled", spec(2, Some((V2, 1)))).await?;
    f.converged("settled").await?;
    f.create("flight", spec(3, Some((V2, 2)))).await?;
    // Stop before it has converged: the restarted controller finishes it.
    let World { fixture, ctl } = f;
    ctl.stop().await?;
    let again = start_controller(fixture.client.clone(), &fixture.ns, |_| {});
    let f = World {
        fixture,
        ctl: again,
    };
    f.converged("flight").await?;
    f.converged("settled").await?;
    f.quiet_canaries(4).await?;
    // And once more, now with both settled: not a single write after the restart.
    let World { fixture, ctl } = f;
    ctl.stop().await?;
    let again = start_controller(fixture.client.clone(), &fixture.ns, |_| {});
    let f = World {
        fixture,
        ctl: again,
    };
    f.converged("flight").await?;
    let names = vec!["flight".to_owned(), "settled".to_owned()];
    support::poke(&f, &f.ctl.metrics, &names, 6).await?;
    f.poke_canary(&names, 2).await?;
    assert_eq!(f.ctl.metrics.write_count(), 0, "writes after a restart");
    f.ctl.stop().await?;
    Ok(())
}

/// Someone else's Deployment named `<name>-canary`: the canary is a ResourceConflict and
/// their object is never written or deleted, also once the canary is removed.
#[tokio::test]
async fn a_foreign_deployment_in_the_canary_name_is_a_conflict_and_untouched() -> anyhow::Result<()>
{
    let f = world().await?;
    let name = "taken";
    let canary = canary_deployment_name(name);
    let labels = BTreeMap::from([("app".to_owned(), "theirs".to_owned())]);
    let foreign: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": canary, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "theirs", "image": "registry.example.com/theirs:v1",
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
            }}
        }
    }))?;
    let foreign = f
        .deployments
        .create(&PostParams::default(), &foreign)
        .await?;
    f.create(name, spec(2, Some((V2, 1)))).await?;
    let app = harness::eventually("ResourceConflict", READY_BOUND, || async {
        let app = f.apps.get(name).await?;
        Ok(condition(&app, READY)
            .filter(|(_, reason, _)| reason == reasons::RESOURCE_CONFLICT)
            .map(|_| app))
    })
    .await?;
    let (_, _, message) = condition(&app, READY).context("Ready")?;
    assert!(
        message.contains(&format!("Deployment {}/{canary}", &*f.ns)),
        "{message}"
    );
    // Nothing is created while a name is taken.
    assert!(f.deployments.get_opt(name).await?.is_none());
    let untouched = |d: &Deployment| {
        (
            d.metadata.uid.clone(),
            d.metadata.generation,
            d.labels().clone(),
            d.owner_references().to_vec(),
            // Who wrote it: never our field manager.
            d.metadata
                .managed_fields
                .iter()
                .flatten()
                .filter_map(|m| m.manager.clone())
                .filter(|m| m == common::names::FIELD_MANAGER)
                .collect::<Vec<_>>(),
        )
    };
    let want = untouched(&foreign);
    assert_eq!(untouched(&f.deployments.get(&canary).await?), want);

    // Without the canary, the rest converges and their object stays as it is.
    f.edit(name, json!({"canary": null})).await?;
    let app = harness::eventually("Ready without the canary", READY_BOUND, || async {
        let app = f.apps.get(name).await?;
        Ok(condition(&app, READY)
            .filter(|(status, _, _)| status == TRUE)
            .map(|_| app))
    })
    .await?;
    assert_eq!(app.status.unwrap_or_default().canary, None);
    let d = f.deployments.get(&canary).await?;
    assert_eq!(untouched(&d), want);
    assert!(d.metadata.deletion_timestamp.is_none());
    // Steady once the rollout is done and a reconcile wrote nothing (Ready can be seen
    // before the status write that follows the last rollout step); the canary name is
    // not ours, so only our objects are poked.
    f.quiet(3).await?;
    assert_eq!(untouched(&f.deployments.get(&canary).await?), want);
    f.ctl.stop().await?;
    Ok(())
}

/// The garbage collector takes the canary with its AppService, as it takes the others:
/// the canary's owner reference is the stable Deployment's.
#[tokio::test]
async fn deleting_the_appservice_takes_the_canary_with_it() -> anyhow::Result<()> {
    let f = world().await?;
    let name = "gone";
    f.create(name, spec(2, Some((V2, 1)))).await?;
    f.converged(name).await?;
    f.apps.delete(name, &DeleteParams::foreground()).await?;
    harness::eventually(
        "the AppService and both Deployments gone",
        READY_BOUND,
        || async {
            let app = f.apps.get_opt(name).await?;
            let stable = f.deployments.get_opt(name).await?;
            let canary = f.deployments.get_opt(&canary_deployment_name(name)).await?;
            Ok((app.is_none() && stable.is_none() && canary.is_none()).then_some(()))
        },
    )
    .await?;
    f.ctl.stop().await?;
    Ok(())
}
