//! Unit tests of the status computation.

use super::*;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentSpec, DeploymentStatus,
};

/// [`status_of`] after a pass that found `obs`, with our live Deployment.
fn desired_status(
    app: &AppService,
    obs: &Observation,
    deployment: Option<&DeploymentView>,
    now: &Time,
) -> AppServiceStatus {
    desired_status_with_canary(app, obs, deployment, None, now)
}

/// [`status_of`] after a pass that found `obs`, with our live Deployment and canary.
fn desired_status_with_canary(
    app: &AppService,
    obs: &Observation,
    deployment: Option<&DeploymentView>,
    canary: Option<&DeploymentView>,
    now: &Time,
) -> AppServiceStatus {
    status_of(
        app,
        &Observed::new(obs).deployments(deployment, canary),
        now,
    )
}

/// [`status_of`] while the external step's `report` blocks the children.
fn external_blocked_status(
    app: &AppService,
    report: &Report,
    deployment: Option<&DeploymentView>,
    now: &Time,
) -> AppServiceStatus {
    let observed = Observed::new(&Observation::Blocked)
        .external(report)
        .deployments(deployment, None);
    status_of(app, &observed, now)
}

/// [`status_of`] when the external cleanup of a terminating AppService failed.
fn cleanup_failed_status(app: &AppService, message: &str, now: &Time) -> AppServiceStatus {
    status_of(
        app,
        &Observed::new(&Observation::CleanupFailed(message.to_owned())),
        now,
    )
}

const DENIAL: &str = "pods \"checkout-6d4f-x2k9q\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true (pod or container \"app\" must set securityContext.runAsNonRoot=true)";
const QUOTA: &str = "pods \"checkout-6d4f-abcde\" is forbidden: exceeded quota: one-pod, requested: pods=1, used: pods=1, limited: pods=1";

fn replica_failure(message: &str) -> DeploymentCondition {
    DeploymentCondition {
        type_: Some("ReplicaFailure".into()),
        status: Some("True".into()),
        reason: Some("FailedCreate".into()),
        message: Some(message.into()),
        ..Default::default()
    }
}

fn deadline_exceeded() -> DeploymentCondition {
    DeploymentCondition {
        type_: Some("Progressing".into()),
        status: Some("False".into()),
        reason: Some("ProgressDeadlineExceeded".into()),
        message: Some("ReplicaSet \"x\" has timed out progressing.".into()),
        ..Default::default()
    }
}

/// A Deployment of `desired` replicas of which `ready` run, created by the current
/// template, with these conditions.
fn blocked(desired: i32, ready: i32, conditions: Vec<DeploymentCondition>) -> DeploymentView {
    deployment(
        desired,
        1,
        DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(ready),
            updated_replicas: Some(ready),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            conditions: Some(conditions),
            ..Default::default()
        },
    )
}
use pretty_assertions::assert_eq;

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn app(replicas: i32, generation: i64) -> AppService {
    common::testing::app("checkout", "nginx:1.27")
        .replicas(replicas)
        .port(8080)
        .namespace("shop")
        .generation(generation)
        .build()
}

fn deployment(replicas: i32, generation: i64, st: DeploymentStatus) -> DeploymentView {
    let mut d = Deployment {
        spec: DeploymentSpec {
            replicas: Some(replicas),
            ..Default::default()
        },
        status: Some(st),
        ..Default::default()
    };
    d.metadata.generation = Some(generation);
    crate::view::of(&d).unwrap()
}

/// A one-replica AppService of generation 1 whose status says it is ready.
fn ready_app() -> AppService {
    let mut a = app(1, 1);
    a.status = Some(desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(1, 1, healthy(1))),
        &at(1),
    ));
    a
}

fn healthy(replicas: i32) -> DeploymentStatus {
    DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(replicas),
        updated_replicas: Some(replicas),
        ready_replicas: Some(replicas),
        available_replicas: Some(replicas),
        ..Default::default()
    }
}

fn cond<'a>(
    s: &'a AppServiceStatus,
    t: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::find(&s.conditions, t).unwrap()
}

