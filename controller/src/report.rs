//! Reporting what a pass observed, once, at its end: the status (written only when it
//! changed), an Event when the Ready condition moved, and the ready gauge.

use common::conditions::{TRUE, reasons};
use common::names::FIELD_MANAGER;
use common::{AppService, AppServiceStatus};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, warn};

use crate::context::Context;
use crate::error::Result;
use crate::metrics::{Metrics, Ready, Written};
use crate::status::{needs_write, ready_state};

/// Writes `status` through the status subresource if it differs from the live status,
/// and publishes an Event when the Ready condition moved.
pub async fn write_status(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    status: &AppServiceStatus,
) -> Result<()> {
    let key = ObjectRef::from_obj(app);
    let after = ready_state(Some(status));
    ctx.metrics()
        .set_ready(&key, after.as_ref().map(|(s, _)| Ready::of(s)));
    // Right after our own write the cache may still hold the object we wrote over:
    // compare with what we wrote then, or a stale cache would make us write it again.
    let known = ctx.status_written_over(&key, app.metadata.resource_version.as_deref());
    let live = known.as_ref().or(app.status.as_ref());
    if !needs_write(live, status) {
        return Ok(());
    }
    let before = ready_state(live);
    let patch = json!({
        "apiVersion": AppService::api_version(&()),
        "kind": AppService::kind(&()),
        "metadata": {"name": app.name_any()},
        "status": status,
    });
    api.patch_status(
        &app.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    ctx.metrics().write(Written::AppServiceStatus);
    if let Some(rv) = app.metadata.resource_version.clone() {
        ctx.remember_status_write(key, rv, status.clone());
    }
    debug!("status written");
    if let Some((st, reason)) = after
        && worth_an_event(before.as_ref(), (&st, &reason))
    {
        let event = transition_event(&st, &reason, status);
        publish(ctx.recorder(), ctx.metrics(), app, &event).await;
    }
    Ok(())
}

/// Publishes `event` about `app` and counts the write. Failures are logged, never fatal.
pub async fn publish(recorder: &Recorder, metrics: &Metrics, app: &AppService, event: &Event) {
    match recorder.publish(event, &app.object_ref(&())).await {
        Ok(()) => metrics.write(Written::Events),
        Err(e) => warn!(error = %e, "could not publish event"),
    }
}

/// Whether a move of the Ready condition from `before` to `after` deserves an Event:
/// becoming ready, any failure, and losing readiness. The first rollout of a new object
/// is expected and not announced (an Event is an API write, too).
fn worth_an_event(before: Option<&(String, String)>, after: (&str, &str)) -> bool {
    let (status, reason) = after;
    if before.is_some_and(|(s, r)| s == status && r == reason) {
        return false;
    }
    let was_ready = before.is_some_and(|(s, _)| s == TRUE);
    reason != reasons::ROLLING_OUT || was_ready
}

/// The Event of a Ready transition to `status` for `reason`.
fn transition_event(status: &str, reason: &str, new: &AppServiceStatus) -> Event {
    let message = common::conditions::find(&new.conditions, common::conditions::READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let warning = matches!(
        reason,
        reasons::INVALID_SPEC
            | reasons::APPLY_FAILED
            | reasons::RESOURCE_CONFLICT
            | reasons::REPLICA_FAILURE
            | reasons::PROGRESS_DEADLINE_EXCEEDED
            | reasons::CLEANUP_FAILED
    );
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        note: Some(if status == TRUE {
            format!("Ready: {message}")
        } else {
            message
        }),
        action: "Reconcile".to_owned(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(s: &str, r: &str) -> (String, String) {
        (s.to_owned(), r.to_owned())
    }

    #[test]
    fn events_only_for_meaningful_transitions() {
        // First rollout of a new object: expected, no Event.
        assert!(!worth_an_event(None, ("False", reasons::ROLLING_OUT)));
        // Became ready.
        assert!(worth_an_event(
            Some(&st("False", reasons::ROLLING_OUT)),
            ("True", reasons::AVAILABLE)
        ));
        // Lost readiness (new rollout or Pods failing).
        assert!(worth_an_event(
            Some(&st("True", reasons::AVAILABLE)),
            ("False", reasons::ROLLING_OUT)
        ));
        // Failures, even on a new object.
        assert!(worth_an_event(None, ("False", reasons::INVALID_SPEC)));
        assert!(worth_an_event(
            Some(&st("False", reasons::ROLLING_OUT)),
            ("False", reasons::RESOURCE_CONFLICT)
        ));
        // No change, no Event.
        assert!(!worth_an_event(
            Some(&st("True", reasons::AVAILABLE)),
            ("True", reasons::AVAILABLE)
        ));
    }

    #[test]
    fn pods_that_cannot_be_created_are_a_warning_with_the_cause() {
        for reason in [
            reasons::REPLICA_FAILURE,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
        ] {
            assert!(worth_an_event(
                Some(&st("False", reasons::ROLLING_OUT)),
                ("False", reason)
            ));
            let status = AppServiceStatus {
                conditions: vec![common::conditions::new_condition(
                    common::conditions::READY,
                    "False",
                    reason,
                    "0/2 replicas ready; FailedCreate: pods \"x\" is forbidden",
                    Some(1),
                    &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ),
                )],
                ..AppServiceStatus::default()
            };
            let event = transition_event("False", reason, &status);
            assert_eq!(event.type_, EventType::Warning, "{reason}");
            assert_eq!(event.reason, reason);
            assert_eq!(
                event.note.as_deref(),
                Some("0/2 replicas ready; FailedCreate: pods \"x\" is forbidden")
            );
        }
    }
}
