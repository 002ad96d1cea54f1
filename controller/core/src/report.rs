//! Reporting what a pass observed, once, at its end: the status (written only when it
//! changed), the Events of what moved between the old status and the new one
//! ([`announcements`], one table), and the ready gauge.

use common::conditions::{self, DATABASE_READY, DEGRADED, READY, STALLED, TRUE, reasons};
use common::{AppService, AppServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, warn};

use crate::context::Context;
use crate::error::Result;
use crate::metrics::{Metrics, Ready, Written};
use crate::status::{self, needs_write, ready_state};
use crate::status_writer::{Guard, apply_status};

/// Writes `status` through the status subresource if it differs from the live status,
/// and publishes the Events of what moved.
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
    debug!(object = %key, from = ?live, to = ?status, "status changed");
    let events = announcements(live, status);
    // With sharding: on the condition that the AppService is still the one the pass
    // read, so a status prepared from an older read never lands over a newer object.
    let guard = if ctx.config().sharding {
        Guard::ReadVersion
    } else {
        Guard::None
    };
    // Fields another writer set beside ours, as far as this pass can see them, go in
    // the same write.
    let seen = status::leftovers(live, status);
    let written = apply_status(
        api,
        app,
        status,
        guard,
        &seen,
        ctx.metrics(),
        Written::AppServiceStatus,
    )
    .await?;
    let leftovers = status::leftovers(written.status.as_ref(), status);
    if !leftovers.is_empty() {
        // Fields another writer set that the cache did not show yet: removed by name, on
        // the condition that the object is still the one our write returned (a 409
        // retries).
        debug!(fields = ?leftovers, "removing status fields another writer set");
        apply_status(
            api,
            &written,
            status,
            Guard::ReadVersion,
            &leftovers,
            ctx.metrics(),
            Written::AppServiceStatus,
        )
        .await?;
    }
    if let Some(rv) = app.metadata.resource_version.clone() {
        ctx.remember_status_write(key, rv, status.clone());
    }
    debug!("status written");
    for event in &events {
        publish(ctx.recorder(), ctx.metrics(), app, event).await;
    }
    Ok(())
}

/// Publishes `event` about `regarding` (an AppService, a DatabaseClass) and counts the
/// write. Failures are logged, never fatal.
pub async fn publish<R: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    metrics: &Metrics,
    regarding: &R,
    event: &Event,
) {
    match recorder.publish(event, &regarding.object_ref(&())).await {
        Ok(()) => metrics.write(Written::Events),
        Err(e) => warn!(error = %e, "could not publish event"),
    }
}

