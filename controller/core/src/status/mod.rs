//! Status of an AppService as a pure function of what reconcile observed.
//!
//! The contract (docs/users/status.md), read alike by kstatus (Flux, Helm `--wait`), Argo CD's
//! health script and people: every status write stamps `observedGeneration`, and every
//! verdict sets five conditions together:
//!
//! | verdict | Ready | Reconciling | Stalled | Progressing | Degraded |
//! |---|---|---|---|---|---|
//! | ready | True | False | False | False | False |
//! | progress possible (rolling out, retrying) | False | True | False | True | False, or True while a dependency fails |
//! | a human must act | False | False | True | False | True |
//!
//! `Reconciling` and `Stalled` are never both True; each non-ready verdict's reason is on
//! all of its conditions.
//!
//! [`status_of`] turns what a pass [`Observed`] plus the previous status into the new
//! status, using the [`rollout`] assessment of the Deployment; [`needs_write`] says
//! whether it differs from the live one in anything but condition timestamps. The clock is a parameter, so tests are deterministic and
//! `lastTransitionTime` moves only when a condition's status does.

use common::conditions::{
    self, DEGRADED, FALSE, PROGRESSING, READY, RECONCILING, STALLED, TRUE, reasons,
};
use common::names::{endpoint, selector_string};
use common::{AppService, AppServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::exposure::Exposure;
use crate::external::{Readiness, Report};
use crate::pod_trouble::PodTrouble;
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
    /// An external step (the database) blocks the children: its report's first condition
    /// that is not True says why, and its readiness whether it is being retried.
    Blocked,
    /// A child's name is taken by an object this AppService does not control; nothing
    /// is written until it is free.
    Conflict {
        message: String,
        /// The Service's name is taken, so the endpoint reaches someone else's Pods.
        service_taken: bool,
    },
    /// A ConfigMap or Secret the Pods read does not exist; the message names each. The
    /// children stay as they are until it does.
    ConfigMissing(String),
    /// The API server rejected a child we built (HTTP 400/422) even after our fields were
    /// put back, or another writer keeps changing them; the message says why.
    Rejected(String),
    /// The children of this generation are applied and converged.
    Applied,
    /// An external step holds the spec back (an image that may not run), and the
    /// children were converged to what ran before: they report what runs, the external
    /// step's blocking condition is the verdict.
    Held,
    /// The external cleanup of a terminating AppService failed; the message says why.
    /// Only Degraded moves: the rest of the status stays as it was.
    CleanupFailed(String),
}

/// Everything a pass observed that its status is computed from, by [`status_of`] alone.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    pub found: &'a Observation,
    /// The external step's report, once it ran: its conditions go into the status
    /// whatever the verdict.
    pub external: Option<&'a Report>,
    /// Our live Deployment, if there is one: `readyReplicas` always reports what runs
    /// now, also while reconcile is blocked.
    pub deployment: Option<&'a DeploymentView>,
    /// Our live canary Deployment while `spec.canary` asks for one.
    pub canary: Option<&'a DeploymentView>,
    /// A Pod of a rollout in progress that waits for a human ([`crate::pod_trouble`]):
    /// the rollout is stuck on it.
    pub pods: Option<&'a PodTrouble>,
    /// What the pass found of `spec.expose`; `None` when it asks for none.
    pub exposure: Option<&'a Exposure>,
}

impl<'a> Observed<'a> {
    /// `found`, with nothing else observed yet.
    pub fn new(found: &'a Observation) -> Self {
        Observed {
            found,
            external: None,
            deployment: None,
            canary: None,
            pods: None,
            exposure: None,
        }
    }

    /// With the external step's report.
    pub fn external(self, report: &'a Report) -> Self {
        Observed {
            external: Some(report),
            ..self
        }
    }

    /// With our live Deployment (and canary Deployment).
    pub fn deployments(
        self,
        deployment: Option<&'a DeploymentView>,
        canary: Option<&'a DeploymentView>,
    ) -> Self {
        Observed {
            deployment,
            canary,
            ..self
        }
    }

    /// With what the pass found of `spec.expose`.
    pub fn exposure(self, exposure: Option<&'a Exposure>) -> Self {
        Observed { exposure, ..self }
    }

    /// With the trouble of a Pod of the rollout.
    pub fn pods(self, trouble: Option<&'a PodTrouble>) -> Self {
        Observed {
            pods: trouble,
            ..self
        }
    }
}