#[test]
fn ready_status_fields() {
    let a = app(3, 7);
    let d = deployment(3, 1, healthy(3));
    let s = desired_status(&a, &Observation::Applied, Some(&d), &at(10));
    assert_eq!(s.observed_generation, Some(7));
    assert_eq!(s.ready_replicas, Some(3));
    assert_eq!(
        s.selector.as_deref(),
        Some(
            "app.kubernetes.io/instance=checkout,app.kubernetes.io/managed-by=appservice-operator"
        )
    );
    assert_eq!(s.endpoint.as_deref(), Some("http://checkout.shop.svc:8080"));
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (TRUE, reasons::AVAILABLE)
    );
    assert_eq!(ready.message, "3/3 replicas ready");
    assert_eq!(ready.observed_generation, Some(7));
    assert_eq!(cond(&s, PROGRESSING).status, FALSE);
    assert_eq!(cond(&s, DEGRADED).status, FALSE);
    assert_eq!(cond(&s, RECONCILING).status, FALSE);
    assert_eq!(cond(&s, STALLED).status, FALSE);
    assert_eq!(s.conditions.len(), 5);
}

#[test]
fn rolling_out_then_ready_moves_transition_time_once() {
    let mut a = app(2, 1);
    let mut progressing = healthy(2);
    progressing.ready_replicas = Some(0);
    progressing.available_replicas = Some(0);
    let s1 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, progressing.clone())),
        &at(10),
    );
    assert_eq!(cond(&s1, READY).reason, reasons::ROLLING_OUT);
    assert_eq!(cond(&s1, PROGRESSING).status, TRUE);
    assert_eq!(cond(&s1, RECONCILING).status, TRUE);
    assert_eq!(cond(&s1, RECONCILING).reason, reasons::ROLLING_OUT);
    assert_eq!(cond(&s1, STALLED).status, FALSE);
    assert_eq!(s1.ready_replicas, Some(0));

    // One replica became ready: a change (readyReplicas, message) but Ready stays False.
    a.status = Some(s1.clone());
    progressing.ready_replicas = Some(1);
    let s2 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, progressing)),
        &at(20),
    );
    assert!(needs_write(Some(&s1), &s2));
    assert_eq!(cond(&s2, READY).last_transition_time, at(10));

    // Ready.
    a.status = Some(s2.clone());
    let s3 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, healthy(2))),
        &at(30),
    );
    assert_eq!(cond(&s3, READY).last_transition_time, at(30));
    assert_eq!(cond(&s3, DEGRADED).last_transition_time, at(10));

    // Steady state: same status again, no write, times kept.
    a.status = Some(s3.clone());
    let s4 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, healthy(2))),
        &at(40),
    );
    assert!(!needs_write(Some(&s3), &s4));
    assert_eq!(s4, s3);
}

#[test]
fn an_invalid_spec_is_stalled_and_observed() {
    let mut a = ready_app();
    a.metadata.generation = Some(2);
    let s = desired_status(
        &a,
        &Observation::InvalidSpec("spec.port: Invalid value".into()),
        Some(&deployment(1, 1, healthy(1))),
        &at(5),
    );
    // Observed: this generation was looked at and found invalid (kstatus: Failed, not
    // "waiting for the controller").
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(cond(&s, STALLED).status, TRUE);
    assert_eq!(cond(&s, STALLED).reason, reasons::INVALID_SPEC);
    assert_eq!(cond(&s, STALLED).message, "spec.port: Invalid value");
    assert_eq!(cond(&s, RECONCILING).status, FALSE);
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (FALSE, reasons::INVALID_SPEC)
    );
    assert_eq!(ready.observed_generation, Some(2));
    assert_eq!(ready.message, "spec.port: Invalid value");
    // What runs is still reported.
    assert_eq!(s.ready_replicas, Some(1));
    assert_eq!(cond(&s, DEGRADED).status, TRUE);
    assert_eq!(cond(&s, PROGRESSING).status, FALSE);
}

#[test]
fn conflict_condition() {
    let a = app(1, 1);
    let s = desired_status(
        &a,
        &Observation::Conflict {
            message: "Service shop/checkout exists and is not owned by this AppService".into(),
            service_taken: true,
        },
        None,
        &at(1),
    );
    assert_eq!(cond(&s, READY).reason, reasons::RESOURCE_CONFLICT);
    assert_eq!(cond(&s, DEGRADED).reason, reasons::RESOURCE_CONFLICT);
    assert_eq!(cond(&s, STALLED).reason, reasons::RESOURCE_CONFLICT);
    assert_eq!(cond(&s, STALLED).status, TRUE);
    assert_eq!(cond(&s, RECONCILING).status, FALSE);
    assert_eq!(cond(&s, PROGRESSING).status, FALSE);
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.endpoint, None);
    assert_eq!(s.ready_replicas, Some(0));
}

