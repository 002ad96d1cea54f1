//! How far a Deployment's rollout has come, as `kubectl rollout status` sees it, and why
//! it is stuck when the Deployment says so.

use crate::view::{DeploymentStatusView, DeploymentView, PROGRESSING, REPLICA_FAILURE};

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
    /// Converging no further until someone acts: `ready` of `desired` Pods are ready.
    Stuck {
        ready: i32,
        desired: i32,
        cause: Stuck,
    },
}

/// Why a rollout is stuck, as the Deployment's conditions say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// `ReplicaFailure`: the ReplicaSet controller could not create (or delete) Pods,
    /// because admission refused them: Pod Security, a ResourceQuota, a LimitRange. The
    /// reason is the ReplicaSet's (`FailedCreate`), the message the API server's answer.
    ReplicaFailure { reason: String, message: String },
    /// `Progressing=False`: the rollout made no progress within the Deployment's
    /// `progressDeadlineSeconds` (Pods that never become ready, or no room to schedule).
    DeadlineExceeded { message: String },
    /// A Pod of the rollout waits for a human, as its kubelet or the scheduler says (not
    /// a Deployment condition: reconcile reads the Pods while a rollout is in progress).
    Pods(crate::pod_trouble::PodTrouble),
}

/// Assesses a Deployment's rollout, as `kubectl rollout status` does.
///
/// A rollout that is complete is complete, whatever a condition the Deployment
/// controller has not cleared yet says. Otherwise a `ReplicaFailure` is the cause and
/// comes first: a rollout blocked by it also exceeds its deadline, later, which is only
/// the symptom.
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
    let message = if updated < desired {
        format!("{updated} of {desired} replicas updated")
    } else if total > updated {
        format!("{} old replicas pending termination", total - updated)
    } else if available < updated || ready < desired {
        format!("{ready}/{desired} replicas ready")
    } else {
        return Rollout::Complete { ready };
    };
    let cause = if let Some(failure) = status.failure(REPLICA_FAILURE) {
        Some(Stuck::ReplicaFailure {
            reason: failure.reason.clone(),
            message: failure.message.clone(),
        })
    } else {
        status
            .failure(PROGRESSING)
            .filter(|c| c.reason == "ProgressDeadlineExceeded")
            .map(|c| Stuck::DeadlineExceeded {
                message: c.message.clone(),
            })
    };
    match cause {
        Some(cause) => Rollout::Stuck {
            ready,
            desired,
            cause,
        },
        None => Rollout::InProgress {
            ready,
            desired,
            message,
        },
    }
}

/// Which Deployment holds a rollout up, for the messages of status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Stable,
    Canary,
    Both,
}

impl Track {
    /// How status names it: "the stable Deployment", "the canary Deployment", "both
    /// Deployments".
    pub fn describe(self) -> &'static str {
        match self {
            Track::Stable => "the stable Deployment",
            Track::Canary => "the canary Deployment",
            Track::Both => "the stable and canary Deployments",
        }
    }
}

/// The rollout of an AppService that runs a canary beside its stable Deployment: one
/// assessment of both, counted together (the Service sends traffic to the Pods of
/// both). Complete only when both are; stuck when either is (the stable one's cause
/// first); otherwise in progress. Without a canary, the stable Deployment's own
/// assessment, and no track: messages stay what they were.
pub fn rollout_of(
    stable: &DeploymentView,
    canary: Option<&DeploymentView>,
) -> (Rollout, Option<Track>) {
    let stable = rollout(stable);
    let Some(canary) = canary else {
        return (stable, None);
    };
    let canary = rollout(canary);
    let counts = |r: &Rollout| match r {
        Rollout::Complete { ready } => (*ready, None),
        Rollout::InProgress { ready, desired, .. } | Rollout::Stuck { ready, desired, .. } => {
            (*ready, Some(*desired))
        }
    };
    let (stable_ready, stable_desired) = counts(&stable);
    let (canary_ready, canary_desired) = counts(&canary);
    let ready = stable_ready + canary_ready;
    // A complete Deployment runs as many as it wants: its ready count.
    let desired = stable_desired.unwrap_or(stable_ready) + canary_desired.unwrap_or(canary_ready);
    let track = |stable_moving: bool, canary_moving: bool| match (stable_moving, canary_moving) {
        (true, true) => Track::Both,
        (false, true) => Track::Canary,
        _ => Track::Stable,
    };
    match (stable, canary) {
        (Rollout::Complete { .. }, Rollout::Complete { .. }) => {
            (Rollout::Complete { ready }, Some(Track::Both))
        }
        (Rollout::Stuck { cause, .. }, other) => {
            let both = matches!(other, Rollout::Stuck { .. });
            (
                Rollout::Stuck {
                    ready,
                    desired,
                    cause,
                },
                Some(track(true, both)),
            )
        }
        (_, Rollout::Stuck { cause, .. }) => (
            Rollout::Stuck {
                ready,
                desired,
                cause,
            },
            Some(Track::Canary),
        ),
        (stable, canary) => {
            let stable_moving = matches!(stable, Rollout::InProgress { .. });
            let canary_moving = matches!(canary, Rollout::InProgress { .. });
            let message = [
                (stable_moving, "stable", &stable),
                (canary_moving, "canary", &canary),
            ]
            .into_iter()
            .filter_map(|(moving, name, r)| match (moving, r) {
                (true, Rollout::InProgress { message, .. }) => Some(format!("{name}: {message}")),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("; ");
            (
                Rollout::InProgress {
                    ready,
                    desired,
                    message,
                },
                Some(track(stable_moving, canary_moving)),
            )
        }
    }
}
