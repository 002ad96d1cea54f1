//! Status of an AppService as a pure function of what reconcile observed.
//!
//! [`desired_status`] turns an [`Observation`] plus the previous status into the new
//! status; [`needs_write`] says whether it differs from the live one in anything but
//! condition timestamps. The clock is a parameter, so tests are deterministic and
//! `lastTransitionTime` moves only when a condition's status does.

use common::conditions::{self, DEGRADED, FALSE, PROGRESSING, READY, TRUE, reasons};
use common::names::{endpoint, selector_string};
use common::{AppService, AppServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::external::Report;
use crate::view::{DeploymentStatusView, DeploymentView};

/// Source of "now" for condition timestamps.
pub trait Clock: Send + Sync {
    fn now(&self) -> Time;
}

/// The real clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }
}

/// What one reconcile found.
#[derive(Clone, Debug)]
pub enum Observation {
    /// The spec failed `common::validate`; the message lists every field error.
    InvalidSpec(String),
    /// A child's name is taken by an object this AppService does not control; nothing
    /// is written until it is free.
    Conflict {
        message: String,
        /// The Service's name is taken, so the endpoint reaches someone else's Pods.
        service_taken: bool,
    },
    /// The API server rejected a child we built (HTTP 400/422) even after our fields were
    /// put back, or another writer keeps changing them; the message says why.
    Rejected(String),
    /// The children of this generation are applied and converged.
    Applied,
}

/// Progress of the Deployment's rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollout {
    /// All desired replicas run the current template and are ready.
    Complete { ready: i32 },
    /// Still converging; `ready` of `desired` Pods are ready.
    InProgress {
        ready: i32,
        desired: i32,
        message: String,
    },
    /// The Deployment controller gave up (progress deadline exceeded).
    Failed { ready: i32, message: String },
}

/// Assesses a Deployment's rollout, as `kubectl rollout status` does.
pub fn rollout(deployment: &DeploymentView) -> Rollout {
    let desired = deployment.spec.replicas.unwrap_or(1);
    let default = DeploymentStatusView::default();
    let status = deployment.status.as_ref().unwrap_or(&default);
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let generation = deployment.metadata.generation.unwrap_or(0);

    if status.observed_generation.unwrap_or(0) < generation {
        return Rollout::InProgress {
            ready,
            desired,
            message: format!(
                "waiting for the Deployment controller to observe generation {generation}"
            ),
        };
    }
    if let Some(message) = &status.deadline_exceeded {
        return Rollout::Failed {
            ready,
            message: format!("rollout exceeded its progress deadline: {message}"),
        };
    }
    let message = if updated < desired {
        format!("{updated} of {desired} replicas updated")
    } else if total > updated {
        format!("{} old replicas pending termination", total - updated)
    } else if available < updated || ready < desired {
        format!("{ready}/{desired} replicas ready")
    } else {
        return Rollout::Complete { ready };
    };
    Rollout::InProgress {
        ready,
        desired,
        message,
    }
}