#[test]
fn a_rejected_child_is_stalled_and_observed() {
    let mut a = ready_app();
    a.metadata.generation = Some(2);
    let s = desired_status(
        &a,
        &Observation::Rejected(
            "Deployment rejected: spec.template...fieldPath: Unsupported value".into(),
        ),
        Some(&deployment(1, 1, DeploymentStatus::default())),
        &at(2),
    );
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(cond(&s, STALLED).status, TRUE);
    assert_eq!(cond(&s, READY).reason, reasons::APPLY_FAILED);
    assert_eq!(cond(&s, READY).observed_generation, Some(2));
    assert_eq!(cond(&s, DEGRADED).status, TRUE);
    assert_eq!(cond(&s, PROGRESSING).status, FALSE);
    // Not the stale count of the last applied generation: nothing is ready now.
    assert_eq!(s.ready_replicas, Some(0));
}

#[test]
fn scaled_to_zero_is_ready() {
    let a = app(0, 1);
    let d = deployment(
        0,
        1,
        DeploymentStatus {
            observed_generation: Some(1),
            ..Default::default()
        },
    );
    let s = desired_status(&a, &Observation::Applied, Some(&d), &at(1));
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (TRUE, reasons::SCALED_TO_ZERO)
    );
    assert_eq!(s.ready_replicas, Some(0));
}

#[test]
fn needs_write_diffing() {
    let a = app(1, 1);
    let s = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(1, 1, healthy(1))),
        &at(1),
    );
    assert!(needs_write(None, &s));
    assert!(!needs_write(Some(&s), &s.clone()));
    // Only timestamps differ: no write.
    let mut later = s.clone();
    for c in &mut later.conditions {
        c.last_transition_time = at(99);
    }
    assert!(!needs_write(Some(&s), &later));
    // Order of conditions does not matter.
    let mut reordered = s.clone();
    reordered.conditions.reverse();
    assert!(!needs_write(Some(&s), &reordered));
    let mut other = s.clone();
    other.ready_replicas = Some(0);
    assert!(needs_write(Some(&s), &other));
    let mut other = s.clone();
    other.observed_generation = Some(2);
    assert!(needs_write(Some(&s), &other));
    let mut other = s;
    other.conditions[0].message = "changed".into();
    assert!(needs_write(Some(&other.clone()), &{
        let mut o = other.clone();
        o.conditions[0].message = "again".into();
        o
    }));
}

#[test]
fn cleanup_failure_sets_degraded_only() {
    let a = ready_app();
    let s = cleanup_failed_status(&a, "database server unreachable", &at(2));
    let deg = cond(&s, DEGRADED);
    assert_eq!(
        (deg.status.as_str(), deg.reason.as_str()),
        (TRUE, reasons::CLEANUP_FAILED)
    );
    assert_eq!(cond(&s, READY).status, TRUE);
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(
        ready_state(Some(&s)),
        Some((TRUE.into(), reasons::AVAILABLE.into()))
    );
}

fn db_report(status: &'static str, reason: &'static str) -> Report {
    Report {
        outcome: crate::external::Readiness::Done,
        conditions: vec![crate::external::ConditionReport {
            type_: conditions::DATABASE_READY,
            status,
            reason,
            message: format!("db {reason}"),
        }],
        absent: vec![],
        pod: Default::default(),
        images: None,
    }
}

/// What the database step reports when it waits for someone (`NotReady`) or retries a
/// failure with backoff (`Failed`).
fn db_blocked(reason: &'static str, waiting: bool) -> Report {
    let mut r = db_report(FALSE, reason);
    r.outcome = if waiting {
        crate::external::Readiness::NotReady(std::time::Duration::from_secs(30))
    } else {
        crate::external::Readiness::Failed(crate::error::Error::Drift {
            kind: "test",
            paths: vec![],
        })
    };
    r
}

