//! Status of an AppService as a pure function of what reconcile observed.
//!
//! [`desired_status`] turns an [`Observation`] plus the previous status into the new
//! status, using the [`rollout`] assessment of the Deployment; [`needs_write`] says
//! whether it differs from the live one in anything but condition timestamps. The clock is a parameter, so tests are deterministic and
//! `lastTransitionTime` moves only when a condition's status does.

use common::conditions::{self, DEGRADED, FALSE, PROGRESSING, READY, TRUE, reasons};
use common::names::{endpoint, selector_string};
use common::{AppService, AppServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::external::Report;
use crate::view::DeploymentView;

mod rollout;

pub use rollout::{Rollout, Stuck, Track, rollout, rollout_of};

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
    desired_status_with_canary(app, obs, deployment, None, now)
}

/// [`desired_status`] of an AppService that may run a canary: `canary` is our live
/// canary Deployment while `spec.canary` asks for one. Once applied, `status.canary`
/// reports it (and is removed without one), the ready count is both Deployments' (the
/// Service's Pods), and Ready needs both rollouts complete; the messages of a rollout
/// in progress or stuck name the Deployment that holds it up.
pub fn desired_status_with_canary(
    app: &AppService,
    obs: &Observation,
    deployment: Option<&DeploymentView>,
    canary: Option<&DeploymentView>,
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
            let canary = canary.filter(|_| app.spec.canary.is_some());
            status.canary = app.spec.canary.as_ref().zip(canary).map(|(spec, live)| {
                common::types::CanaryStatus {
                    image: spec.image.clone(),
                    replicas: live.spec.replicas.unwrap_or(0),
                    ready_replicas: live
                        .status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0),
                }
            });
            let (assessment, track) = rollout_of(deployment, canary);
            let on = |track: Option<Track>| {
                track.map_or(String::new(), |t| format!(" {}", t.describe()))
            };
            match assessment {
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
                            format!("rolling out{}: {ready}/{desired} replicas ready", on(track)),
                        ),
                        cond(DEGRADED, FALSE, reasons::AS_EXPECTED, String::new()),
                    ]
                }
                Rollout::Stuck {
                    ready,
                    desired,
                    cause,
                } => {
                    status.ready_replicas = Some(ready);
                    stuck(&cond, ready, desired, &cause, track)
                }
            }
        }
    };
    for c in new_conditions {
        conditions::set(&mut status.conditions, c);
    }
    status
}

/// The conditions of a rollout that is stuck until someone acts: not ready, not
/// progressing, degraded, each with the cause's reason and the message of the cause, so
/// `kubectl get` shows why Pods are missing rather than a rollout to wait for.
fn stuck(
    cond: &impl Fn(&str, &str, &str, String) -> Condition,
    ready: i32,
    desired: i32,
    cause: &Stuck,
    track: Option<Track>,
) -> [Condition; 3] {
    let (reason, cause_message, progressing) = match cause {
        Stuck::ReplicaFailure { reason, message } => (
            reasons::REPLICA_FAILURE,
            if reason.is_empty() {
                message.clone()
            } else {
                format!("{reason}: {message}")
            },
            "Pods cannot be created; the ReplicaSet controller retries with backoff once the cause (Pod Security level, quota, limit range) is fixed",
        ),
        Stuck::DeadlineExceeded { message } => (
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!("the rollout exceeded its progress deadline: {message}"),
            "the rollout made no progress within the Deployment's progressDeadlineSeconds",
        ),
    };
    let message = match track {
        None => format!("{ready}/{desired} replicas ready; {cause_message}"),
        Some(track) => format!(
            "{ready}/{desired} replicas ready; {}: {cause_message}",
            track.describe()
        ),
    };
    [
        cond(READY, FALSE, reason, message.clone()),
        cond(PROGRESSING, FALSE, reason, progressing.to_owned()),
        cond(DEGRADED, TRUE, reason, message),
    ]
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
        || live.canary != desired.canary
        || !conditions::same_set_ignoring_time(&live.conditions, &desired.conditions)
}

/// The `(status, reason)` of the Ready condition, for transition Events and metrics.
pub fn ready_state(status: Option<&AppServiceStatus>) -> Option<(String, String)> {
    let status = status?;
    conditions::find(&status.conditions, READY).map(|c| (c.status.clone(), c.reason.clone()))
}

#[cfg(test)]
mod tests;
