//! The Pods of an AppService in front of what admits and shapes them in a real cluster:
//! Pod Security admission at each level, a ResourceQuota, a LimitRange, and a
//! HorizontalPodAutoscaler on the AppService's scale subresource.
//!
//! A full control plane: the ReplicaSet controller creates real Pod objects through the
//! API server's admission chain (PodSecurity, ResourceQuota, LimitRanger), kwok marks
//! them Ready, and kube-controller-manager runs the quota and autoscaler controllers as a
//! cluster does. The controller runs with its shipped settings (rollout requeue 10 s,
//! resync 10 min): every status change below is driven by the Deployment's own events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use common::conditions::{DEGRADED, FALSE, PROGRESSING, READY, TRUE, reasons};
use common::{AppService, PodSecurity, SecurityProfile};
use harness::{PodSecurityLevel, eventually};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{LimitRange, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Fixture, app, condition, create};

const WAIT: Duration = Duration::from_secs(90);

/// The Pods of AppService `name` that are not being deleted.
async fn pods_of(f: &Fixture, name: &str) -> anyhow::Result<Vec<Pod>> {
    let pods = f
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits until AppService `name` is Ready with `replicas` ready for its current
/// generation, and returns it.
async fn ready(f: &Fixture, name: &str, replicas: i32) -> anyhow::Result<AppService> {
    Ok(eventually(
        &format!("{name} Ready with {replicas} replicas"),
        WAIT,
        || async {
            let a = f.apps.get(name).await?;
            let status = a.status.clone().unwrap_or_default();
            let ok = status.ready_replicas == Some(replicas)
                && status.observed_generation == a.metadata.generation
                && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
            Ok(ok.then_some(a))
        },
    )
    .await?)
}

/// Waits until AppService `name` reports `reason` on Ready=False, and returns the
/// message of its Ready condition.
async fn not_ready_for(f: &Fixture, name: &str, reason: &str) -> anyhow::Result<String> {
    let a = eventually(&format!("{name} Ready=False/{reason}"), WAIT, || async {
        let a = f.apps.get(name).await?;
        let hit = condition(&a, READY).is_some_and(|(s, r, _)| s == FALSE && r == reason);
        Ok(hit.then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&a, READY).unwrap();
    let (degraded, degraded_reason, degraded_message) = condition(&a, DEGRADED).unwrap();
    assert_eq!(
        (degraded.as_str(), degraded_reason.as_str()),
        (TRUE, reason)
    );
    assert_eq!(degraded_message, message);
    assert_eq!(condition(&a, PROGRESSING).unwrap().0, FALSE);
    Ok(message)
}

/// Every Pod of `name` runs as the Restricted template says, as Pod Security admitted it.
fn assert_restricted(pods: &[Pod]) {
    for pod in pods {
        let spec = pod.spec.as_ref().unwrap();
        let pod_context = spec.security_context.as_ref().unwrap();
        assert_eq!(pod_context.run_as_non_root, Some(true));
        assert_eq!(
            pod_context.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let context = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(context.allow_privilege_escalation, Some(false));
        assert_eq!(
            context.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
    }
}

/// Create, scale, edit the image, Ready, delete: with real Pods in a namespace enforcing
/// `level`.
async fn lifecycle(level: PodSecurityLevel) -> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().pod_security(level).start().await?;
    assert_eq!(f.ns.pod_security(), level);

    create(&f.apps, &app("web", "registry.example.com/web:v1", 2)).await?;
    let a = ready(&f, "web", 2).await?;
    assert_eq!(condition(&a, READY).unwrap().1, reasons::AVAILABLE);
    assert_eq!(condition(&a, DEGRADED).unwrap().0, FALSE);
    let pods = pods_of(&f, "web").await?;
    assert_eq!(pods.len(), 2, "{pods:#?}");
    assert_restricted(&pods);

    // Scale through the spec.
    f.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    ready(&f, "web", 3).await?;
    assert_eq!(pods_of(&f, "web").await?.len(), 3);

    // A new image: a rollout to three new Pods, all admitted.
    f.apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "registry.example.com/web:v2"}})),
        )
        .await?;
    eventually("three Pods of the new image, Ready", WAIT, || async {
        let a = f.apps.get("web").await?;
        let pods = pods_of(&f, "web").await?;
        let images: Vec<_> = pods
            .iter()
            .map(|p| p.spec.as_ref().unwrap().containers[0].image.clone())
            .collect();
        let done = images.len() == 3
            && images
                .iter()
                .all(|i| i.as_deref() == Some("registry.example.com/web:v2"))
            && a.status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        Ok(done.then_some(()))
    })
    .await?;
    assert_restricted(&pods_of(&f, "web").await?);

    // Delete: the children go, and with them the ReplicaSets and Pods.
    f.apps.delete("web", &DeleteParams::default()).await?;
    eventually(
        "the AppService and everything under it gone",
        WAIT,
        || async {
            let gone = f.apps.get_opt("web").await?.is_none()
                && f.deployments.get_opt("web").await?.is_none()
                && f.services.get_opt("web").await?.is_none()
                && f.api::<ReplicaSet>()
                    .list(&ListParams::default())
                    .await?
                    .items
                    .is_empty()
                && f.api::<Pod>()
                    .list(&ListParams::default())
                    .await?
                    .items
                    .is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn lifecycle_under_restricted() -> anyhow::Result<()> {
    lifecycle(PodSecurityLevel::Restricted).await
}

#[tokio::test]
async fn lifecycle_under_baseline() -> anyhow::Result<()> {
    lifecycle(PodSecurityLevel::Baseline).await
}

/// The opt-out: an AppService whose image must run as root asks for `Baseline`. A
/// namespace enforcing `restricted` refuses its Pods, and status says so with Pod
/// Security's own message; labelled down to `baseline`, the Pods come and it is Ready.
#[tokio::test]
async fn a_baseline_app_is_refused_by_a_restricted_namespace_until_it_is_relabelled()
-> anyhow::Result<()> {
    let (mut f, ctl) = Fixture::setup().full().start().await?;
    let mut root = app("root", "registry.example.com/needs-root:v1", 2);
    root.spec.pod_security = Some(PodSecurity {
        profile: Some(SecurityProfile::Baseline),
        run_as_user: Some(0),
        ..PodSecurity::default()
    });
    create(&f.apps, &root).await?;
    let message = not_ready_for(&f, "root", reasons::REPLICA_FAILURE).await?;
    assert!(
        message.starts_with("0/2 replicas ready; FailedCreate: ")
            && message.contains("violates PodSecurity \"restricted:latest\"")
            && message.contains("runAsNonRoot"),
        "{message}"
    );
    assert!(pods_of(&f, "root").await?.is_empty());

    f.ns.enforce(PodSecurityLevel::Baseline).await?;
    let a = ready(&f, "root", 2).await?;
    assert_eq!(condition(&a, DEGRADED).unwrap().0, FALSE);
    let pods = pods_of(&f, "root").await?;
    assert_eq!(pods.len(), 2);
    for pod in &pods {
        let context = pod.spec.as_ref().unwrap().security_context.clone().unwrap();
        assert_eq!(
            (context.run_as_user, context.run_as_non_root),
            (Some(0), None)
        );
    }
    ctl.stop().await?;
    Ok(())
}

/// A ResourceQuota of one Pod and an AppService of three: one Pod runs, status says the
/// quota is why the others do not, and raising the quota makes it Ready.
#[tokio::test]
async fn a_quota_of_one_pod_runs_one_of_three_and_status_names_the_quota() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().start().await?;
    let quotas = support::pod_quota(&f, "one-pod", 1).await?;

    create(&f.apps, &app("shop", "registry.example.com/shop:v1", 3)).await?;
    let message = eventually(
        "one ready replica and the quota in status",
        WAIT,
        || async {
            let a = f.apps.get("shop").await?;
            let one = a.status.as_ref().and_then(|s| s.ready_replicas) == Some(1);
            let ready = condition(&a, READY);
            Ok(ready.filter(|(s, r, _)| one && s == FALSE && r == reasons::REPLICA_FAILURE))
        },
    )
    .await?
    .2;
    assert!(
        message.starts_with("1/3 replicas ready; FailedCreate: ")
            && message.contains("exceeded quota: one-pod"),
        "{message}"
    );
    not_ready_for(&f, "shop", reasons::REPLICA_FAILURE).await?;
    assert_eq!(pods_of(&f, "shop").await?.len(), 1);

    quotas
        .patch(
            "one-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"pods": "3"}}})),
        )
        .await?;
    ready(&f, "shop", 3).await?;
    assert_eq!(pods_of(&f, "shop").await?.len(), 3);
    ctl.stop().await?;
    Ok(())
}

/// A LimitRange's defaults reach the Pods (LimitRanger sets them at admission), not the
/// Deployment: the controller does not fight them. One whose maximum the AppService's
/// limit exceeds refuses the Pods, and status gives the limit range's message.
#[tokio::test]
async fn a_limit_range_defaults_the_pods_resources_and_its_maximum_is_reported()
-> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().start().await?;
    let limits: LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "container-defaults"},
        "spec": {"limits": [{
            "type": "Container",
            "defaultRequest": {"cpu": "50m", "memory": "32Mi"},
            "default": {"cpu": "200m", "memory": "64Mi"},
            "max": {"cpu": "500m"}
        }]}
    }))?;
    f.api::<LimitRange>()
        .create(&PostParams::default(), &limits)
        .await?;

    create(&f.apps, &app("api", "registry.example.com/api:v1", 2)).await?;
    ready(&f, "api", 2).await?;
    for pod in pods_of(&f, "api").await? {
        let resources = pod.spec.unwrap().containers[0].resources.clone().unwrap();
        let requests = resources.requests.unwrap();
        let limits = resources.limits.unwrap();
        assert_eq!(requests["cpu"].0, "50m");
        assert_eq!(requests["memory"].0, "32Mi");
        assert_eq!(limits["cpu"].0, "200m");
        assert_eq!(limits["memory"].0, "64Mi");
    }
    // The Deployment still has the template the AppService says (no resources), and the
    // controller wrote nothing after its first apply: the defaults are not drift.
    let d = f.deployments.get("api").await?;
    assert_eq!(
        d.spec.template.spec.unwrap().containers[0].resources,
        Some(Default::default())
    );
    assert_eq!(
        ctl.requests.writes_to("deployments"),
        [format!(
            "POST /apis/apps/v1/namespaces/{}/deployments",
            f.ns.name()
        )],
        "the Deployment created, never written again"
    );

    let mut greedy = app("greedy", "registry.example.com/greedy:v1", 1);
    greedy.spec.resources = Some(serde_json::from_value(json!({"limits": {"cpu": "1"}}))?);
    create(&f.apps, &greedy).await?;
    let message = not_ready_for(&f, "greedy", reasons::REPLICA_FAILURE).await?;
    assert!(
        message.starts_with("0/1 replicas ready; FailedCreate: ")
            && message.contains("maximum cpu usage per Container is 500m, but limit is 1"),
        "{message}"
    );
    ctl.stop().await?;
    Ok(())
}