#[test]
fn a_database_that_waits_for_a_human_is_stalled_and_one_being_retried_is_reconciling() {
    let mut a = ready_app();
    a.metadata.generation = Some(2);
    let running = deployment(1, 1, healthy(1));
    let missing = external_blocked_status(
        &a,
        &db_blocked("DatabaseClassNotFound", true),
        Some(&running),
        &at(10),
    );
    assert_eq!(missing.observed_generation, Some(2));
    assert_eq!(missing.ready_replicas, Some(1), "what runs is reported");
    for (type_, st) in [
        (READY, FALSE),
        (STALLED, TRUE),
        (RECONCILING, FALSE),
        (PROGRESSING, FALSE),
        (DEGRADED, TRUE),
    ] {
        let c = cond(&missing, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.observed_generation),
            (st, "DatabaseClassNotFound", Some(2)),
            "{type_}"
        );
    }
    let retried = external_blocked_status(
        &a,
        &db_blocked("DatabaseServerUnreachable", false),
        None,
        &at(10),
    );
    assert_eq!(retried.observed_generation, Some(2));
    assert_eq!(retried.ready_replicas, Some(0));
    for (type_, st) in [
        (READY, FALSE),
        (STALLED, FALSE),
        (RECONCILING, TRUE),
        (PROGRESSING, TRUE),
        (DEGRADED, TRUE),
    ] {
        assert_eq!(cond(&retried, type_).status, st, "{type_}");
    }
    assert_eq!(
        cond(&retried, RECONCILING).message,
        "db DatabaseServerUnreachable"
    );
}

/// Whatever the verdict, Reconciling and Stalled are never both True, Progressing is
/// Reconciling, and Ready is True only when both are False.
#[test]
fn every_verdict_keeps_the_contract() {
    let a = app(2, 3);
    let mut partial = healthy(2);
    partial.ready_replicas = Some(1);
    let deployments = [
        deployment(2, 1, healthy(2)),
        deployment(2, 1, partial),
        deployment(2, 2, healthy(2)),
        blocked(2, 0, vec![replica_failure(DENIAL)]),
        blocked(2, 1, vec![deadline_exceeded()]),
    ];
    let mut statuses: Vec<AppServiceStatus> = deployments
        .iter()
        .map(|d| desired_status(&a, &Observation::Applied, Some(d), &at(1)))
        .collect();
    statuses.push(desired_status(&a, &Observation::Applied, None, &at(1)));
    for obs in [
        Observation::InvalidSpec("x".into()),
        Observation::Conflict {
            message: "x".into(),
            service_taken: false,
        },
        Observation::Rejected("x".into()),
    ] {
        statuses.push(desired_status(&a, &obs, None, &at(1)));
    }
    statuses.push(external_blocked_status(
        &a,
        &db_blocked("DatabaseClassNotFound", true),
        None,
        &at(1),
    ));
    statuses.push(external_blocked_status(
        &a,
        &db_blocked("DatabaseServerUnreachable", false),
        None,
        &at(1),
    ));
    for s in &statuses {
        assert_eq!(s.observed_generation, Some(3), "{s:?}");
        let is = |t: &str| cond(s, t).status == TRUE;
        assert!(!(is(RECONCILING) && is(STALLED)), "{s:?}");
        assert_eq!(is(PROGRESSING), is(RECONCILING), "{s:?}");
        assert_eq!(is(READY), !is(RECONCILING) && !is(STALLED), "{s:?}");
        assert_eq!(is(STALLED), is(DEGRADED) && !is(RECONCILING), "{s:?}");
        for c in &s.conditions {
            assert_eq!(c.observed_generation, Some(3), "{c:?}");
        }
    }
}

