//! What GitOps tools show for an AppService: live objects from the real API server,
//! written by the real controller at its shipped settings, fed through
//!
//! * the chart's Argo CD health script
//!   (`charts/appservice-operator/files/argocd/health-appservice.lua`) by `argocd-health`,
//!   which runs it with gopher-lua as Argo CD does, and
//! * kstatus' `status.Compute` (sigs.k8s.io/cli-utils, what Flux's health checks and
//!   Helm's `--wait` use) by `kstatus`,
//!
//! both test assets built from their Go modules by `tests/envtest/assets/build.sh`.
//!
//! A full control plane: Pods become ready on kwok's node, the ReplicaSet controller
//! creates Pods through the admission chain (Pod Security, ResourceQuota), so a refused
//! Pod reaches the Deployment's status and the AppService's as the cluster reports it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{AppService, DatabaseSpec, PodSecurity, SecurityProfile};
use harness::{PodSecurityLevel, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::json;
use support::{Fixture, Running, app, create};

const WAIT: Duration = Duration::from_secs(90);

/// An Argo CD health: `status` and `message` as the script returned them.
#[derive(Debug, Clone, Deserialize, PartialEq)]
struct Health {
    status: String,
    message: String,
}

/// The shipped health script of `kind` (`appservice`, `databaseclass`).
fn script(kind: &str) -> PathBuf {
    harness::assets::workspace_root()
        .join("charts/appservice-operator/files/argocd")
        .join(format!("health-{kind}.lua"))
}

/// Runs the test tool `name` with `args` on `object` (JSON on stdin); its stdout.
fn evaluate(
    name: &str,
    args: &[PathBuf],
    object: &impl serde::Serialize,
) -> anyhow::Result<Vec<u8>> {
    let evaluator = harness::assets::tool(name)?;
    let mut child = Command::new(&evaluator)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(&serde_json::to_vec(object)?)?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        evaluator.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Runs kstatus' `status.Compute` on `object`: `Current`, `InProgress`, `Failed`,
/// `Terminating` and its message.
fn kstatus(object: &impl serde::Serialize) -> anyhow::Result<Health> {
    let mut results: Vec<Health> = serde_json::from_slice(&evaluate("kstatus", &[], object)?)?;
    anyhow::ensure!(results.len() == 1, "one result expected: {results:?}");
    Ok(results.remove(0))
}

/// Asserts what both evaluators say of `object`: Argo CD's health and kstatus' status.
fn both_say(
    object: &AppService,
    argo: &str,
    kstatus_status: &str,
) -> anyhow::Result<(Health, Health)> {
    let (h, k) = (health(object)?, kstatus(object)?);
    assert_eq!(
        (h.status.as_str(), k.status.as_str()),
        (argo, kstatus_status),
        "Argo CD {h:?}, kstatus {k:?}, status {:?}",
        object.status
    );
    Ok((h, k))
}

/// Runs the shipped AppService health script on `object` as Argo CD does.
fn health(object: &AppService) -> anyhow::Result<Health> {
    health_of("appservice", object)
}

/// Runs the shipped health script of `kind` on `object` as Argo CD does.
fn health_of(kind: &str, object: &impl serde::Serialize) -> anyhow::Result<Health> {
    Ok(serde_json::from_slice(&evaluate(
        "argocd-health",
        &[script(kind)],
        object,
    )?)?)
}

/// Polls AppService `name` until the script says `status`; returns the health and object.
async fn wait_health(
    f: &Fixture,
    name: &str,
    status: &str,
) -> anyhow::Result<(Health, AppService)> {
    Ok(eventually(
        &format!("{name} to be {status} for Argo CD"),
        WAIT,
        || async {
            let a = f.apps.get(name).await?;
            let h = health(&a)?;
            Ok((h.status == status).then_some((h, a)))
        },
    )
    .await?)
}

/// The controller of the fixture's namespace with the real database step (admin
/// Secrets read from the test's namespace), at shipped settings otherwise.
fn controller(f: &Fixture) -> Running {
    let metrics = Arc::new(controller::metrics::Metrics::default());
    let config = controller::Config::for_namespace(f.ns.name());
    support::start_controller_counted(
        f.client.clone(),
        config,
        Arc::new(support::databases(f, metrics.clone())),
        metrics,
    )
}

/// Create, spec edit, scale to zero: Progressing until the controller has observed the
/// generation, then Healthy. The controller is stopped across each edit so that the
/// unobserved generation is read for certain, not raced.
#[tokio::test]
async fn create_edit_and_scale_to_zero_are_progressing_then_healthy() -> anyhow::Result<()> {
    let f = Fixture::setup().full().without_controller().await?;
    create(&f.apps, &app("web", "registry.example.com/web:v1", 2)).await?;
    let fresh = f.apps.get("web").await?;
    let h = health(&fresh)?;
    assert_eq!(h.status, "Progressing", "{h:?}");
    assert_eq!(
        h.message,
        "waiting for the controller to observe generation 1"
    );
    // kstatus cannot tell an object nobody has written status for from one that needs
    // none: `Current` (docs/operators/gitops.md gives Flux the expression that waits for Ready).
    assert_eq!(kstatus(&fresh)?.status, "Current");

    let ctl = controller(&f);
    let (h, a) = wait_health(&f, "web", "Healthy").await?;
    assert_eq!(
        a.status.as_ref().and_then(|s| s.ready_replicas),
        Some(2),
        "{h:?}"
    );
    both_say(&a, "Healthy", "Current")?;
    ctl.stop().await?;

    // A spec edit nobody has observed yet.
    let patch = json!({"spec": {"image": "registry.example.com/web:v2"}});
    f.apps
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let edited = f.apps.get("web").await?;
    let (h, k) = both_say(&edited, "Progressing", "InProgress")?;
    assert_eq!(
        h.message,
        "waiting for the controller to observe generation 2"
    );
    assert!(k.message.contains("observed generation is 1"), "{k:?}");
    let ctl = controller(&f);
    let (_, a) = wait_health(&f, "web", "Healthy").await?;
    both_say(&a, "Healthy", "Current")?;
    assert_eq!(
        a.status.as_ref().and_then(|s| s.observed_generation),
        Some(2)
    );
    let deployment = f.deployments.get("web").await?;
    let image = deployment.spec.template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("registry.example.com/web:v2"));

    // Scaled to zero is what was asked for: Healthy.
    let patch = json!({"spec": {"replicas": 0}});
    f.apps
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let (h, a) = eventually("web scaled to zero and Healthy", WAIT, || async {
        let a = f.apps.get("web").await?;
        let h = health(&a)?;
        let observed = a.status.as_ref().and_then(|s| s.observed_generation) == Some(3);
        Ok((observed && h.status == "Healthy").then_some((h, a)))
    })
    .await?;
    assert_eq!(h.message, "scaled to zero");
    both_say(&a, "Healthy", "Current")?;
    ctl.stop().await?;
    Ok(())
}

/// A class that does not exist needs an admin: Degraded (Argo CD) and Failed (kstatus)
/// with the reason, never Healthy, and not an endless Progressing either; observed, so
/// no tool waits for the controller. Creating the class unblocks it.
#[tokio::test]
async fn an_unknown_database_class_is_degraded() -> anyhow::Result<()> {
    let f = Fixture::setup().full().without_controller().await?;
    let ctl = controller(&f);
    let mut shop = app("shop", "registry.example.com/shop:v1", 1);
    shop.spec.database = Some(DatabaseSpec {
        class: "no-such-class".into(),
    });
    create(&f.apps, &shop).await?;
    let (h, a) = wait_health(&f, "shop", "Degraded").await?;
    assert!(
        h.message.contains("\"no-such-class\" does not exist"),
        "{h:?}"
    );
    let (_, k) = both_say(&a, "Degraded", "Failed")?;
    assert!(
        k.message.contains("\"no-such-class\" does not exist"),
        "{k:?}"
    );
    assert_eq!(
        a.status.as_ref().and_then(|s| s.observed_generation),
        a.metadata.generation
    );
    ctl.stop().await?;
    Ok(())
}

/// A Deployment of the AppService's name that the controller does not own: Degraded,
/// the message naming the conflict.
#[tokio::test]
async fn a_name_taken_by_a_foreign_deployment_is_degraded() -> anyhow::Result<()> {
    let f = Fixture::setup().full().without_controller().await?;
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "taken"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "someone-else"}},
            "template": {
                "metadata": {"labels": {"app": "someone-else"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example.com/other:v1"}]}
            }
        }
    }))?;
    f.deployments
        .create(&PostParams::default(), &foreign)
        .await?;
    let ctl = controller(&f);
    create(&f.apps, &app("taken", "registry.example.com/web:v1", 1)).await?;
    let (h, a) = wait_health(&f, "taken", "Degraded").await?;
    assert!(h.message.contains("taken"), "{h:?}");
    let (_, k) = both_say(&a, "Degraded", "Failed")?;
    assert!(
        k.message.contains("not controlled by this AppService"),
        "{k:?}"
    );
    ctl.stop().await?;
    Ok(())
}

