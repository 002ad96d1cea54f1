//! How far a Deployment's rollout has come, as `kubectl rollout status` sees it.

use crate::view::{DeploymentStatusView, DeploymentView};

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
