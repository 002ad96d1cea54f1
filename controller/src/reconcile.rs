//! The reconcile loop: one AppService at a time, as a sequence of idempotent steps.
//!
//! 1. deleting → external cleanup, then release the finalizer;
//! 2. finalizer in place before any side effect;
//! 3. `common::validate` (defence in depth) → `InvalidSpec`, no retry until it changes;
//! 4. external resources (none yet; see [`crate::external`]);
//! 5. Deployment and Service by server-side apply, skipped when already converged, never
//!    onto an object we do not control (`ResourceConflict`);
//! 6. status, written only when it changed.
//!
//! Reads come from the watch caches; the only API calls are writes that change
//! something, so a reconcile at steady state makes no request at all.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::conditions::{TRUE, reasons};
use common::names::{FIELD_MANAGER, FINALIZER};
use common::validation::validate;
use common::{AppService, AppServiceStatus};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use crate::context::Context;
use crate::desired::{desired_deployment, desired_service, is_controlled_by, required};
use crate::error::{Error, Result, Retry};
use crate::external::Step;
use crate::managed_fields::apply_is_noop;
use crate::status::{
    Observation, Rollout, cleanup_failed_status, desired_status, needs_write, ready_state, rollout,
};

/// A name taken by someone else's object is re-checked this rarely: foreign objects are
/// not in our (label-filtered) caches, so their deletion produces no event.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(300);

/// Entry point for the kube-runtime `Controller`.
#[instrument(skip(ctx, app), fields(object = %ObjectRef::from_obj(&*app), generation = app.metadata.generation.unwrap_or_default()))]
pub async fn reconcile(app: Arc<AppService>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    let key = ObjectRef::from_obj(&*app);
    let started = Instant::now();
    let mut leading = ctx.leading.clone();
    // Losing the lease stops this reconcile at its next await point.
    let result = tokio::select! {
        r = reconcile_steps(&app, &ctx) => r,
        _ = leading.wait_for(|l| !*l) => Err(Error::NotLeader),
    };
    ctx.metrics.reconciled(result.is_ok(), started.elapsed());
    if result.is_ok() {
        ctx.reset_failures(&key);
    }
    result
}

/// Retry policy for failed reconciles: see [`Error::retry`].
pub fn error_policy(app: Arc<AppService>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(&*app);
    ctx.metrics.error(error.metric_label());
    let retry = error.retry();
    let attempt = ctx.record_failure(&key);
    match ctx
        .backoff_policy
        .delay(retry, attempt, rand::random::<f64>())
    {
        Some(delay) => {
            warn!(object = %key, %error, ?retry, attempt, delay_ms = delay.as_millis() as u64, "reconcile failed; retrying");
            Action::requeue(delay)
        }
        None => {
            if retry == Retry::Permanent && !matches!(error, Error::NotLeader) {
                warn!(object = %key, %error, "reconcile failed permanently; waiting for a change");
            }
            Action::await_change()
        }
    }
}

