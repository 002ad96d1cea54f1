//! The reconcile loop: one AppService at a time, as a sequence of idempotent steps.
//!
//! 1. deleting → external cleanup, then release the finalizer;
//! 2. finalizer in place before any side effect;
//! 3. `common::validate` (defence in depth) → `InvalidSpec`, no retry until it changes;
//! 4. external resources (the database, [`crate::database`]); while they are not ready
//!    the children wait and status says why;
//! 5. Deployment and Service by server-side apply, skipped when already converged, never
//!    onto an object we do not control (`ResourceConflict`);
//! 6. status, written only when it changed.
//!
//! Reads come from the watch caches; the only API calls are writes that change
//! something, so a reconcile at steady state makes no request at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::conditions::{TRUE, reasons};
use common::names::{FIELD_MANAGER, FINALIZER};
use common::validation::validate;
use common::{AppService, AppServiceStatus};
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use crate::context::Context;
use crate::desired::{desired_deployment, desired_service, is_controlled_by, required};
use crate::drift::{Drift, desired_hash, set_hash};
use crate::error::{Error, Result, Retry};
use crate::external::{Outcome, Step};
use crate::status::{
    Observation, Rollout, apply_external, cleanup_failed_status, desired_status,
    external_blocked_status, external_changes, needs_write, ready_state, rollout,
};
use crate::view::{self, Child, DeploymentView, Hashed};

/// A name taken by someone else's object is re-checked at least this often. The watch on
/// objects without our label wakes the AppService as soon as the name is free; this is
/// only a backstop should that watch be down.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(60);

/// Entry point for the kube-runtime `Controller`.
#[instrument(skip(ctx, app), fields(object = %ObjectRef::from_obj(&*app), generation = app.metadata.generation.unwrap_or_default()))]
pub async fn reconcile(app: Arc<AppService>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    let key = ObjectRef::from_obj(&*app);
    // A status we wrote that the cache has caught up with is no longer needed: drop it
    // here, not only in `write_status`, which a pass may never reach.
    ctx.drop_stale_status_write(&key, app.metadata.resource_version.as_deref());
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
            cached_deployment(ctx, app).as_deref(),
            &ctx.clock.now(),
        );
        write_status(ctx, &api, app, status).await?;
        // Retrying cannot help; the next change of the object triggers a reconcile.
        return Ok(Action::await_change());
    }

    // External resources (the database) before the children: the Deployment must not
    // point at a credentials Secret that does not exist yet.
    let report = ctx.external.ensure(app).await?;
    match report.outcome {
        Outcome::Done => {}
        Outcome::NotReady(_) | Outcome::Failed(_) => {
            let status = external_blocked_status(app, &report, &ctx.clock.now());
            write_status(ctx, &api, app, status).await?;
            return match report.outcome {
                Outcome::Failed(e) => Err(e),
                Outcome::NotReady(after) => Ok(Action::requeue(after)),
                Outcome::Done => Ok(Action::await_change()),
            };
        }
    }

    // Both names are checked before either child is written: a half-built AppService
    // (Pods without a Service, or the reverse) would look like progress.
    let want_deployment = desired_deployment(app)?;
    let want_service = desired_service(app)?;
    // Only with every cache listed completely does a name missing from all of them mean
    // that nobody holds it (a restarted controller reconciles before its lists are in).
    let others_known = ctx.synced.all();
    let (live_deployment, live_service) = tokio::join!(
        lookup(
            ctx,
            &ctx.deployments,
            others_known.then_some(&ctx.other_deployments),
            &want_deployment,
        ),
        lookup(
            ctx,
            &ctx.services,
            others_known.then_some(&ctx.other_services),
            &want_service,
        ),
    );
    let (live_deployment, live_service) = (live_deployment?, live_service?);
    let uid = required(&app.metadata.uid, "metadata.uid")?;
    let ours =
        |meta: &kube::api::ObjectMeta| is_controlled_by(meta.owner_references.as_deref(), uid);
    let mut taken = Vec::new();
    if let Some(d) = &live_deployment
        && !ours(&d.metadata)
    {
        taken.push(format!("Deployment {namespace}/{}", d.name_any()));
    }
    if let Some(s) = &live_service
        && !ours(&s.metadata)
    {
        taken.push(format!("Service {namespace}/{}", s.name_any()));
    }
    if !taken.is_empty() {
        let our_deployment = live_deployment.as_ref().filter(|d| ours(&d.metadata));
        let message = format!(
            "{} already {} and {} not controlled by this AppService; left untouched, and nothing is created until {} deleted or renamed (or the AppService is renamed)",
            taken.join(" and "),
            if taken.len() == 1 { "exists" } else { "exist" },
            if taken.len() == 1 { "is" } else { "are" },
            if taken.len() == 1 {
                "it is"
            } else {
                "they are"
            },
        );
        let obs = Observation::Conflict {
            message,
            service_taken: live_service.as_ref().is_some_and(|s| !ours(&s.metadata)),
        };
        let now = ctx.clock.now();
        let mut status = desired_status(app, &obs, our_deployment, &now);
        apply_external(&mut status, &report, app.metadata.generation, &now);
        write_status(ctx, &api, app, status).await?;
        // The watch on foreign objects wakes us when the name is free; this is a backstop.
        return Ok(Action::requeue(CONFLICT_RECHECK));
    }

    // The two children are independent: converge them at once (one round trip less
    // per new AppService).
    let (deployment, service) = tokio::join!(
        converge(ctx, want_deployment, live_deployment.clone(), "deployments"),
        converge(ctx, want_service, live_service, "services"),
    );
    let deployment = match deployment {
        Ok(d) => d,
        Err(e) => {
            return Err(rejected(ctx, &api, app, "Deployment", live_deployment.as_ref(), e).await);
        }
    };
    // Whether we changed what the Deployment runs (not only its metadata, such as the
    // desired-hash annotation added after an upgrade or a label put back).
    let spec_written = live_deployment
        .as_ref()
        .is_none_or(|live| live.spec != deployment.spec);
    if let Err(e) = service {
        return Err(rejected(ctx, &api, app, "Service", Some(&deployment), e).await);
    }

    // An edit of the Deployment's metadata (an annotation bumps its generation), by
    // someone else or by us, leaves it briefly unobserved by the Deployment controller.
    // That is no rollout: keep the status as it is rather than flap Ready, and look again
    // when the Deployment controller has caught up (its status update wakes us).
    let unobserved = deployment
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0)
        < deployment.metadata.generation.unwrap_or(0);
    let settled =
        app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation;
    // ... unless the external step's conditions moved (the database became ready again):
    // that must reach status now, or DatabaseReady would wait for the next rollout.
    if unobserved && settled && !spec_written && !external_changes(app, &report) {
        debug!("Deployment metadata changed and not yet observed; status kept");
        return Ok(Action::requeue(ctx.config.rollout_requeue));
    }

    let now = ctx.clock.now();
    let mut status = desired_status(app, &Observation::Applied, Some(&deployment), &now);
    apply_external(&mut status, &report, app.metadata.generation, &now);
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