#[test]
fn external_conditions_block_ready_and_clear_again() {
    let mut a = app(1, 1);
    let blocked = external_blocked_status(
        &a,
        &db_report(FALSE, "DatabaseServerUnreachable"),
        None,
        &at(10),
    );
    let ready = cond(&blocked, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (FALSE, "DatabaseServerUnreachable")
    );
    assert_eq!(cond(&blocked, DEGRADED).status, TRUE);
    assert_eq!(cond(&blocked, conditions::DATABASE_READY).status, FALSE);
    a.status = Some(blocked);
    // The server is back: DatabaseReady moves, so the status must be written.
    assert!(external_changes(&a, &db_report(TRUE, "Provisioned")));
    assert!(!external_changes(
        &a,
        &db_report(FALSE, "DatabaseServerUnreachable")
    ));
    // The database is disabled: the condition goes away.
    let gone = Report {
        outcome: crate::external::Readiness::Done,
        conditions: vec![],
        absent: vec![conditions::DATABASE_READY],
        pod: Default::default(),
        images: None,
    };
    assert!(external_changes(&a, &gone));
    let mut st = a.status.clone().unwrap();
    apply_external(&mut st, &gone, Some(1), &at(20));
    assert!(conditions::find(&st.conditions, conditions::DATABASE_READY).is_none());
}
#[test]
fn rollout_states() {
    assert_eq!(
        rollout(&deployment(3, 1, healthy(3))),
        Rollout::Complete { ready: 3 }
    );
    // Deployment controller has not seen the new generation yet.
    assert!(matches!(
        rollout(&deployment(3, 2, healthy(3))),
        Rollout::InProgress { .. }
    ));
    // No status at all (no kube-controller-manager).
    assert!(matches!(
        rollout(&deployment(1, 1, DeploymentStatus::default())),
        Rollout::InProgress {
            ready: 0,
            desired: 1,
            ..
        }
    ));
    let mut partial = healthy(3);
    partial.ready_replicas = Some(2);
    partial.available_replicas = Some(2);
    assert_eq!(
        rollout(&deployment(3, 1, partial)),
        Rollout::InProgress {
            ready: 2,
            desired: 3,
            message: "2/3 replicas ready".into()
        }
    );
    let mut old = healthy(3);
    old.replicas = Some(4);
    assert!(matches!(
        rollout(&deployment(3, 1, old)),
        Rollout::InProgress { .. }
    ));
    let mut failed = healthy(3);
    failed.ready_replicas = Some(1);
    failed.conditions = Some(vec![deadline_exceeded()]);
    assert_eq!(
        rollout(&deployment(3, 1, failed)),
        Rollout::Stuck {
            ready: 1,
            desired: 3,
            cause: Stuck::DeadlineExceeded {
                message: "ReplicaSet \"x\" has timed out progressing.".into()
            }
        }
    );
    let zero = DeploymentStatus {
        observed_generation: Some(1),
        ..Default::default()
    };
    assert_eq!(
        rollout(&deployment(0, 1, zero)),
        Rollout::Complete { ready: 0 }
    );
}

#[test]
fn pods_refused_by_pod_security_are_ready_false_and_degraded_with_the_cause() {
    let a = app(2, 1);
    let s = desired_status(
        &a,
        &Observation::Applied,
        Some(&blocked(2, 0, vec![replica_failure(DENIAL)])),
        &at(10),
    );
    let expected = format!("0/2 replicas ready; FailedCreate: {DENIAL}");
    for (type_, status) in [(READY, FALSE), (DEGRADED, TRUE)] {
        let c = cond(&s, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (status, reasons::REPLICA_FAILURE, expected.as_str()),
            "{type_}"
        );
        assert_eq!(c.observed_generation, Some(1));
    }
    let progressing = cond(&s, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        (FALSE, reasons::REPLICA_FAILURE)
    );
    assert_eq!(s.ready_replicas, Some(0));
    assert_eq!(s.observed_generation, Some(1));
}

#[test]
fn a_quota_that_admits_one_pod_of_three_is_reported_with_the_quota() {
    let a = app(3, 1);
    let s = desired_status(
        &a,
        &Observation::Applied,
        Some(&blocked(3, 1, vec![replica_failure(QUOTA)])),
        &at(10),
    );
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (FALSE, reasons::REPLICA_FAILURE)
    );
    assert_eq!(
        ready.message,
        format!("1/3 replicas ready; FailedCreate: {QUOTA}")
    );
    assert_eq!(s.ready_replicas, Some(1));
    assert_eq!(cond(&s, DEGRADED).status, TRUE);
}