async fn reconcile_steps(app: &AppService, ctx: &Context) -> Result<Action> {
    let name = required(&app.metadata.name, "metadata.name")?.to_owned();
    let namespace = required(&app.metadata.namespace, "metadata.namespace")?.to_owned();
    let api: Api<AppService> = Api::namespaced(ctx.client.clone(), &namespace);

    if app.metadata.deletion_timestamp.is_some() {
        return finalize(app, ctx, &api, &format!("{namespace}/{name}")).await;
    }

    // The finalizer goes on before anything we may have to clean up exists.
    let owned_app;
    let app = if app.finalizers().iter().any(|f| f == FINALIZER) {
        app
    } else {
        let mut finalizers = app.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        let patch = json!({"metadata": {
            "resourceVersion": app.metadata.resource_version,
            "finalizers": finalizers,
        }});
        owned_app = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.write("appservices");
        debug!("added finalizer");
        &owned_app
    };

    if let Err(errors) = validate(app, None) {
        let status = desired_status(
            app,
            &Observation::InvalidSpec(errors.to_string()),
            &ctx.clock.now(),
        );
        write_status(ctx, &api, app, status).await?;
        // Retrying cannot help; the next change of the object triggers a reconcile.
        return Ok(Action::await_change());
    }

    if let Step::NotReady(after) = ctx.external.ensure(app).await? {
        return Ok(Action::requeue(after));
    }

    let applied = ensure_child(
        ctx,
        app,
        &ctx.deployments,
        desired_deployment(app)?,
        "Deployment",
        "deployments",
    )
    .await;
    let deployment = match rejected(ctx, &api, app, "Deployment", applied).await? {
        Child::Ours(d) => d,
        Child::Foreign(message) => return conflict(ctx, &api, app, message).await,
    };
    let applied = ensure_child(
        ctx,
        app,
        &ctx.services,
        desired_service(app)?,
        "Service",
        "services",
    )
    .await;
    match rejected(ctx, &api, app, "Service", applied).await? {
        Child::Ours(_) => {}
        Child::Foreign(message) => return conflict(ctx, &api, app, message).await,
    }

    let status = desired_status(app, &Observation::Applied(&deployment), &ctx.clock.now());
    write_status(ctx, &api, app, status).await?;
    Ok(match rollout(&deployment) {
        Rollout::InProgress { message, .. } => {
            debug!(%message, "rollout in progress");
            Action::requeue(ctx.config.rollout_requeue)
        }
        Rollout::Complete { .. } | Rollout::Failed { .. } => {
            Action::requeue(ctx.config.resync_interval)
        }
    })
}

/// Passes `applied` through; when the API server rejected the child we built (a
/// permanent error), says so in status first, so the user sees why nothing happens.
async fn rejected<K>(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    kind: &str,
    applied: Result<Child<K>>,
) -> Result<Child<K>> {
    match applied {
        Err(Error::Kube(kube::Error::Api(status))) if matches!(status.code, 400 | 422) => {
            let message = format!("the API server rejected the {kind}: {}", status.message);
            let obs = Observation::Rejected(message);
            write_status(ctx, api, app, desired_status(app, &obs, &ctx.clock.now())).await?;
            Err(Error::Kube(kube::Error::Api(status)))
        }
        other => other,
    }
}

async fn conflict(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    message: String,
) -> Result<Action> {
    let status = desired_status(app, &Observation::Conflict(message), &ctx.clock.now());
    write_status(ctx, api, app, status).await?;
    Ok(Action::requeue(CONFLICT_RECHECK))
}

/// Deletion: clean up external resources, then let the object go.
async fn finalize(
    app: &AppService,
    ctx: &Context,
    api: &Api<AppService>,
    key: &str,
) -> Result<Action> {
    if !app.finalizers().iter().any(|f| f == FINALIZER) {
        ctx.forget(&ObjectRef::from_obj(app));
        ctx.metrics.set_ready(key, None);
        return Ok(Action::await_change());
    }
    match ctx.external.cleanup(app).await {
        Ok(Step::Done) => {}
        Ok(Step::NotReady(after)) => return Ok(Action::requeue(after)),
        Err(e) => {
            ctx.metrics.cleanup_failures.inc();
            let message = e.to_string();
            let first = !app.status.as_ref().is_some_and(|s| {
                common::conditions::find(&s.conditions, common::conditions::DEGRADED)
                    .is_some_and(|c| c.reason == reasons::CLEANUP_FAILED)
            });
            let status = cleanup_failed_status(app, &message, &ctx.clock.now());
            write_status(ctx, api, app, status).await?;
            if first {
                let event = Event {
                    type_: EventType::Warning,
                    reason: reasons::CLEANUP_FAILED.to_owned(),
                    note: Some(message),
                    action: "Cleanup".to_owned(),
                    secondary: None,
                };
                match ctx.recorder.publish(&event, &app.object_ref(&())).await {
                    Ok(()) => ctx.metrics.write("events"),
                    Err(err) => warn!(error = %err, "could not publish event"),
                }
            }
            return Err(e);
        }
    }
    let finalizers: Vec<String> = app
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let patch = json!({"metadata": {
        "resourceVersion": app.metadata.resource_version,
        "finalizers": finalizers,
    }});
    let name = app.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        // Already gone: nothing left to do.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.metrics.write("appservices");
    ctx.forget(&ObjectRef::from_obj(app));
    ctx.metrics.set_ready(key, None);
    info!("cleanup done, finalizer removed");
    Ok(Action::await_change())
}