/// The status to write after a pass that observed `observed`, starting from the live
/// status so that unchanged conditions keep their `lastTransitionTime`. The one function
/// every status of an AppService comes from.
pub fn status_of(app: &AppService, observed: &Observed, now: &Time) -> AppServiceStatus {
    let mut status = match observed.found {
        Observation::CleanupFailed(message) => return cleanup_failed(app, message, now),
        Observation::Blocked => blocked_by_external(app, observed, now),
        Observation::Held => {
            let applied = Observed {
                found: &Observation::Applied,
                ..*observed
            };
            let status = children_status(app, &applied, now);
            external_verdict(status, app, observed, now)
        }
        _ => children_status(app, observed, now),
    };
    if let Some(report) = observed.external {
        apply_external(&mut status, report, app.metadata.generation, now);
    }
    status
}

/// The verdict on the children (or on what kept the pass from reaching them).
fn children_status(app: &AppService, observed: &Observed, now: &Time) -> AppServiceStatus {
    let (obs, deployment, canary) = (observed.found, observed.deployment, observed.canary);
    let generation = app.metadata.generation;
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
    let mut status = app.status.clone().unwrap_or_default();
    status.selector = Some(selector_string(name));
    // Whatever the verdict, it is about this generation.
    status.observed_generation = generation;

    let cond = |type_: &str, st: &str, reason: &str, message: String| {
        conditions::new_condition(type_, st, reason, message, generation, now)
    };
    let blocked = |reason: &str, message: &String, hint: &str| {
        verdict(
            &cond,
            Verdict::Stalled {
                reason,
                message: message.clone(),
                hint: hint.to_owned(),
            },
        )
    };
    let running = ready_pods(deployment);
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
        Observation::ConfigMissing(message) => {
            status.ready_replicas = Some(running);
            blocked(
                reasons::CONFIG_SOURCE_MISSING,
                message,
                "nothing is rolled out until it exists; checked again as soon as it is created",
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
        // Decided by `status_of` before this function is called.
        Observation::Blocked | Observation::Held | Observation::CleanupFailed(_) => {
            return status;
        }
        Observation::Applied => {
            let Some(deployment) = deployment else {
                status.ready_replicas = Some(0);
                return with(
                    status,
                    verdict(
                        &cond,
                        Verdict::Reconciling {
                            reason: reasons::ROLLING_OUT,
                            ready: "waiting for the Deployment".to_owned(),
                            progress: "waiting for the Deployment".to_owned(),
                            degraded: None,
                        },
                    ),
                );
            };
            status.endpoint = Some(endpoint(name, namespace, app.spec.port()));
            status.url = match observed.exposure {
                Some(Exposure::Accepted { url }) => Some(url.clone()),
                _ => None,
            };
            let desired = app.spec.replicas();
            let canary = canary.filter(|_| app.spec.canary.is_some());
            status.canary = app.spec.canary.as_ref().zip(canary).map(|(spec, live)| {
                common::types::CanaryStatus {
                    image: spec.image.clone(),
                    replicas: live.spec.replicas.unwrap_or(0),
                    ready_replicas: ready_pods(Some(live)),
                }
            });
            let (assessment, track) = rollout_of(deployment, canary);
            // A rollout in progress whose Pod waits for a human is stuck on it.
            let assessment = match (assessment, observed.pods) {
                (Rollout::InProgress { ready, desired, .. }, Some(trouble)) => Rollout::Stuck {
                    ready,
                    desired,
                    cause: Stuck::Pods(trouble.clone()),
                },
                (assessment, _) => assessment,
            };
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
                    match exposure_verdict(observed.exposure, &message) {
                        Some(v) => verdict(&cond, v),
                        None => verdict(&cond, Verdict::Ready { reason, message }),
                    }
                }
                Rollout::InProgress { ready, desired, .. } => {
                    status.ready_replicas = Some(ready);
                    // Messages change only with the ready count (which is a status change
                    // anyway): the rollout's finer phases would each cost a status write
                    // per object, and `kubectl rollout status` shows them.
                    verdict(
                        &cond,
                        Verdict::Reconciling {
                            reason: reasons::ROLLING_OUT,
                            ready: format!("{ready}/{desired} replicas ready"),
                            progress: format!(
                                "rolling out{}: {ready}/{desired} replicas ready",
                                on(track)
                            ),
                            degraded: None,
                        },
                    )
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
    with(status, new_conditions)
}

/// The verdict on a rolled-out AppService that asks to be exposed and is not reachable
/// yet; `None` when it is (or asks for nothing). `pods` is what Ready would say of them.
fn exposure_verdict(exposure: Option<&Exposure>, pods: &str) -> Option<Verdict<'static>> {
    Some(match exposure? {
        Exposure::Accepted { .. } => return None,
        Exposure::Unavailable => Verdict::Stalled {
            reason: reasons::EXPOSURE_UNAVAILABLE,
            message: format!(
                "{pods}, but spec.expose cannot be served: no Gateway is configured for this controller (the chart's controller.expose.gateway)"
            ),
            hint: "ask the cluster's admin for a Gateway, or remove spec.expose".to_owned(),
        },
        Exposure::Conflict(hosts) => Verdict::Stalled {
            reason: reasons::EXPOSURE_CONFLICT,
            message: format!(
                "{pods}, but {} {} already exposed by another AppService; no route is made",
                hosts.join(", "),
                if hosts.len() == 1 { "is" } else { "are" },
            ),
            hint: "exposed once the other AppService releases the host names; or choose others"
                .to_owned(),
        },
        Exposure::Pending { waiting } => Verdict::Reconciling {
            reason: reasons::EXPOSING,
            ready: format!("{pods}; waiting {waiting}"),
            progress: format!("waiting {waiting}"),
            degraded: None,
        },
        Exposure::Refused { message } => Verdict::Stalled {
            reason: reasons::EXPOSURE_REFUSED,
            message: format!("{pods}, but {message}"),
            hint: "check the Gateway's listeners with the cluster's admin".to_owned(),
        },
    })
}

/// The ready Pods of a Deployment as its status counts them (none without one).
fn ready_pods(deployment: Option<&DeploymentView>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// `status` with `new` set (each condition keeps its `lastTransitionTime` unless its
/// status moved).
fn with(mut status: AppServiceStatus, new: [Condition; 5]) -> AppServiceStatus {
    for c in new {
        conditions::set(&mut status.conditions, c);
    }
    status
}

/// Where an AppService stands; [`verdict`] turns it into the five conditions of the
/// contract.
enum Verdict<'a> {
    /// Serving as the spec says.
    Ready { reason: &'a str, message: String },
    /// Not there yet and progress is possible without anyone acting: a rollout, a
    /// dependency being retried. `ready` is Ready's message, `progress` Reconciling's
    /// and Progressing's; `degraded` is Degraded's message when a dependency fails
    /// meanwhile (a database server unreachable).
    Reconciling {
        reason: &'a str,
        ready: String,
        progress: String,
        degraded: Option<String>,
    },
    /// No progress until a human acts. `message` says what is wrong; `hint`, on
    /// Reconciling and Progressing, what unblocks it.
    Stalled {
        reason: &'a str,
        message: String,
        hint: String,
    },
}

/// The conditions of the contract for `v`, in one place.
fn verdict(cond: &impl Fn(&str, &str, &str, String) -> Condition, v: Verdict) -> [Condition; 5] {
    match v {
        Verdict::Ready { reason, message } => [
            cond(READY, TRUE, reason, message),
            cond(RECONCILING, FALSE, reasons::RECONCILED, String::new()),
            cond(STALLED, FALSE, reasons::AS_EXPECTED, String::new()),
            cond(
                PROGRESSING,
                FALSE,
                reasons::RECONCILED,
                "rollout complete".into(),
            ),
            cond(DEGRADED, FALSE, reasons::AS_EXPECTED, String::new()),
        ],
        Verdict::Reconciling {
            reason,
            ready,
            progress,
            degraded,
        } => [
            cond(READY, FALSE, reason, ready),
            cond(RECONCILING, TRUE, reason, progress.clone()),
            cond(STALLED, FALSE, reasons::AS_EXPECTED, String::new()),
            cond(PROGRESSING, TRUE, reason, progress),
            match degraded {
                Some(message) => cond(DEGRADED, TRUE, reason, message),
                None => cond(DEGRADED, FALSE, reasons::AS_EXPECTED, String::new()),
            },
        ],
        Verdict::Stalled {
            reason,
            message,
            hint,
        } => [
            cond(READY, FALSE, reason, message.clone()),
            cond(RECONCILING, FALSE, reason, hint.clone()),
            cond(STALLED, TRUE, reason, message.clone()),
            cond(PROGRESSING, FALSE, reason, hint),
            cond(DEGRADED, TRUE, reason, message),
        ],
    }
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
) -> [Condition; 5] {
    let (reason, cause_message, hint) = match cause {
        Stuck::ReplicaFailure { reason, message } => (
            reasons::REPLICA_FAILURE,
            if reason.is_empty() {
                message.clone()
            } else {
                format!("{reason}: {message}")
            },
            "Pods cannot be created; the ReplicaSet controller retries with backoff once the cause (Pod Security level, quota, limit range) is fixed",
        ),
        Stuck::Pods(trouble) => (
            reasons::PODS_FAILING,
            trouble.message.clone(),
            "the kubelet retries with backoff, failing the same way until the image or the spec is fixed",
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
    verdict(
        cond,
        Verdict::Stalled {
            reason,
            message,
            hint: hint.to_owned(),
        },
    )
}

/// Marks a failing external cleanup on a terminating AppService, leaving the rest of
/// the status alone.
fn cleanup_failed(app: &AppService, message: &str, now: &Time) -> AppServiceStatus {
    let mut status = app.status.clone().unwrap_or_default();
    status.observed_generation = app.metadata.generation;
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
fn apply_external(
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
    // What the Deployment runs, as verified; gone with the last governing policy.
    let images = report.images.as_ref();
    status.image = images.and_then(|i| i.image.clone());
    status.canary_image = images.and_then(|i| i.canary_image.clone());
}

/// Whether applying `report` would change the AppService's status: its conditions, or
/// what it says the images were verified as.
pub fn external_changes(app: &AppService, report: &Report) -> bool {
    let live = app.status.clone().unwrap_or_default();
    let mut applied = live.clone();
    // The time is irrelevant: only whether something other than timestamps moves.
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    apply_external(&mut applied, report, app.metadata.generation, &now);
    !conditions::same_set_ignoring_time(&live.conditions, &applied.conditions)
        || live.image != applied.image
        || live.canary_image != applied.canary_image
}

/// Status while an external step (the database) blocks the children: the verdict of
/// its blocking condition. Stalled when it waits for someone to act (a class to be
/// created, fixed or opened to this namespace: `NotReady`); Reconciling while it is being
/// retried with backoff (a server unreachable: `Failed`), Degraded meanwhile. The report's
/// own conditions are set by [`status_of`].
fn blocked_by_external(app: &AppService, observed: &Observed, now: &Time) -> AppServiceStatus {
    let mut status = app.status.clone().unwrap_or_default();
    status.observed_generation = app.metadata.generation;
    status.ready_replicas = Some(ready_pods(observed.deployment));
    external_verdict(status, app, observed, now)
}

/// `status` with the verdict of the external step's blocking condition, if one blocks.
fn external_verdict(
    status: AppServiceStatus,
    app: &AppService,
    observed: &Observed,
    now: &Time,
) -> AppServiceStatus {
    let generation = app.metadata.generation;
    let Some(report) = observed.external else {
        return status;
    };
    let Some(blocking) = report.blocking() else {
        return status;
    };
    let cond = |type_: &str, st: &str, reason: &str, message: String| {
        conditions::new_condition(type_, st, reason, message, generation, now)
    };
    let (reason, message) = (blocking.reason, blocking.message.clone());
    let v = match report.outcome {
        Readiness::Failed(_) => Verdict::Reconciling {
            reason,
            ready: message.clone(),
            progress: message.clone(),
            degraded: Some(message),
        },
        Readiness::NotReady(_) | Readiness::Done => Verdict::Stalled {
            reason,
            message,
            hint: "no progress until the cause in Ready's message is fixed; checked again when the DatabaseClass or the AppService changes, and periodically".to_owned(),
        },
    };
    with(status, verdict(&cond, v))
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
        || live.image != desired.image
        || live.canary_image != desired.canary_image
        || !conditions::same_set_ignoring_time(&live.conditions, &desired.conditions)
}

/// The top-level fields of `written` (the status the API server holds, or the pass read)
/// that `desired` leaves out. Another writer set them, and an apply removes only what
/// its own field manager set, so they would outlive it: the status writer removes them
/// by name in the same write. A
/// status edited by hand (`endpoint` pointing elsewhere) while ours has none would
/// otherwise keep the foreign value for as long as ours stays empty.
pub fn leftovers(written: Option<&AppServiceStatus>, desired: &AppServiceStatus) -> Vec<String> {
    let fields = |status: &AppServiceStatus| match serde_json::to_value(status) {
        Ok(serde_json::Value::Object(map)) => map.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    };
    let Some(written) = written else {
        return Vec::new();
    };
    let wanted = fields(desired);
    fields(written)
        .into_iter()
        .filter(|field| !wanted.contains(field))
        .collect()
}

/// The `(status, reason)` of the Ready condition, for transition Events and metrics.
pub fn ready_state(status: Option<&AppServiceStatus>) -> Option<(String, String)> {
    let status = status?;
    conditions::find(&status.conditions, READY).map(|c| (c.status.clone(), c.reason.clone()))
}

#[cfg(test)]
mod tests;