/// When the API server keeps rejecting a child we built (HTTP 400/422, after a repair),
/// says so in status before the error goes to the error policy, which retries with
/// backoff: the cause may be another writer's fields as well as the spec.
async fn rejected(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    kind: &str,
    deployment: Option<&DeploymentView>,
    error: Error,
) -> Error {
    let message = match &error {
        Error::Kube(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => {
            format!("the API server rejected the {kind}: {}", status.message)
        }
        Error::Drift { .. } => error.to_string(),
        _ => return error,
    };
    let obs = Observation::Rejected(message);
    if let Err(e) = write_status(
        ctx,
        api,
        app,
        desired_status(app, &obs, deployment, &ctx.clock.now()),
    )
    .await
    {
        warn!(error = %e, "could not write status");
    }
    error
}

/// Our Deployment of `app` from the cache, for the ready count of a blocked status.
fn cached_deployment(ctx: &Context, app: &AppService) -> Option<Arc<DeploymentView>> {
    let name = app.metadata.name.as_deref()?;
    let namespace = app.metadata.namespace.as_deref()?;
    let uid = app.metadata.uid.as_deref()?;
    ctx.deployments
        .get(&ObjectRef::new(name).within(namespace))
        .filter(|d| is_controlled_by(d.metadata.owner_references.as_deref(), uid))
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

/// The live child named like `desired`: from our (label-filtered) cache; else, if the
/// name is not among the taken names of objects without our label (`others`, when that
/// list is complete), there is none; else (a foreign object, or ours with a label
/// removed) from the API server.
async fn lookup<K: Child>(
    ctx: &Context,
    cache: &Store<K::View>,
    others: Option<&Store<PartialObjectMeta<K>>>,
    desired: &K,
) -> Result<Option<K::View>> {
    let name = required(&desired.meta().name, "metadata.name")?;
    let namespace = required(&desired.meta().namespace, "metadata.namespace")?;
    let child = (K::KIND, namespace.to_owned(), name.to_owned());
    if let Some(obj) = cache.get(&ObjectRef::new(name).within(namespace)) {
        ctx.seen(&child);
        return Ok(Some((*obj).clone()));
    }
    // A child we created in an earlier pass may not have reached the cache yet (another
    // event of the AppService came first): ask, rather than create it again.
    let awaiting = ctx.awaiting(&child);
    if !awaiting
        && let Some(others) = others
        && others
            .get(&ObjectRef::new(name).within(namespace))
            .is_none()
    {
        return Ok(None);
    }
    let api: Api<K::View> = Api::namespaced(ctx.client.clone(), namespace);
    let live = api.get_opt(name).await?;
    if awaiting && live.is_none() {
        ctx.seen(&child);
    }
    Ok(live)
}

/// Makes a child we control match `desired`, with as few requests as possible:
///
/// * same hash and no drift: nothing;
/// * same hash, edited by someone else: one JSON patch putting our values back;
/// * no child: one create. A create, not an apply: should someone have taken the name
///   since our caches last heard, it fails (409, retried shortly, and then the name is
///   known to be taken) instead of merging into their object;
/// * new hash (the AppService changed): one server-side apply, then a repair if other
///   writers' list entries or keys survived the merge; an apply the API server rejects
///   because of them (e.g. a re-keyed port) is repaired and retried once.
///
/// Returns the child as the cache would hold it.
async fn converge<K: Child>(
    ctx: &Context,
    mut desired: K,
    live: Option<K::View>,
    resource: &'static str,
) -> Result<K::View> {
    let kind = K::KIND;
    let name = required(&desired.meta().name, "metadata.name")?.to_owned();
    let namespace = required(&desired.meta().namespace, "metadata.namespace")?.to_owned();
    let hash = desired_hash(&desired).map_err(|source| Error::Serialize { kind, source })?;
    set_hash(desired.meta_mut(), hash.clone());
    let want: K::View = view::of(&desired).map_err(|source| Error::Serialize { kind, source })?;
    // Responses decode straight into views: nothing of a child but the view is kept.
    let api: Api<K::View> = Api::namespaced(ctx.client.clone(), &namespace);

    let Some(live) = live else {
        let created = Api::<K>::namespaced(ctx.client.clone(), &namespace)
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PostParams::default()
                },
                &desired,
            )
            .await?;
        ctx.metrics.write(resource);
        ctx.created((kind, namespace.clone(), name.clone()));
        info!(kind, child = %name, "created");
        return view::of(&created).map_err(|source| Error::Serialize { kind, source });
    };
    if live.hash() == Some(hash.as_str()) {
        let ops = K::View::drift(&want, &live);
        if ops.is_empty() {
            return Ok(live);
        }
        return repair(ctx, &api, &name, &want, ops, kind, resource).await;
    }

    let applied = match apply(ctx, &api, &name, &desired, kind, resource).await {
        Ok(applied) => applied,
        Err(Error::Kube(kube::Error::Api(status))) if matches!(status.code, 400 | 422) => {
            let ops = K::View::drift(&want, &live);
            if ops.is_empty() {
                return Err(Error::Kube(kube::Error::Api(status)));
            }
            info!(kind, child = %name, reason = %status.message, "apply rejected; putting our fields back first");
            repair(ctx, &api, &name, &want, ops, kind, resource).await?;
            apply(ctx, &api, &name, &desired, kind, resource).await?
        }
        Err(e) => return Err(e),
    };
    let ops = K::View::drift(&want, &applied);
    if ops.is_empty() {
        return Ok(applied);
    }
    repair(ctx, &api, &name, &want, ops, kind, resource).await
}