/// A HorizontalPodAutoscaler on the AppService's scale subresource. Below its
/// `minReplicas` it scales without metrics (none are served here; above the minimum it
/// would need the metrics API), through `/scale`, as it does in a cluster.
#[tokio::test]
async fn an_autoscaler_with_min_replicas_4_scales_the_appservice_to_4() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().start().await?;
    create(&f.apps, &app("scaled", "registry.example.com/scaled:v1", 3)).await?;
    ready(&f, "scaled", 3).await?;
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "scaled"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "platform.example.com/v1beta1",
                "kind": "AppService",
                "name": "scaled"
            },
            "minReplicas": 4,
            "maxReplicas": 6,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
        }
    }))?;
    f.api::<HorizontalPodAutoscaler>()
        .create(&PostParams::default(), &hpa)
        .await?;
    let a = ready(&f, "scaled", 4).await?;
    assert_eq!(a.spec.replicas, Some(4));
    assert_eq!(f.deployments.get("scaled").await?.spec.replicas, Some(4));
    assert_eq!(pods_of(&f, "scaled").await?.len(), 4);
    let status = f
        .api::<HorizontalPodAutoscaler>()
        .get_status("scaled")
        .await?
        .status
        .unwrap();
    assert_eq!(status.desired_replicas, 4);
    ctl.stop().await?;
    Ok(())
}