/// Pods the namespace refuses, by a ResourceQuota of no Pods and by Pod Security:
/// Degraded with the API server's reason.
#[tokio::test]
async fn forbidden_pods_are_degraded() -> anyhow::Result<()> {
    // A quota of zero Pods.
    let f = Fixture::setup().full().without_controller().await?;
    support::pod_quota(&f, "no-pods", 0).await?;
    let ctl = controller(&f);
    create(&f.apps, &app("quota", "registry.example.com/web:v1", 1)).await?;
    let (h, a) = wait_health(&f, "quota", "Degraded").await?;
    assert!(h.message.contains("quota"), "{h:?}");
    let (_, k) = both_say(&a, "Degraded", "Failed")?;
    assert!(k.message.contains("quota"), "{k:?}");
    ctl.stop().await?;

    // Pod Security: a namespace enforcing `restricted`, an AppService whose Pods ask to
    // run as root, which `restricted` forbids.
    let f = Fixture::setup()
        .full()
        .pod_security(PodSecurityLevel::Restricted)
        .without_controller()
        .await?;
    let ctl = controller(&f);
    let mut root: AppService = app("root", "registry.example.com/needs-root:v1", 1);
    root.spec.pod_security = Some(PodSecurity {
        profile: Some(SecurityProfile::Baseline),
        run_as_user: Some(0),
        ..PodSecurity::default()
    });
    create(&f.apps, &root).await?;
    let (h, a) = wait_health(&f, "root", "Degraded").await?;
    assert!(
        h.message
            .contains("violates PodSecurity \"restricted:latest\""),
        "{h:?}"
    );
    both_say(&a, "Degraded", "Failed")?;
    ctl.stop().await?;
    Ok(())
}

