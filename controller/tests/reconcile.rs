//! The controller against a real kube-apiserver (plain mode: no kube-controller-manager,
//! so Deployments never get ready Pods and owned objects are not garbage-collected).
//! Each test runs its own in-process controller scoped to its own namespace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::conditions::{DEGRADED, FALSE, PROGRESSING, READY, TRUE, reasons};
use common::names::{FIELD_MANAGER, FINALIZER, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY};
use harness::eventually;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{Fixture, app, condition, create, start_controller};

const WAIT: Duration = Duration::from_secs(30);

async fn get_deployment(api: &Api<Deployment>, name: &str) -> anyhow::Result<Option<Deployment>> {
    Ok(api.get_opt(name).await?)
}

#[tokio::test]
async fn create_makes_owned_children_and_status() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;

    let created = create(
        &f.apps,
        &app("checkout", "registry.example.com/checkout:v1", 2),
    )
    .await?;
    let uid = created.uid().unwrap();

    let d = eventually("the Deployment", WAIT, || async {
        Ok(get_deployment(&f.deployments, "checkout").await?)
    })
    .await?;
    let owner = &d.owner_references()[0];
    assert_eq!(owner.uid, uid);
    assert_eq!(owner.kind, "AppService");
    assert_eq!(owner.controller, Some(true));
    assert_eq!(d.labels()[LABEL_INSTANCE], "checkout");
    assert_eq!(d.labels()[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(d.spec.replicas, Some(2));
    let c = &d.spec.template.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.example.com/checkout:v1"));
    assert!(c.readiness_probe.as_ref().unwrap().tcp_socket.is_some());
    assert!(
        d.managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
    );

    let s = eventually("the Service", WAIT, || async {
        Ok(f.services.get_opt("checkout").await?)
    })
    .await?;
    assert_eq!(s.owner_references()[0].uid, uid);
    let port = &s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 8080);

    // Status: no Pods become ready without kube-controller-manager, so Ready=False.
    let a = eventually("status with conditions", WAIT, || async {
        let a = f.apps.get("checkout").await?;
        Ok(condition(&a, READY).is_some().then_some(a))
    })
    .await?;
    assert!(a.finalizers().iter().any(|f| f == FINALIZER));
    let status = a.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.ready_replicas, Some(0));
    assert_eq!(
        status.selector.as_deref(),
        Some(
            "app.kubernetes.io/instance=checkout,app.kubernetes.io/managed-by=appservice-operator"
        )
    );
    assert_eq!(
        status.endpoint,
        Some(format!("http://checkout.{}.svc:8080", &*f.ns))
    );
    let (st, reason, message) = condition(&a, READY).unwrap();
    assert_eq!(
        (st.as_str(), reason.as_str()),
        (FALSE, reasons::ROLLING_OUT)
    );
    assert_eq!(message, "0/2 replicas ready");
    assert_eq!(condition(&a, PROGRESSING).unwrap().0, TRUE);
    assert_eq!(condition(&a, DEGRADED).unwrap().0, FALSE);
    for c in &status.conditions {
        assert_eq!(c.observed_generation, Some(1), "{}", c.type_);
    }

    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn image_change_updates_deployment_and_observed_generation() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;

    create(&f.apps, &app("web", "nginx:1.26", 1)).await?;
    eventually("observedGeneration 1", WAIT, || async {
        let a = f.apps.get("web").await?;
        Ok((a.status.and_then(|s| s.observed_generation) == Some(1)).then_some(()))
    })
    .await?;

    f.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "nginx:1.27"}})),
        )
        .await?;
    let d = eventually("the new image on the Deployment", WAIT, || async {
        let d = f.deployments.get("web").await?;
        let image = d
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone());
        Ok((image.as_deref() == Some("nginx:1.27")).then_some(d))
    })
    .await?;
    assert_eq!(d.spec.replicas, Some(1));
    let a = eventually("observedGeneration 2", WAIT, || async {
        let a = f.apps.get("web").await?;
        Ok((a.status.as_ref().and_then(|s| s.observed_generation) == Some(2)).then_some(a))
    })
    .await?;
    assert_eq!(a.metadata.generation, Some(2));
    for c in &a.status.unwrap().conditions {
        assert_eq!(c.observed_generation, Some(2), "{}", c.type_);
    }
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn scale_subresource_drives_replicas() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;

    create(&f.apps, &app("api", "nginx:1.27", 1)).await?;
    eventually("status.selector", WAIT, || async {
        let a = f.apps.get("api").await?;
        Ok(a.status.and_then(|s| s.selector).map(|_| ()))
    })
    .await?;

    // `kubectl scale appservice/api --replicas=3`.
    let scale: Scale = f.apps.get_scale("api").await?;
    assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(1));
    assert_eq!(
        scale
            .status
            .as_ref()
            .and_then(|s| s.selector.clone())
            .as_deref(),
        Some("app.kubernetes.io/instance=api,app.kubernetes.io/managed-by=appservice-operator")
    );
    f.apps
        .patch_scale(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    eventually("3 replicas on the Deployment", WAIT, || async {
        let d = f.deployments.get("api").await?;
        Ok((d.spec.replicas == Some(3)).then_some(()))
    })
    .await?;
    assert_eq!(f.apps.get("api").await?.spec.replicas, Some(3));
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn foreign_deployment_is_a_conflict_and_left_untouched() -> anyhow::Result<()> {
    let f = Fixture::setup().without_controller().await?;

    let labels = std::collections::BTreeMap::from([("app".to_owned(), "legacy".to_owned())]);
    let foreign = Deployment {
        metadata: ObjectMeta {
            name: Some("legacy".into()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: DeploymentSpec {
            replicas: Some(5),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "legacy".into(),
                        image: Some("legacy:1".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    };
    let before = f
        .deployments
        .create(&PostParams::default(), &foreign)
        .await?;

    let ctl = start_controller(f.client.clone(), &f.ns, |_| {});
    create(&f.apps, &app("legacy", "nginx:1.27", 1)).await?;
    let a = eventually("Ready=False ResourceConflict", WAIT, || async {
        let a = f.apps.get("legacy").await?;
        Ok(condition(&a, READY)
            .is_some_and(|(_, reason, _)| reason == reasons::RESOURCE_CONFLICT)
            .then_some(a))
    })
    .await?;
    let (st, _, message) = condition(&a, READY).unwrap();
    assert_eq!(st, FALSE);
    assert!(message.contains("Deployment"), "{message}");
    assert_eq!(condition(&a, DEGRADED).unwrap().0, TRUE);

    // The transition is visible to `kubectl describe` as a Warning Event.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let warning = eventually("a ResourceConflict Event", WAIT, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some(reasons::RESOURCE_CONFLICT)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("legacy")
        }))
    })
    .await?;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));

    // One more reconcile after a change of the AppService: nothing is touched, and
    // nothing written at all (no write loop).
    let writes = ctl.metrics.write_count();
    support::poke(&f, &ctl.metrics, &["legacy".to_owned()], 1).await?;
    assert_eq!(ctl.metrics.write_count(), writes, "writes while blocked");
    let after = f.deployments.get("legacy").await?;
    assert_eq!(after.resource_version(), before.resource_version());
    assert!(after.owner_references().is_empty());
    assert_eq!(after.spec.replicas, Some(5));
    assert!(
        after
            .managed_fields()
            .iter()
            .all(|m| m.manager.as_deref() != Some(FIELD_MANAGER))
    );
    assert!(f.services.get_opt("legacy").await?.is_none());
    let a2 = f.apps.get("legacy").await?;
    assert_eq!(a2.status, a.status);
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn invalid_spec_is_reported_and_not_applied_until_fixed() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;

    // No webhook here: the schema admits this image, common::validate does not.
    create(&f.apps, &app("broken", "Not A Valid Image!", 1)).await?;
    let a = eventually("Ready=False InvalidSpec", WAIT, || async {
        let a = f.apps.get("broken").await?;
        Ok(condition(&a, READY)
            .is_some_and(|(_, reason, _)| reason == reasons::INVALID_SPEC)
            .then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&a, READY).unwrap();
    assert!(message.contains("spec.image"), "{message}");
    // Observed and stalled: this generation was looked at, and a human must act.
    assert_eq!(
        a.status.as_ref().unwrap().observed_generation,
        a.metadata.generation
    );
    let (stalled, reason, _) = condition(&a, common::conditions::STALLED).unwrap();
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", reasons::INVALID_SPEC)
    );
    // Its Warning Event is the last write; one more reconcile after a change of the
    // object writes nothing, and applies nothing.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    eventually("an InvalidSpec Event", WAIT, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some(reasons::INVALID_SPEC)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("broken")
        }))
    })
    .await?;
    let writes = ctl.metrics.write_count();
    support::poke(&f, &ctl.metrics, &["broken".to_owned()], 1).await?;
    assert_eq!(ctl.metrics.write_count(), writes, "writes while invalid");
    assert!(f.deployments.get_opt("broken").await?.is_none());
    assert_eq!(f.apps.get("broken").await?.status, a.status);

    f.apps
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "nginx:1.27"}})),
        )
        .await?;
    eventually("the Deployment after the fix", WAIT, || async {
        Ok(get_deployment(&f.deployments, "broken").await?)
    })
    .await?;
    let fixed = eventually("observedGeneration 2", WAIT, || async {
        let a = f.apps.get("broken").await?;
        Ok((a.status.as_ref().and_then(|s| s.observed_generation) == Some(2)).then_some(a))
    })
    .await?;
    assert_eq!(condition(&fixed, READY).unwrap().1, reasons::ROLLING_OUT);
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn steady_state_reconcile_makes_no_writes() -> anyhow::Result<()> {
    // The shipped defaults: the reconciles counted below are caused by events.
    let (f, ctl) = Fixture::start().await?;

    let mut spec_app = app("steady", "nginx:1.27", 2);
    spec_app.spec.env = vec![common::EnvVar {
        name: "LOG_LEVEL".into(),
        value: Some("info".into()),
        value_from: None,
    }];
    spec_app.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        // Normalized by the API server to 100m: must still compare equal.
        requests: Some(
            [(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("0.1".into()),
            )]
            .into(),
        ),
        ..Default::default()
    });
    create(&f.apps, &spec_app).await?;
    eventually("status written", WAIT, || async {
        let a = f.apps.get("steady").await?;
        Ok(condition(&a, READY).map(|_| ()))
    })
    .await?;
    eventually("the Service", WAIT, || async {
        Ok(f.services.get_opt("steady").await?)
    })
    .await?;
    // The initial flurry over: a reconcile after a poke writes nothing.
    support::settle(&f, &ctl.metrics).await?;

    let a0 = f.apps.get("steady").await?;
    let d0 = f.deployments.get("steady").await?;
    let s0 = f.services.get("steady").await?;
    let writes0 = ctl.metrics.write_count();
    let reconciles0 = ctl.metrics.reconcile_count();

    // An unrelated metadata change also triggers a reconcile.
    f.apps
        .patch(
            "steady",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await?;
    let a_touched = f.apps.get("steady").await?;
    eventually("a reconcile of the touched object", WAIT, || async {
        Ok((ctl.metrics.reconcile_count() > reconciles0).then_some(()))
    })
    .await?;
    assert_eq!(
        ctl.metrics.write_count(),
        writes0,
        "a write after the touch"
    );
    assert_eq!(
        f.deployments.get("steady").await?.resource_version(),
        d0.resource_version()
    );
    assert_eq!(
        f.services.get("steady").await?.resource_version(),
        s0.resource_version()
    );
    let a1 = f.apps.get("steady").await?;
    assert_ne!(a_touched.resource_version(), a0.resource_version());
    assert_eq!(a1.resource_version(), a_touched.resource_version());
    // And so does any unrelated change of the AppService or a child: a label on each,
    // in turn, each followed by a reconcile.
    support::poke(&f, &ctl.metrics, &["steady".to_owned()], 6).await?;
    let reconciles = ctl.metrics.reconcile_count() - reconciles0;
    assert!(
        reconciles >= 7,
        "expected several reconciles, saw {reconciles}"
    );
    assert_eq!(
        ctl.metrics.write_count(),
        writes0,
        "reconciles at steady state must not write"
    );
    let a1 = f.apps.get("steady").await?;
    assert_eq!(a1.status, a0.status);
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn delete_runs_finalizer_and_removes_the_appservice() -> anyhow::Result<()> {
    // External resources behind the finalizer, whose cleanup succeeds.
    let external = std::sync::Arc::new(FlakyExternal::default());
    let (f, ctl) = Fixture::setup().external(external.clone()).start().await?;

    let created = create(&f.apps, &app("gone", "nginx:1.27", 1)).await?;
    finalizer_on(&f.apps, "gone").await?;
    let d = eventually("the Deployment", WAIT, || async {
        Ok(get_deployment(&f.deployments, "gone").await?)
    })
    .await?;
    let s = eventually("the Service", WAIT, || async {
        Ok(f.services.get_opt("gone").await?)
    })
    .await?;

    f.apps.delete("gone", &DeleteParams::default()).await?;
    eventually("the AppService to be gone", WAIT, || async {
        Ok(f.apps.get_opt("gone").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(external.cleanups().len(), 1, "one cleanup, then released");
    // Plain mode has no garbage collector: check the children would be collected, i.e.
    // they are controlled by the deleted AppService.
    for refs in [d.owner_references(), s.owner_references()] {
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, created.uid().unwrap());
        assert_eq!(refs[0].block_owner_deletion, Some(true));
    }
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn without_the_controller_nothing_is_removed_from_a_deleted_appservice() -> anyhow::Result<()>
{
    // The finalizer is real: while no controller runs, a deleted AppService with external
    // resources stays.
    let external = std::sync::Arc::new(FlakyExternal::default());
    let (f, ctl) = Fixture::setup().external(external.clone()).start().await?;
    create(&f.apps, &app("held", "nginx:1.27", 1)).await?;
    finalizer_on(&f.apps, "held").await?;
    ctl.stop().await?;

    f.apps.delete("held", &DeleteParams::default()).await?;
    // Accepted, and held: with no controller running, nothing can release it.
    let held = f.apps.get("held").await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(external.cleanups().is_empty());

    let ctl = support::start_controller_with(f.client.clone(), &f.ns, |_| {}, external.clone());
    eventually("the AppService to be gone", WAIT, || async {
        Ok(f.apps.get_opt("held").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(external.cleanups().len(), 1);
    ctl.stop().await?;
    Ok(())
}

/// The finalizer is the controller's on every AppService: another writer that removes
/// it, or replaces the list, gets it put back next to the others' (which stay), so a
/// delete never skips the cleanup.
#[tokio::test]
async fn a_finalizer_removed_or_replaced_by_another_writer_comes_back() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::start().await?;
    create(&f.apps, &app("plain", "nginx:1.27", 1)).await?;
    finalizer_on(&f.apps, "plain").await?;
    let edits = [
        (json!({"metadata": {"finalizers": null}}), vec![]),
        (json!({"metadata": {"finalizers": []}}), vec![]),
        (
            json!({"metadata": {"finalizers": ["example.com/keep"]}}),
            vec!["example.com/keep".to_owned()],
        ),
    ];
    for (edit, others) in edits {
        f.apps
            .patch("plain", &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        let back = eventually(
            &format!("the finalizer back after {edit}"),
            WAIT,
            || async {
                let a = f.apps.get("plain").await?;
                Ok(a.finalizers().iter().any(|f| f == FINALIZER).then_some(a))
            },
        )
        .await?;
        let mut expected = others;
        expected.push(FINALIZER.to_owned());
        assert_eq!(back.finalizers(), expected.as_slice(), "after {edit}");
        // Back to the first list for the next edit.
        f.apps
            .patch(
                "plain",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})),
            )
            .await?;
    }
    ctl.stop().await?;
    Ok(())
}

/// External resources whose cleanup fails until told otherwise, counting its calls.
#[tokio::test]
async fn a_pass_that_still_sees_the_released_appservice_cleans_up_nothing() -> anyhow::Result<()> {
    // A pass queued while the deleting pass ran sees the AppService as it was until the
    // cache hears that it is gone. The race is made, not hoped for: the controller's
    // AppService watch is held, so its cache never hears, and a foreign Deployment named
    // like the AppService wakes it once more.
    let external = std::sync::Arc::new(FlakyExternal::default());
    let f = Fixture::setup().without_controller().await?;
    let mut held = app("held", "nginx:1.27", 1);
    held.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    create(&f.apps, &held).await?;
    f.apps.delete("held", &DeleteParams::default()).await?;
    // The controller's first list is served from the API server's watch cache: wait
    // until that shows the deletion, so the held watch hides only what comes after.
    eventually("the watch cache to show the deletion", WAIT, || async {
        let listed = f
            .apps
            .list(&kube::api::ListParams::default().match_any())
            .await?;
        Ok(listed
            .items
            .iter()
            .any(|a| a.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await?;
    let (client, _hold) = harness::holding(f.client.clone(), &f.ns, |r| {
        r.uri().path().ends_with("/appservices")
            && r.uri().query().unwrap_or_default().contains("watch=true")
    });
    let metrics = std::sync::Arc::new(controller::metrics::Metrics::default());
    let ctl = support::start_controller_counted(
        client,
        controller::config::Config::for_namespace(&f.ns),
        external.clone(),
        metrics.clone(),
    );
    eventually("the AppService to be gone", WAIT, || async {
        Ok(f.apps.get_opt("held").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(external.cleanups().len(), 1);

    let before = metrics.reconcile_count();
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "held", "labels": {"app": "someone-else"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "someone-else"}},
            "template": {
                "metadata": {"labels": {"app": "someone-else"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}
            }
        }
    }))?;
    f.deployments
        .create(&PostParams::default(), &foreign)
        .await?;
    support::reconciled_since(&metrics, before, "a pass on the released AppService").await?;
    assert_eq!(
        external.cleanups().len(),
        1,
        "a pass on the version the finalizer was released from cleaned up again"
    );
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_finalizer_removal_that_conflicts_after_the_cleanup_does_not_clean_up_again()
-> anyhow::Result<()> {
    let external = std::sync::Arc::new(FlakyExternal::default());
    let (f, ctl) = Fixture::setup().external(external.clone()).start().await?;
    create(&f.apps, &app("edited", "nginx:1.27", 1)).await?;
    finalizer_on(&f.apps, "edited").await?;
    if let Ok(mut edit) = external.edit_during_cleanup.lock() {
        *edit = Some((f.apps.clone(), "edited".to_owned()));
    }
    f.apps.delete("edited", &DeleteParams::default()).await?;
    eventually("the AppService to be gone", WAIT, || async {
        Ok(f.apps.get_opt("edited").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(
        external.cleanups().len(),
        1,
        "the pass after the conflicting removal cleaned up again"
    );
    ctl.stop().await?;
    Ok(())
}

/// Waits until the AppService `name` carries our finalizer.
async fn finalizer_on(apps: &Api<common::AppService>, name: &str) -> anyhow::Result<()> {
    eventually("the finalizer", WAIT, || async {
        let a = apps.get(name).await?;
        Ok(a.finalizers().iter().any(|f| f == FINALIZER).then_some(()))
    })
    .await?;
    Ok(())
}

#[derive(Default)]
struct FlakyExternal {
    fail: std::sync::atomic::AtomicBool,
    cleanups: std::sync::Mutex<Vec<std::time::Instant>>,
    /// Another writer labels this AppService during the next cleanup, so the
    /// finalizer's removal that follows it (guarded by the version the pass read)
    /// conflicts.
    edit_during_cleanup: std::sync::Mutex<Option<(Api<common::AppService>, String)>>,
}

impl FlakyExternal {
    /// When each cleanup was called, in order.
    fn cleanups(&self) -> Vec<std::time::Instant> {
        self.cleanups
            .lock()
            .map(|c| c.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }
}

impl controller::external::External for FlakyExternal {
    fn ensure<'a>(
        &'a self,
        _app: &'a controller::subject::Subject<'a>,
    ) -> futures::future::BoxFuture<'a, controller::error::Result<controller::external::Report>>
    {
        Box::pin(async { Ok(controller::external::Report::done()) })
    }

    fn cleanup<'a>(
        &'a self,
        _app: &'a controller::subject::Subject<'a>,
    ) -> futures::future::BoxFuture<'a, controller::error::Result<controller::external::Step>> {
        use std::sync::atomic::Ordering;
        Box::pin(async move {
            if let Ok(mut calls) = self.cleanups.lock() {
                calls.push(std::time::Instant::now());
            }
            let edit = self
                .edit_during_cleanup
                .lock()
                .ok()
                .and_then(|mut e| e.take());
            if let Some((api, name)) = edit {
                let patch =
                    serde_json::json!({"metadata": {"labels": {"edited": "during-cleanup"}}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(controller::error::Error::from)?;
            }
            if self.fail.load(Ordering::SeqCst) {
                Err(controller::error::Error::External {
                    reason: controller::error::ErrorReason::Cleanup,
                    message: "database cleanup: database server unreachable".into(),
                })
            } else {
                Ok(controller::external::Step::Done)
            }
        })
    }
}

#[tokio::test]
async fn failing_cleanup_keeps_the_finalizer_and_is_visible_until_it_succeeds() -> anyhow::Result<()>
{
    use std::sync::atomic::Ordering;
    let external = std::sync::Arc::new(FlakyExternal::default());
    external.fail.store(true, Ordering::SeqCst);
    let (fixture, ctl) = Fixture::setup().external(external.clone()).start().await?;
    let apps = &fixture.apps;

    create(apps, &app("db", "nginx:1.27", 1)).await?;
    finalizer_on(apps, "db").await?;
    apps.delete("db", &DeleteParams::default()).await?;

    let a = eventually("Degraded=True CleanupFailed", WAIT, || async {
        let a = apps.get("db").await?;
        Ok(condition(&a, DEGRADED)
            .is_some_and(|(s, r, _)| s == TRUE && r == reasons::CLEANUP_FAILED)
            .then_some(a))
    })
    .await?;
    assert!(a.metadata.deletion_timestamp.is_some());
    assert!(
        condition(&a, DEGRADED)
            .unwrap()
            .2
            .contains("database server unreachable")
    );
    // Retried with backoff, not in a hot loop. The first failure's status write is an
    // event and may bring one retry at once; from then on only the backoff schedules
    // them, and a retry waits at least the policy's delay for its attempt (equal jitter
    // never goes below half the nominal delay, which doubles per attempt): the fifth
    // call comes at least `delay(attempt 1)` after the fourth.
    let calls = eventually("five cleanup attempts", WAIT, || async {
        let calls = external.cleanups();
        Ok((calls.len() >= 5).then_some(calls))
    })
    .await?;
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    let least = controller::error::BackoffPolicy::default()
        .delay(controller::error::Retry::Transient, 1, 0.0)
        .expect("a transient error is retried");
    assert!(gaps[3] >= least, "cleanup retried too soon: gaps {gaps:?}");
    assert!(ctl.metrics.cleanup_failure_count() >= 5);
    assert!(
        apps.get_opt("db").await?.is_some(),
        "the finalizer must hold the object"
    );
    // The metric of what the finalizer holds: this object, since its deletion.
    let deleted = a.metadata.deletion_timestamp.clone().unwrap().0.as_second();
    assert_eq!(ctl.metrics.held(), (1, deleted));
    let scrape = ctl.metrics.encode()?;
    assert!(
        scrape.contains(&format!(
            "appservice_controller_finalizer_oldest_deletion_timestamp_seconds {deleted}"
        )),
        "{scrape}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = fixture.api();
    let list = events.list(&Default::default()).await?;
    assert!(
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some(reasons::CLEANUP_FAILED)),
        "a CleanupFailed Event"
    );

    external.fail.store(false, Ordering::SeqCst);
    eventually(
        "the AppService to be gone",
        Duration::from_secs(60),
        || async { Ok(apps.get_opt("db").await?.is_none().then_some(())) },
    )
    .await?;
    eventually("nothing held", WAIT, || async {
        Ok((ctl.metrics.held() == (0, 0)).then_some(()))
    })
    .await?;
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_child_the_api_server_rejects_is_reported_until_the_spec_is_fixed() -> anyhow::Result<()>
{
    let (f, ctl) = Fixture::start().await?;

    // Passes the schema and common::validate, but Pods cannot reference this field.
    let mut bad = app("rejected", "nginx:1.27", 1);
    bad.spec.env = vec![common::EnvVar {
        name: "NODE".into(),
        value: None,
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: "spec.bogusField".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }];
    let invalid = || {
        ctl.metrics
            .errors_of(controller::metrics::ErrorReason::Invalid)
    };
    let invalid_before = invalid();
    let created = std::time::Instant::now();
    create(&f.apps, &bad).await?;
    let a = eventually("Ready=False ApplyFailed", WAIT, || async {
        let a = f.apps.get("rejected").await?;
        Ok(condition(&a, READY)
            .is_some_and(|(_, reason, _)| reason == reasons::APPLY_FAILED)
            .then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&a, READY).unwrap();
    assert!(message.contains("Deployment"), "{message}");
    assert!(message.contains("fieldPath"), "{message}");
    assert_eq!(condition(&a, DEGRADED).unwrap().0, TRUE);
    assert!(f.deployments.get_opt("rejected").await?.is_none());
    // Retried with backoff, not in a loop, and the retries write nothing. The first
    // failure's status write is an event and may bring the second attempt at once; the
    // third waits for the backoff of at least the second attempt.
    eventually("two retries of the rejected apply", WAIT, || async {
        Ok((invalid() >= invalid_before + 3).then_some(()))
    })
    .await?;
    let least = controller::error::BackoffPolicy::default()
        .delay(controller::error::Retry::Rejected, 1, 0.0)
        .expect("a rejected apply is retried");
    assert!(
        created.elapsed() >= least,
        "three rejected applies within {:?}",
        created.elapsed()
    );
    assert_eq!(
        f.apps.get("rejected").await?.resource_version(),
        a.resource_version()
    );

    f.apps
        .patch(
            "rejected",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"env": [{"name": "NODE", "value": "x"}]}})),
        )
        .await?;
    eventually("the Deployment after the fix", WAIT, || async {
        Ok(get_deployment(&f.deployments, "rejected").await?)
    })
    .await?;
    let fixed = eventually("Degraded=False", WAIT, || async {
        let a = f.apps.get("rejected").await?;
        Ok(condition(&a, DEGRADED)
            .is_some_and(|(s, _, _)| s == FALSE)
            .then_some(a))
    })
    .await?;
    assert_eq!(condition(&fixed, READY).unwrap().1, reasons::ROLLING_OUT);
    ctl.stop().await?;
    Ok(())
}