#[test]
fn a_replica_failure_clears_when_the_pods_come() {
    // Rolling out, then refused, then the namespace's level or the quota is fixed.
    let mut a = app(2, 1);
    let mut starting = healthy(2);
    starting.ready_replicas = Some(0);
    starting.available_replicas = Some(0);
    let s1 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, starting)),
        &at(10),
    );
    assert_eq!(cond(&s1, READY).reason, reasons::ROLLING_OUT);
    assert_eq!(cond(&s1, DEGRADED).status, FALSE);

    a.status = Some(s1.clone());
    let refused = blocked(2, 0, vec![replica_failure(DENIAL)]);
    let s2 = desired_status(&a, &Observation::Applied, Some(&refused), &at(20));
    assert!(needs_write(Some(&s1), &s2));
    assert_eq!(cond(&s2, READY).reason, reasons::REPLICA_FAILURE);
    // Ready stayed False: its time is kept; Degraded moved.
    assert_eq!(cond(&s2, READY).last_transition_time, at(10));
    assert_eq!(cond(&s2, DEGRADED).last_transition_time, at(20));

    // Seen again (a resync, another event): nothing to write.
    a.status = Some(s2.clone());
    let again = desired_status(&a, &Observation::Applied, Some(&refused), &at(30));
    assert!(!needs_write(Some(&s2), &again));

    // The cause is gone: one Pod is created (the condition is cleared), then both.
    a.status = Some(again.clone());
    let one = blocked(2, 1, vec![]);
    let s3 = desired_status(&a, &Observation::Applied, Some(&one), &at(40));
    assert_eq!(cond(&s3, READY).reason, reasons::ROLLING_OUT);
    assert_eq!(cond(&s3, DEGRADED).status, FALSE);
    assert_eq!(cond(&s3, DEGRADED).last_transition_time, at(40));
    a.status = Some(s3);
    let s4 = desired_status(
        &a,
        &Observation::Applied,
        Some(&deployment(2, 1, healthy(2))),
        &at(50),
    );
    let ready = cond(&s4, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (TRUE, reasons::AVAILABLE)
    );
    assert_eq!(ready.last_transition_time, at(50));
    assert_eq!(cond(&s4, PROGRESSING).status, FALSE);
    assert_eq!(s4.ready_replicas, Some(2));
}

#[test]
fn a_missed_progress_deadline_is_its_own_reason() {
    let a = app(3, 1);
    let s = desired_status(
        &a,
        &Observation::Applied,
        Some(&blocked(3, 1, vec![deadline_exceeded()])),
        &at(1),
    );
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (FALSE, reasons::PROGRESS_DEADLINE_EXCEEDED)
    );
    assert_eq!(
        ready.message,
        "1/3 replicas ready; the rollout exceeded its progress deadline: ReplicaSet \"x\" has timed out progressing."
    );
    assert_eq!(cond(&s, DEGRADED).status, TRUE);
    assert_eq!(cond(&s, PROGRESSING).status, FALSE);
}

#[test]
fn the_cause_beats_the_symptom_and_a_complete_rollout_beats_both() {
    // Pods refused for long enough that the deadline passed too: the refusal is reported.
    let both = blocked(2, 0, vec![deadline_exceeded(), replica_failure(QUOTA)]);
    assert!(matches!(
        rollout(&both),
        Rollout::Stuck {
            cause: Stuck::ReplicaFailure { .. },
            ..
        }
    ));
    // Every replica ready: a condition the Deployment controller has yet to clear does
    // not make the AppService unready.
    let mut done = healthy(2);
    done.conditions = Some(vec![replica_failure(QUOTA)]);
    assert_eq!(
        rollout(&deployment(2, 1, done)),
        Rollout::Complete { ready: 2 }
    );
    // A new template not yet observed: waiting for it comes first.
    let mut unobserved = healthy(2);
    unobserved.ready_replicas = Some(0);
    unobserved.conditions = Some(vec![replica_failure(DENIAL)]);
    assert!(matches!(
        rollout(&deployment(2, 2, unobserved)),
        Rollout::InProgress { .. }
    ));
}

fn with_canary(replicas: i32, canary: i32) -> AppService {
    let mut a = app(replicas, 3);
    a.spec.canary = Some(common::CanarySpec {
        image: "nginx:1.28".into(),
        replicas: Some(canary),
    });
    a
}