/// Deletion while a finalizer holds the object: Progressing, saying it is being
/// deleted; once released, the object is gone.
#[tokio::test]
async fn deletion_with_the_finalizer_held_is_progressing() -> anyhow::Result<()> {
    let f = Fixture::setup().full().without_controller().await?;
    let ctl = controller(&f);
    create(&f.apps, &app("gone", "registry.example.com/web:v1", 1)).await?;
    wait_health(&f, "gone", "Healthy").await?;
    // Another party's finalizer (a backup tool, say) next to the controller's.
    let mut finalizers = f
        .apps
        .get("gone")
        .await?
        .metadata
        .finalizers
        .unwrap_or_default();
    finalizers.push("example.com/backup".to_owned());
    let hold = json!({"metadata": {"finalizers": finalizers}});
    f.apps
        .patch("gone", &PatchParams::default(), &Patch::Merge(&hold))
        .await?;
    f.apps.delete("gone", &DeleteParams::default()).await?;
    let (h, a) = wait_health(&f, "gone", "Progressing").await?;
    assert!(a.metadata.deletion_timestamp.is_some());
    assert!(h.message.starts_with("being deleted"), "{h:?}");
    both_say(&a, "Progressing", "Terminating")?;
    // The controller releases its own finalizer; only the other party's holds it then.
    let held = eventually("only example.com/backup to hold gone", WAIT, || async {
        let a = f.apps.get("gone").await?;
        let only =
            a.metadata.finalizers.clone().unwrap_or_default() == ["example.com/backup".to_owned()];
        Ok(only.then_some(a))
    })
    .await?;
    let (h, _) = both_say(&held, "Progressing", "Terminating")?;
    assert!(h.message.starts_with("being deleted"), "{h:?}");
    let release = json!({"metadata": {"finalizers": null}});
    f.apps
        .patch("gone", &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    eventually("gone to be deleted", WAIT, || async {
        Ok(f.apps.get_opt("gone").await?.is_none().then_some(()))
    })
    .await?;
    ctl.stop().await?;
    Ok(())
}

/// A DatabaseClass the controller can log in with is Healthy (kstatus: Current); one
/// whose admin password is wrong is Degraded (kstatus: Failed, Stalled), saying why. The controller logs in (and writes the class's
/// status) when an AppService uses the class: until then it is Progressing.
#[tokio::test]
async fn database_classes_are_healthy_when_reachable_and_degraded_when_not() -> anyhow::Result<()> {
    for (password, expected) in [
        (None, "Healthy"),
        (Some("not-the-admin-password"), "Degraded"),
    ] {
        let f = Fixture::setup().without_controller().await?;
        let pg = harness::Postgres::start().await?;
        let class = support::database_class(&f, &pg, "Delete", password).await?;
        let classes: kube::Api<common::DatabaseClass> = kube::Api::all(f.client.clone());
        let unused = health_of("databaseclass", &classes.get(&class).await?)?;
        assert_eq!(unused.status, "Progressing", "{unused:?}");
        let ctl = controller(&f);
        let mut user = app("user", "registry.example.com/shop:v1", 1);
        user.spec.database = Some(DatabaseSpec {
            class: class.clone(),
        });
        create(&f.apps, &user).await?;
        let (h, c) = eventually(&format!("class {class} to be {expected}"), WAIT, || async {
            let c = classes.get(&class).await?;
            let h = health_of("databaseclass", &c)?;
            Ok((h.status == expected).then_some((h, c)))
        })
        .await?;
        if expected == "Degraded" {
            assert!(!h.message.is_empty(), "{h:?}");
            assert!(!h.message.contains("not-the-admin-password"), "{h:?}");
        }
        // kstatus: an admin must fix the login (Stalled), or nothing to wait for.
        let k = kstatus(&c)?;
        let kstatus_expected = if expected == "Degraded" {
            "Failed"
        } else {
            "Current"
        };
        assert_eq!(k.status, kstatus_expected, "{k:?} {:?}", c.status);
        assert!(c.status.is_some());
        ctl.stop().await?;
        classes.delete(&class, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The controller's own finalizer held: the database server is down while the
/// AppService is deleted, so the cleanup fails. Progressing ("being deleted: " and the
/// failure), never Healthy; gone once the server is back.
#[tokio::test]
async fn deletion_held_by_a_failing_database_cleanup_is_progressing() -> anyhow::Result<()> {
    let f = Fixture::setup().full().without_controller().await?;
    let mut pg = harness::Postgres::start().await?;
    let class = support::database_class(&f, &pg, "Delete", None).await?;
    let ctl = controller(&f);
    let mut shop = app("shop", "registry.example.com/shop:v1", 1);
    shop.spec.database = Some(DatabaseSpec {
        class: class.clone(),
    });
    create(&f.apps, &shop).await?;
    wait_health(&f, "shop", "Healthy").await?;

    pg.stop();
    f.apps.delete("shop", &DeleteParams::default()).await?;
    let (h, a) = eventually("shop held by a failing cleanup", WAIT, || async {
        let a = f.apps.get("shop").await?;
        let h = health(&a)?;
        let failing =
            support::condition(&a, common::conditions::DEGRADED).is_some_and(|(s, r, _)| {
                s == common::conditions::TRUE && r == common::conditions::reasons::CLEANUP_FAILED
            });
        Ok(failing.then_some((h, a)))
    })
    .await?;
    assert!(a.metadata.deletion_timestamp.is_some());
    assert_eq!(h.status, "Progressing", "{h:?}");
    assert!(h.message.starts_with("being deleted: "), "{h:?}");
    assert_eq!(kstatus(&a)?.status, "Terminating");
    assert!(h.message.contains(&class), "{h:?}");

    pg.start_again().await?;
    eventually("shop to be deleted", WAIT, || async {
        Ok(f.apps.get_opt("shop").await?.is_none().then_some(()))
    })
    .await?;
    ctl.stop().await?;
    kube::Api::<common::DatabaseClass>::all(f.client.clone())
        .delete(&class, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The rules a live cluster does not hold still long enough to read (a rollout under
/// way; Ready=False with nothing progressing; conditions without a status), as the
/// controller words them (`controller/core/src/status/`), through the same evaluator.
#[test]
fn every_rule_of_the_script_on_statuses_as_the_controller_writes_them() -> anyhow::Result<()> {
    let c = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "observedGeneration": 4, "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let object = |status: serde_json::Value| -> anyhow::Result<AppService> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1beta1",
            "kind": "AppService",
            "metadata": {"name": "web", "namespace": "team", "generation": 4},
            "spec": {"image": "registry.example.com/web:v1"},
            "status": status,
        }))?)
    };
    let cases = [
        (
            json!({"observedGeneration": 4, "conditions": [
                c("Ready", "False", "RollingOut", "1/3 replicas ready"),
                c("Progressing", "True", "RollingOut", "rolling out: 1/3 replicas ready"),
                c("Degraded", "False", "AsExpected", "")]}),
            ("Progressing", "rolling out: 1/3 replicas ready"),
        ),
        (
            json!({"observedGeneration": 4, "conditions": [
                c("Ready", "False", "ProgressDeadlineExceeded", "1/3 replicas ready; deadline exceeded"),
                c("Progressing", "False", "ProgressDeadlineExceeded", "stuck"),
                c("Degraded", "True", "ProgressDeadlineExceeded", "1/3 replicas ready; deadline exceeded")]}),
            ("Degraded", "1/3 replicas ready; deadline exceeded"),
        ),
        (
            json!({"observedGeneration": 4, "conditions": [
                c("Ready", "False", "Unknown", "not ready for a reason nobody reported")]}),
            ("Degraded", "not ready for a reason nobody reported"),
        ),
        (
            json!({"observedGeneration": 4, "conditions": []}),
            ("Progressing", "waiting for the controller to report status"),
        ),
        (
            json!({"observedGeneration": 3, "conditions": [
                c("Ready", "True", "Available", "3/3 replicas ready")]}),
            (
                "Progressing",
                "waiting for the controller to observe generation 4",
            ),
        ),
        (
            json!({"observedGeneration": 4, "conditions": [
                c("Ready", "True", "Available", "3/3 replicas ready"),
                c("Degraded", "False", "AsExpected", "")]}),
            ("Healthy", "3/3 replicas ready"),
        ),
    ];
    for (status, (expected, message)) in cases {
        let h = health(&object(status.clone())?)?;
        assert_eq!(
            (h.status.as_str(), h.message.as_str()),
            (expected, message),
            "{status}"
        );
    }
    Ok(())
}

/// The status contract end to end: every verdict the controller's own status functions
/// produce (`controller::status`), read by both evaluators. Ready is Healthy and Current;
/// progress possible is Progressing and InProgress; a human must act is Degraded and
/// Failed; and both tools show the same message.
#[test]
fn every_verdict_of_the_controller_reads_alike_in_argo_cd_and_kstatus() -> anyhow::Result<()> {
    use controller::external::{ConditionReport, Readiness, Report};
    use controller::status::{Observation, Observed, status_of};
    use controller::view::DeploymentView;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000)?);
    let object = |replicas: i32| {
        let mut a = app("web", "registry.example.com/web:v1", replicas);
        a.metadata.namespace = Some("team".into());
        a.metadata.generation = Some(4);
        a
    };
    let deployment = |replicas: i32, generation: i64, status: serde_json::Value| {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web", "generation": generation},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
            "status": status,
        }))?;
        anyhow::Ok(controller::view::of::<DeploymentView>(&d)?)
    };
    let counts = |observed: i64, n: i32, ready: i32| {
        json!({"observedGeneration": observed, "replicas": n, "updatedReplicas": n,
               "readyReplicas": ready, "availableReplicas": ready})
    };
    let failure = |type_: &str, status: &str, reason: &str, message: &str| {
        let mut s = counts(1, 0, 0);
        s["conditions"] =
            json!([{"type": type_, "status": status, "reason": reason, "message": message}]);
        s
    };
    let database = |reason: &'static str, waiting: bool| Report {
        outcome: if waiting {
            Readiness::NotReady(Duration::from_secs(30))
        } else {
            Readiness::Failed(controller::error::Error::Drift {
                kind: "test",
                paths: vec![],
            })
        },
        conditions: vec![ConditionReport {
            type_: common::conditions::DATABASE_READY,
            status: common::conditions::FALSE,
            reason,
            message: format!("the database: {reason}"),
        }],
        absent: vec![],
        pod: Default::default(),
        images: None,
    };

    // Image verification reports through the same step report: a hold waits for someone
    // to sign the image (Stalled), a registry outage is retried (Reconciling).
    let image = |reason: &'static str, waiting: bool| {
        let mut r = database(reason, waiting);
        r.conditions[0].type_ = common::conditions::IMAGE_VERIFIED;
        r.conditions[0].message = format!("registry.example.com/web:v1: {reason}");
        r
    };
    let applied = |replicas: i32, d: Option<DeploymentView>| {
        let observed = Observed::new(&Observation::Applied).deployments(d.as_ref(), None);
        status_of(&object(replicas), &observed, &now)
    };
    let blocked = |obs: Observation| status_of(&object(3), &Observed::new(&obs), &now);
    let blocked_by = |report: &Report| {
        status_of(
            &object(3),
            &Observed::new(&Observation::Blocked).external(report),
            &now,
        )
    };
    let cases = [
        (
            "complete",
            applied(3, Some(deployment(3, 1, counts(1, 3, 3))?)),
            "Healthy",
            "Current",
        ),
        (
            "scaled to zero",
            applied(0, Some(deployment(0, 1, counts(1, 0, 0))?)),
            "Healthy",
            "Current",
        ),
        (
            "rolling out",
            applied(3, Some(deployment(3, 1, counts(1, 3, 1))?)),
            "Progressing",
            "InProgress",
        ),
        (
            "Deployment unobserved",
            applied(3, Some(deployment(3, 2, counts(1, 3, 3))?)),
            "Progressing",
            "InProgress",
        ),
        (
            "no Deployment yet",
            applied(3, None),
            "Progressing",
            "InProgress",
        ),
        (
            "Pods forbidden",
            applied(
                3,
                Some(deployment(
                    3,
                    1,
                    failure(
                        "ReplicaFailure",
                        "True",
                        "FailedCreate",
                        "pods \"web-1\" is forbidden: exceeded quota",
                    ),
                )?),
            ),
            "Degraded",
            "Failed",
        ),
        (
            "progress deadline",
            applied(
                3,
                Some(deployment(
                    3,
                    1,
                    failure(
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        "timed out",
                    ),
                )?),
            ),
            "Degraded",
            "Failed",
        ),
        (
            "invalid spec",
            blocked(Observation::InvalidSpec("spec.port: Invalid value".into())),
            "Degraded",
            "Failed",
        ),
        (
            "name taken",
            blocked(Observation::Conflict {
                message: "Deployment team/web is not ours".into(),
                service_taken: false,
            }),
            "Degraded",
            "Failed",
        ),
        (
            "child rejected",
            blocked(Observation::Rejected(
                "the API server rejected the Deployment".into(),
            )),
            "Degraded",
            "Failed",
        ),
        (
            "class missing",
            blocked_by(&database("DatabaseClassNotFound", true)),
            "Degraded",
            "Failed",
        ),
        (
            "server unreachable, retried",
            blocked_by(&database("DatabaseServerUnreachable", false)),
            "Progressing",
            "InProgress",
        ),
        (
            "image unsigned, held",
            blocked_by(&image(common::conditions::reasons::IMAGE_UNSIGNED, true)),
            "Degraded",
            "Failed",
        ),
        (
            "registry unavailable, retried",
            blocked_by(&image(
                common::conditions::reasons::REGISTRY_UNAVAILABLE,
                false,
            )),
            "Progressing",
            "InProgress",
        ),
    ];
    for (case, status, argo, kstatus_status) in cases {
        let mut a = object(3);
        a.status = Some(status);
        let (h, k) = (health(&a)?, kstatus(&a)?);
        assert_eq!(
            (h.status.as_str(), k.status.as_str()),
            (argo, kstatus_status),
            "{case}: Argo CD {h:?}, kstatus {k:?}"
        );
        if argo != "Healthy" {
            assert_eq!(h.message, k.message, "{case}");
            assert!(!h.message.is_empty(), "{case}");
        }
    }
    Ok(())
}