enum Child<K> {
    /// Ours and converged: the live object.
    Ours(K),
    /// The name is taken by an object this AppService does not control.
    Foreign(String),
}

/// Makes the live child match `desired`, unless it belongs to someone else.
async fn ensure_child<K>(
    ctx: &Context,
    app: &AppService,
    cache: &Store<K>,
    desired: K,
    kind: &'static str,
    resource: &'static str,
) -> Result<Child<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = required(&desired.meta().name, "metadata.name")?.to_owned();
    let namespace = required(&desired.meta().namespace, "metadata.namespace")?.to_owned();
    let uid = required(&app.metadata.uid, "metadata.uid")?.to_owned();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);

    // The cache holds only objects with our labels; anything else needs a look.
    let live = match cache.get(&ObjectRef::new(&name).within(&namespace)) {
        Some(obj) => Some((*obj).clone()),
        None => api.get_opt(&name).await?,
    };
    if let Some(live) = &live {
        if !is_controlled_by(live.meta().owner_references.as_deref(), &uid) {
            return Ok(Child::Foreign(format!(
                "{kind} {namespace}/{name} already exists and is not controlled by this AppService; it is left untouched"
            )));
        }
        let desired_json =
            serde_json::to_value(&desired).map_err(|source| Error::Serialize { kind, source })?;
        let live_json =
            serde_json::to_value(live).map_err(|source| Error::Serialize { kind, source })?;
        let managed = live.meta().managed_fields.as_deref().unwrap_or_default();
        if apply_is_noop(&desired_json, &live_json, managed, FIELD_MANAGER) {
            return Ok(Child::Ours(live.clone()));
        }
    }
    // Force: we are the controller of this object; fields we set are ours.
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await?;
    ctx.metrics.write(resource);
    info!(kind, child = %name, "applied");
    Ok(Child::Ours(applied))
}

/// Writes `status` through the status subresource if it differs from the live status,
/// and records an Event when the Ready condition moved.
async fn write_status(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    status: AppServiceStatus,
) -> Result<()> {
    let key = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
    ctx.metrics
        .set_ready(&key, ready_state(Some(&status)).map(|(s, _)| s).as_deref());
    // Right after our own write the cache may still hold the object we wrote over:
    // compare with what we wrote then, or a stale cache would make us write it again.
    let obj_ref = ObjectRef::from_obj(app);
    let known = ctx.status_written_over(&obj_ref, app.metadata.resource_version.as_deref());
    let live = known.as_ref().or(app.status.as_ref());
    if !needs_write(live, &status) {
        return Ok(());
    }
    let before = ready_state(live);
    let after = ready_state(Some(&status));
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
    ctx.metrics.write("appservices/status");
    if let Some(rv) = app.metadata.resource_version.clone() {
        ctx.remember_status_write(obj_ref, rv, status.clone());
    }
    debug!("status written");
    if let Some((st, reason)) = after
        && worth_an_event(before.as_ref(), (&st, &reason))
    {
        publish_event(ctx, app, &st, &reason, &status).await;
    }
    Ok(())
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

/// An Event on a Ready transition. Failures to publish are logged, never fatal.
async fn publish_event(
    ctx: &Context,
    app: &AppService,
    status: &str,
    reason: &str,
    new: &AppServiceStatus,
) {
    let message = common::conditions::find(&new.conditions, common::conditions::READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let warning = matches!(
        reason,
        reasons::INVALID_SPEC
            | reasons::APPLY_FAILED
            | reasons::RESOURCE_CONFLICT
            | reasons::DEPLOYMENT_FAILED
            | reasons::CLEANUP_FAILED
    );
    let event = Event {
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
    };
    match ctx.recorder.publish(&event, &app.object_ref(&())).await {
        Ok(()) => ctx.metrics.write("events"),
        Err(e) => warn!(error = %e, "could not publish event"),
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
}