#[test]
fn a_canary_is_ready_only_with_both_deployments_complete() {
    let a = with_canary(4, 1);
    let stable = deployment(3, 1, healthy(3));
    let canary = deployment(1, 1, healthy(1));
    let s = desired_status_with_canary(
        &a,
        &Observation::Applied,
        Some(&stable),
        Some(&canary),
        &at(5),
    );
    assert_eq!(cond(&s, READY).status, TRUE);
    assert_eq!(cond(&s, READY).message, "4/4 replicas ready");
    // Both Deployments' Pods are the Service's: counted together.
    assert_eq!(s.ready_replicas, Some(4));
    assert_eq!(
        s.canary,
        Some(common::CanaryStatus {
            image: "nginx:1.28".into(),
            replicas: 1,
            ready_replicas: 1,
        })
    );
    assert!(needs_write(a.status.as_ref(), &s));

    // The canary rolling: not ready, and the message names it.
    let rolling = deployment(
        1,
        1,
        DeploymentStatus {
            ready_replicas: Some(0),
            available_replicas: Some(0),
            ..healthy(1)
        },
    );
    let s = desired_status_with_canary(
        &a,
        &Observation::Applied,
        Some(&stable),
        Some(&rolling),
        &at(6),
    );
    assert_eq!(cond(&s, READY).status, FALSE);
    assert_eq!(cond(&s, READY).message, "3/4 replicas ready");
    assert_eq!(
        cond(&s, PROGRESSING).message,
        "rolling out the canary Deployment: 3/4 replicas ready"
    );
    assert_eq!(s.canary.as_ref().map(|c| c.ready_replicas), Some(0));

    // The stable one unobserved and the canary rolling: both named.
    let unobserved = deployment(3, 2, healthy(3));
    let (r, track) = rollout_of(&unobserved, Some(&rolling));
    assert_eq!(track, Some(Track::Both));
    assert!(
        matches!(
            r,
            Rollout::InProgress {
                ready: 3,
                desired: 4,
                ..
            }
        ),
        "{r:?}"
    );
    let s = desired_status_with_canary(
        &a,
        &Observation::Applied,
        Some(&unobserved),
        Some(&canary),
        &at(6),
    );
    assert_eq!(
        cond(&s, PROGRESSING).message,
        "rolling out the stable Deployment: 4/4 replicas ready"
    );

    // The canary stuck: degraded, saying which one.
    let stuck = blocked(1, 0, vec![replica_failure(QUOTA)]);
    let s = desired_status_with_canary(
        &a,
        &Observation::Applied,
        Some(&stable),
        Some(&stuck),
        &at(7),
    );
    assert_eq!(cond(&s, DEGRADED).status, TRUE);
    assert_eq!(cond(&s, READY).reason, reasons::REPLICA_FAILURE);
    assert_eq!(
        cond(&s, READY).message,
        format!("3/4 replicas ready; the canary Deployment: FailedCreate: {QUOTA}")
    );
}

#[test]
fn without_a_canary_nothing_changes_and_status_canary_goes() {
    let mut a = app(3, 2);
    let d = deployment(3, 1, healthy(3));
    let plain = desired_status(&a, &Observation::Applied, Some(&d), &at(5));
    // A canary Deployment still live (being deleted) is not reported once the spec
    // no longer asks for one.
    let leftover = deployment(1, 1, healthy(1));
    a.status = Some(AppServiceStatus {
        canary: Some(common::CanaryStatus {
            image: "nginx:1.28".into(),
            replicas: 1,
            ready_replicas: 1,
        }),
        ..plain.clone()
    });
    let s =
        desired_status_with_canary(&a, &Observation::Applied, Some(&d), Some(&leftover), &at(6));
    assert_eq!(s.canary, None);
    assert_eq!(s.ready_replicas, Some(3));
    assert!(needs_write(a.status.as_ref(), &s));
    assert!(!needs_write(Some(&plain), &s));
    // The messages of a rollout without a canary are what they were.
    let rolling = deployment(3, 2, healthy(3));
    let s = desired_status(&app(3, 2), &Observation::Applied, Some(&rolling), &at(6));
    assert_eq!(
        cond(&s, PROGRESSING).message,
        "rolling out: 3/3 replicas ready"
    );
    assert_eq!(rollout_of(&rolling, None).1, None);
}