/// A rollout that cannot progress ends in `ProgressDeadlineExceeded`, and status says so.
/// Here its Pods fit on no node (on a real node the same comes of an image that cannot
/// be pulled, or a Pod that never becomes ready, which kwok cannot show); the deadline is
/// shortened on the live Deployment, a field the controller leaves to others, as an admin
/// may. A fixed spec rolls out and clears it.
#[tokio::test]
async fn a_rollout_past_its_progress_deadline_says_so_until_a_fix_rolls_out() -> anyhow::Result<()>
{
    let (f, ctl) = Fixture::setup().full().start().await?;
    let mut huge = app("huge", "registry.example.com/huge:v1", 1);
    // More CPUs than the simulated node has (1000): the Pod stays Pending.
    huge.spec.resources = Some(serde_json::from_value(
        json!({"requests": {"cpu": "2000"}}),
    )?);
    create(&f.apps, &huge).await?;
    eventually("the Deployment", WAIT, || async {
        Ok(f.deployments.get_opt("huge").await?)
    })
    .await?;
    f.deployments
        .patch(
            "huge",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"progressDeadlineSeconds": 5}})),
        )
        .await?;
    let message = not_ready_for(&f, "huge", reasons::PROGRESS_DEADLINE_EXCEEDED).await?;
    assert!(
        message.starts_with("0/1 replicas ready; the rollout exceeded its progress deadline: ")
            && message.contains("has timed out progressing"),
        "{message}"
    );

    f.apps
        .patch(
            "huge",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"cpu": "100m"}}}})),
        )
        .await?;
    let a = ready(&f, "huge", 1).await?;
    assert_eq!(condition(&a, DEGRADED).unwrap().0, FALSE);
    // The controller kept the deadline someone else set.
    assert_eq!(
        f.deployments
            .get("huge")
            .await?
            .spec
            .progress_deadline_seconds,
        Some(5)
    );
    ctl.stop().await?;
    Ok(())
}