async fn apply<K: Child>(
    ctx: &Context,
    api: &Api<K::View>,
    name: &str,
    desired: &K,
    kind: &'static str,
    resource: &'static str,
) -> Result<K::View> {
    // Force: we are the controller of this object; fields we set are ours.
    let applied = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await?;
    ctx.metrics.write(resource);
    info!(kind, child = %name, "applied");
    Ok(applied)
}

/// Puts our values back with one JSON patch. If they still differ right after (a
/// mutating webhook or another controller insists), it is reported as an error, so the
/// error policy backs off instead of fighting in a loop.
async fn repair<V>(
    ctx: &Context,
    api: &Api<V>,
    name: &str,
    want: &V,
    ops: Vec<serde_json::Value>,
    kind: &'static str,
    resource: &'static str,
) -> Result<V>
where
    V: Resource<DynamicType = ()> + Drift + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let paths = changed_paths(&ops);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|source| Error::Serialize { kind, source })?;
    let patched = api
        .patch(
            name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Json::<()>(patch),
        )
        .await?;
    ctx.metrics.write(resource);
    info!(kind, child = %name, fields = ?paths, "repaired fields changed by another writer");
    let left = V::drift(want, &patched);
    if left.is_empty() {
        Ok(patched)
    } else {
        Err(Error::Drift {
            kind,
            paths: changed_paths(&left),
        })
    }
}

/// The paths a JSON patch changes (its `test` operations only guard).
fn changed_paths(ops: &[serde_json::Value]) -> Vec<String> {
    ops.iter()
        .filter(|op| op["op"] != "test")
        .filter_map(|op| op["path"].as_str().map(str::to_owned))
        .collect()
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