#[test]
fn fields_another_writer_set_that_ours_leaves_out_are_leftovers() {
    let ours = AppServiceStatus {
        observed_generation: Some(2),
        ready_replicas: Some(0),
        ..AppServiceStatus::default()
    };
    let mut held = ours.clone();
    held.endpoint = Some("http://elsewhere:1".into());
    held.selector = Some("app=x".into());
    assert_eq!(
        super::leftovers(Some(&held), &ours),
        ["endpoint", "selector"]
    );
    // What ours sets is not a leftover, whatever its value on the server.
    held.ready_replicas = Some(99);
    let mut with_endpoint = ours.clone();
    with_endpoint.endpoint = Some("http://web.shop.svc:8080".into());
    assert_eq!(super::leftovers(Some(&held), &with_endpoint), ["selector"]);
    assert!(super::leftovers(Some(&ours), &ours).is_empty());
    assert!(super::leftovers(None, &ours).is_empty());
}

#[test]
fn a_held_appservice_reports_what_runs_with_the_holds_verdict() {
    let a = app(3, 2);
    let report = Report {
        outcome: crate::external::Readiness::NotReady(std::time::Duration::from_secs(60)),
        conditions: vec![crate::external::ConditionReport {
            type_: conditions::IMAGE_VERIFIED,
            status: FALSE,
            reason: reasons::IMAGE_UNSIGNED,
            message: "r/app:v2 fails ImagePolicy p: unsigned; r/app:v1 (sha256:aa…) keeps running"
                .into(),
        }],
        absent: vec![],
        pod: Default::default(),
        images: None,
    };
    let d = deployment(3, 1, healthy(3));
    let observed = Observed::new(&Observation::Held)
        .external(&report)
        .deployments(Some(&d), None);
    let s = status_of(&a, &observed, &at(5));
    // What runs: the children's counts and endpoint, for this generation.
    assert_eq!(s.ready_replicas, Some(3));
    assert!(s.endpoint.is_some());
    assert_eq!(s.observed_generation, Some(2));
    // The verdict is the hold's: a human must act.
    for (type_, want) in [(READY, FALSE), (STALLED, TRUE), (RECONCILING, FALSE)] {
        let c = cond(&s, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (want, reasons::IMAGE_UNSIGNED),
            "{type_}"
        );
    }
    assert!(cond(&s, READY).message.contains("keeps running"));
    // A registry that is down is being retried instead: Reconciling, not Stalled.
    let retried = Report {
        outcome: crate::external::Readiness::Failed(crate::error::Error::External {
            reason: crate::error::ErrorReason::Registry,
            message: "image verification: down".into(),
        }),
        ..report
    };
    let observed = Observed::new(&Observation::Held)
        .external(&retried)
        .deployments(Some(&d), None);
    let s = status_of(&a, &observed, &at(6));
    assert_eq!(cond(&s, RECONCILING).status, TRUE);
    assert_eq!(cond(&s, STALLED).status, FALSE);
    assert_eq!(s.ready_replicas, Some(3));
}

#[test]
fn a_pod_the_kubelet_will_not_start_stalls_an_unfinished_rollout_and_not_a_complete_one() {
    let a = app(3, 1);
    let trouble = crate::pod_trouble::PodTrouble {
        reason: "CreateContainerConfigError".into(),
        message: "Pod web-1: container app: CreateContainerConfigError: container has runAsNonRoot and image will run as root".into(),
    };
    let rolling = blocked(3, 1, vec![]);
    let observed = Observed::new(&Observation::Applied)
        .deployments(Some(&rolling), None)
        .pods(Some(&trouble));
    let s = status_of(&a, &observed, &at(1));
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        (FALSE, reasons::PODS_FAILING)
    );
    assert_eq!(
        ready.message,
        format!("1/3 replicas ready; {}", trouble.message)
    );
    assert_eq!(cond(&s, STALLED).status, TRUE);
    assert_eq!(cond(&s, RECONCILING).status, FALSE);

    // A complete rollout is complete, whatever a Pod said.
    let done = deployment(3, 1, healthy(3));
    let observed = Observed::new(&Observation::Applied)
        .deployments(Some(&done), None)
        .pods(Some(&trouble));
    let s = status_of(&a, &observed, &at(2));
    assert_eq!(cond(&s, READY).status, TRUE);
}