/// The status to write after a reconcile that found `obs`, starting from the live status
/// so that unchanged conditions keep their `lastTransitionTime`. `deployment` is our live
/// Deployment, if there is one: `readyReplicas` always reports what runs now, also while
/// reconcile is blocked.
pub fn desired_status(
    app: &AppService,
    obs: &Observation,
    deployment: Option<&DeploymentView>,
    now: &Time,
) -> AppServiceStatus {
    let generation = app.metadata.generation;
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
    let mut status = app.status.clone().unwrap_or_default();
    status.selector = Some(selector_string(name));

    let cond = |type_: &str, st: &str, reason: &str, message: String| {
        conditions::new_condition(type_, st, reason, message, generation, now)
    };
    let blocked = |reason: &str, message: &String, progressing: &str| {
        [
            cond(READY, FALSE, reason, message.clone()),
            cond(PROGRESSING, FALSE, reason, progressing.to_owned()),
            cond(DEGRADED, TRUE, reason, message.clone()),
        ]
    };
    let running = deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let new_conditions = match obs {
        // Blocked until the user changes something: not ready, not progressing, degraded,
        // all three for the same reason.
        Observation::InvalidSpec(message) => {
            status.ready_replicas = Some(running);
            blocked(
                reasons::INVALID_SPEC,
                message,
                "the spec is invalid; fix it to continue",
            )
        }
        Observation::Conflict {
            message,
            service_taken,
        } => {
            status.ready_replicas = Some(running);
            if *service_taken {
                status.endpoint = None;
            }
            blocked(
                reasons::RESOURCE_CONFLICT,
                message,
                "blocked until the conflicting objects are gone",
            )
        }
        Observation::Rejected(message) => {
            status.ready_replicas = Some(running);
            blocked(
                reasons::APPLY_FAILED,
                message,
                "retrying with backoff; if it persists, check the spec and other writers of the child",
            )
        }
        Observation::Applied => {
            let Some(deployment) = deployment else {
                return status;
            };
            status.observed_generation = generation;
            status.endpoint = Some(endpoint(name, namespace, app.spec.port()));
            let desired = app.spec.replicas();
            match rollout(deployment) {
                Rollout::Complete { ready } => {
                    status.ready_replicas = Some(ready);
                    let (reason, message) = if desired == 0 {
                        (reasons::SCALED_TO_ZERO, "scaled to zero".to_owned())
                    } else {
                        (
                            reasons::AVAILABLE,
                            format!("{ready}/{desired} replicas ready"),
                        )
                    };
                    [
                        cond(READY, TRUE, reason, message),
                        cond(
                            PROGRESSING,
                            FALSE,
                            reasons::RECONCILED,
                            "rollout complete".into(),
                        ),
                        cond(DEGRADED, FALSE, reasons::AS_EXPECTED, String::new()),
                    ]
                }
                Rollout::InProgress { ready, desired, .. } => {
                    status.ready_replicas = Some(ready);
                    // Messages change only with the ready count (which is a status change
                    // anyway): the rollout's finer phases would each cost a status write
                    // per object, and `kubectl rollout status` shows them.
                    [
                        cond(
                            READY,
                            FALSE,
                            reasons::ROLLING_OUT,
                            format!("{ready}/{desired} replicas ready"),
                        ),
                        cond(
                            PROGRESSING,
                            TRUE,
                            reasons::ROLLING_OUT,
                            format!("rolling out: {ready}/{desired} replicas ready"),
                        ),
                        cond(DEGRADED, FALSE, reasons::AS_EXPECTED, String::new()),
                    ]
                }
                Rollout::Failed { ready, message } => {
                    status.ready_replicas = Some(ready);
                    [
                        cond(READY, FALSE, reasons::DEPLOYMENT_FAILED, message.clone()),
                        cond(
                            PROGRESSING,
                            FALSE,
                            reasons::DEPLOYMENT_FAILED,
                            message.clone(),
                        ),
                        cond(DEGRADED, TRUE, reasons::DEPLOYMENT_FAILED, message),
                    ]
                }
            }
        }
    };
    for c in new_conditions {
        conditions::set(&mut status.conditions, c);
    }
    status
}

/// Marks a failing external cleanup on a terminating AppService, leaving the rest of
/// the status alone.
pub fn cleanup_failed_status(app: &AppService, message: &str, now: &Time) -> AppServiceStatus {
    let mut status = app.status.clone().unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        conditions::new_condition(
            DEGRADED,
            TRUE,
            reasons::CLEANUP_FAILED,
            message,
            app.metadata.generation,
            now,
        ),
    );
    status
}

/// Sets the conditions an external step reported (stamped with the generation and
/// `now`; `lastTransitionTime` kept when the status did not move) and removes those it
/// says do not apply.
pub fn apply_external(
    status: &mut AppServiceStatus,
    report: &Report,
    generation: Option<i64>,
    now: &Time,
) {
    for c in &report.conditions {
        conditions::set(
            &mut status.conditions,
            conditions::new_condition(
                c.type_,
                c.status,
                c.reason,
                c.message.clone(),
                generation,
                now,
            ),
        );
    }
    for type_ in &report.absent {
        conditions::remove(&mut status.conditions, type_);
    }
}

/// Whether applying `report` would change the conditions of the AppService's status.
pub fn external_changes(app: &AppService, report: &Report) -> bool {
    let live = app.status.clone().unwrap_or_default();
    let mut applied = live.clone();
    // The time is irrelevant: only whether something other than timestamps moves.
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    apply_external(&mut applied, report, app.metadata.generation, &now);
    !conditions::same_set_ignoring_time(&live.conditions, &applied.conditions)
}

/// Status while an external step (the database) blocks the children: its conditions,
/// and Ready=False for its reason. Progressing stays true while it is being retried;
/// Degraded is true, since either an admin or the server must act.
pub fn external_blocked_status(app: &AppService, report: &Report, now: &Time) -> AppServiceStatus {
    let generation = app.metadata.generation;
    let mut status = app.status.clone().unwrap_or_default();
    apply_external(&mut status, report, generation, now);
    if let Some(blocking) = report.blocking() {
        for (type_, st) in [(READY, FALSE), (PROGRESSING, TRUE), (DEGRADED, TRUE)] {
            conditions::set(
                &mut status.conditions,
                conditions::new_condition(
                    type_,
                    st,
                    blocking.reason,
                    blocking.message.clone(),
                    generation,
                    now,
                ),
            );
        }
    }
    status
}