/// The Events of what moved from the `before` status to `after`, in one table:
///
/// | condition | announced when | type | action |
/// |---|---|---|---|
/// | Ready | its status or reason moved, but not for the first rollout of a new object | Warning when the new status is Stalled or Degraded, else Normal | Reconcile |
/// | DatabaseReady | its status or reason moved | Normal when True, else Warning | ProvisionDatabase |
/// | Degraded | it became `CleanupFailed` (retries are not announced) | Warning | Cleanup |
pub fn announcements(before: Option<&AppServiceStatus>, after: &AppServiceStatus) -> Vec<Event> {
    fn find<'a>(s: Option<&'a AppServiceStatus>, type_: &str) -> Option<&'a Condition> {
        s.and_then(|s| conditions::find(&s.conditions, type_))
    }
    let moved = |type_: &str| {
        let new = find(Some(after), type_)?;
        let old = find(before, type_);
        (!old.is_some_and(|o| o.status == new.status && o.reason == new.reason))
            .then_some((old, new))
    };
    let event = |warning: bool, reason: &str, note: String, action: &str| Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    let mut events = Vec::new();
    if let Some((old, new)) = moved(READY) {
        let old = old.map(|o| (o.status.clone(), o.reason.clone()));
        if worth_an_event(old.as_ref(), (&new.status, &new.reason)) {
            events.push(transition_event(&new.status, &new.reason, after));
        }
    }
    if let Some((_, new)) = moved(DATABASE_READY) {
        events.push(event(
            new.status != TRUE,
            &new.reason,
            new.message.clone(),
            "ProvisionDatabase",
        ));
    }
    if let Some((_, new)) =
        moved(DEGRADED).filter(|(_, n)| n.status == TRUE && n.reason == reasons::CLEANUP_FAILED)
    {
        events.push(event(true, &new.reason, new.message.clone(), "Cleanup"));
    }
    events
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
    // The status contract decides: a human must act (Stalled), or something is wrong
    // meanwhile (Degraded).
    let warning = conditions::is_true(&new.conditions, STALLED)
        || conditions::is_true(&new.conditions, DEGRADED);
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
            let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            );
            let message = "0/2 replicas ready; FailedCreate: pods \"x\" is forbidden";
            let status = AppServiceStatus {
                conditions: vec![
                    conditions::new_condition(READY, "False", reason, message, Some(1), &at),
                    conditions::new_condition(STALLED, "True", reason, message, Some(1), &at),
                ],
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

    fn status_with(conds: &[(&str, &str, &str)]) -> AppServiceStatus {
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        AppServiceStatus {
            conditions: conds
                .iter()
                .map(|(t, s, r)| {
                    conditions::new_condition(t, s, r, format!("{t} {r}"), Some(1), &at)
                })
                .collect(),
            ..AppServiceStatus::default()
        }
    }

    fn said(events: &[Event]) -> Vec<(String, bool, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e.reason.clone(),
                    e.type_ == EventType::Warning,
                    e.action.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn each_move_is_announced_once_by_one_table() {
        let rolling = status_with(&[(READY, "False", reasons::ROLLING_OUT)]);
        let ready = status_with(&[
            (READY, "True", reasons::AVAILABLE),
            (DATABASE_READY, "True", "Provisioned"),
        ]);
        // Ready and DatabaseReady both moved.
        assert_eq!(
            said(&announcements(Some(&rolling), &ready)),
            [
                (reasons::AVAILABLE.to_owned(), false, "Reconcile".to_owned()),
                (
                    "Provisioned".to_owned(),
                    false,
                    "ProvisionDatabase".to_owned()
                ),
            ]
        );
        // Nothing moved: nothing said.
        assert!(announcements(Some(&ready), &ready).is_empty());
        // A database server lost while Ready holds: a Warning of the database only.
        let lost = status_with(&[
            (READY, "True", reasons::AVAILABLE),
            (DATABASE_READY, "False", "DatabaseServerUnreachable"),
        ]);
        assert_eq!(
            said(&announcements(Some(&ready), &lost)),
            [(
                "DatabaseServerUnreachable".to_owned(),
                true,
                "ProvisionDatabase".to_owned()
            )]
        );
        // A failing cleanup: once, not at its retries.
        let failing = status_with(&[
            (READY, "True", reasons::AVAILABLE),
            (DEGRADED, "True", reasons::CLEANUP_FAILED),
        ]);
        assert_eq!(
            said(&announcements(Some(&ready), &failing)),
            [(
                reasons::CLEANUP_FAILED.to_owned(),
                true,
                "Cleanup".to_owned()
            )]
        );
        assert!(announcements(Some(&failing), &failing).is_empty());
        // Ready lost to a stalled verdict: a Warning; to a rollout: Normal.
        let stalled = status_with(&[
            (READY, "False", reasons::RESOURCE_CONFLICT),
            (STALLED, "True", reasons::RESOURCE_CONFLICT),
            (DEGRADED, "True", reasons::RESOURCE_CONFLICT),
        ]);
        assert_eq!(
            said(&announcements(Some(&ready), &stalled)),
            [(
                reasons::RESOURCE_CONFLICT.to_owned(),
                true,
                "Reconcile".to_owned()
            )]
        );
        assert_eq!(
            said(&announcements(Some(&ready), &rolling)),
            [(
                reasons::ROLLING_OUT.to_owned(),
                false,
                "Reconcile".to_owned()
            )]
        );
        // The first rollout of a new object is expected.
        assert!(announcements(None, &rolling).is_empty());
    }
}