/// Another writer changes who the Pods run as (root, and privileged): the controller
/// puts both security contexts back, and the Pods that run are admitted under
/// `restricted` again. Woken by the Deployment's event: the resync is 10 minutes away.
#[tokio::test]
async fn security_contexts_changed_by_another_writer_are_put_back() -> anyhow::Result<()> {
    let (f, ctl) = Fixture::setup().full().start().await?;
    create(
        &f.apps,
        &app("guarded", "registry.example.com/guarded:v1", 2),
    )
    .await?;
    ready(&f, "guarded", 2).await?;
    let desired = f
        .deployments
        .get("guarded")
        .await?
        .spec
        .template
        .spec
        .unwrap();

    let edit = json!({"spec": {"template": {"spec": {
        "securityContext": {"runAsNonRoot": null, "runAsUser": 0},
        "containers": [{"name": "app", "securityContext": {
            "allowPrivilegeEscalation": null, "privileged": true,
            "capabilities": {"add": ["NET_ADMIN"]}}}]
    }}}});
    let edited = f
        .deployments
        .patch(
            "guarded",
            &PatchParams {
                field_manager: Some("someone-else".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Strategic(edit),
        )
        .await?;
    let pod = edited.spec.template.spec.unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_user, Some(0));
    let context = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(
        (context.privileged, context.allow_privilege_escalation),
        (Some(true), None)
    );
    eventually("the security contexts put back", WAIT, || async {
        let pod = f
            .deployments
            .get("guarded")
            .await?
            .spec
            .template
            .spec
            .unwrap();
        let back = pod.security_context == desired.security_context
            && pod.containers[0].security_context == desired.containers[0].security_context;
        Ok(back.then_some(()))
    })
    .await?;
    ready(&f, "guarded", 2).await?;
    let pods = pods_of(&f, "guarded").await?;
    assert_eq!(pods.len(), 2);
    assert_restricted(&pods);
    ctl.stop().await?;
    Ok(())
}