/// Whether `desired` differs from the `live` status in anything but condition timestamps.
pub fn needs_write(live: Option<&AppServiceStatus>, desired: &AppServiceStatus) -> bool {
    let Some(live) = live else {
        return true;
    };
    live.observed_generation != desired.observed_generation
        || live.ready_replicas != desired.ready_replicas
        || live.selector != desired.selector
        || live.endpoint != desired.endpoint
        || !conditions::same_set_ignoring_time(&live.conditions, &desired.conditions)
}

/// The `(status, reason)` of the Ready condition, for transition Events and metrics.
pub fn ready_state(status: Option<&AppServiceStatus>) -> Option<(String, String)> {
    let status = status?;
    conditions::find(&status.conditions, READY).map(|c| (c.status.clone(), c.reason.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::AppServiceSpec;
    use k8s_openapi::api::apps::v1::{
        Deployment, DeploymentCondition, DeploymentSpec, DeploymentStatus,
    };
    use pretty_assertions::assert_eq;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn app(replicas: i32, generation: i64) -> AppService {
        let mut app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "nginx:1.27".into(),
                replicas: Some(replicas),
                ports: vec![common::AppPort::http(8080)],
                ..Default::default()
            },
        );
        app.metadata.namespace = Some("shop".into());
        app.metadata.generation = Some(generation);
        app
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
        failed.conditions = Some(vec![DeploymentCondition {
            type_: Some("Progressing".into()),
            status: Some("False".into()),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("ReplicaSet \"x\" has timed out progressing.".into()),
            ..Default::default()
        }]);
        assert!(matches!(
            rollout(&deployment(3, 1, failed)),
            Rollout::Failed { ready: 1, .. }
        ));
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
        assert_eq!(s.conditions.len(), 3);
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
    fn invalid_spec_keeps_last_applied_generation() {
        let mut a = app(1, 1);
        a.status = Some(desired_status(
            &a,
            &Observation::Applied,
            Some(&deployment(1, 1, healthy(1))),
            &at(1),
        ));
        a.metadata.generation = Some(2);
        let s = desired_status(
            &a,
            &Observation::InvalidSpec("spec.port: Invalid value".into()),
            Some(&deployment(1, 1, healthy(1))),
            &at(5),
        );
        assert_eq!(s.observed_generation, Some(1));
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
        assert_eq!(s.observed_generation, None);
        assert_eq!(s.endpoint, None);
        assert_eq!(s.ready_replicas, Some(0));
    }

    #[test]
    fn rejected_child_is_degraded_and_keeps_generation() {
        let mut a = app(1, 1);
        a.status = Some(desired_status(
            &a,
            &Observation::Applied,
            Some(&deployment(1, 1, healthy(1))),
            &at(1),
        ));
        a.metadata.generation = Some(2);
        let s = desired_status(
            &a,
            &Observation::Rejected(
                "Deployment rejected: spec.template...fieldPath: Unsupported value".into(),
            ),
            Some(&deployment(1, 1, DeploymentStatus::default())),
            &at(2),
        );
        assert_eq!(s.observed_generation, Some(1));
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
        let mut a = app(1, 1);
        a.status = Some(desired_status(
            &a,
            &Observation::Applied,
            Some(&deployment(1, 1, healthy(1))),
            &at(1),
        ));
        let s = cleanup_failed_status(&a, "database server unreachable", &at(2));
        let deg = cond(&s, DEGRADED);
        assert_eq!(
            (deg.status.as_str(), deg.reason.as_str()),
            (TRUE, reasons::CLEANUP_FAILED)
        );
        assert_eq!(cond(&s, READY).status, TRUE);
        assert_eq!(
            ready_state(Some(&s)),
            Some((TRUE.into(), reasons::AVAILABLE.into()))
        );
    }

    fn db_report(status: &'static str, reason: &'static str) -> Report {
        Report {
            outcome: crate::external::Outcome::Done,
            conditions: vec![crate::external::ConditionReport {
                type_: conditions::DATABASE_READY,
                status,
                reason,
                message: format!("db {reason}"),
            }],
            absent: vec![],
        }
    }

    #[test]
    fn external_conditions_block_ready_and_clear_again() {
        let mut a = app(1, 1);
        let blocked =
            external_blocked_status(&a, &db_report(FALSE, "DatabaseServerUnreachable"), &at(10));
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
            outcome: crate::external::Outcome::Done,
            conditions: vec![],
            absent: vec![conditions::DATABASE_READY],
        };
        assert!(external_changes(&a, &gone));
        let mut st = a.status.clone().unwrap();
        apply_external(&mut st, &gone, Some(1), &at(20));
        assert!(conditions::find(&st.conditions, conditions::DATABASE_READY).is_none());
    }
}
