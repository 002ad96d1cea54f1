//! One reconcile pass over an AppService: a sequence of idempotent steps that observe and
//! act, then one report of what they observed.
//!
//! 1. deleting → external cleanup, then release the finalizer (`finalizer.rs`);
//! 2. the finalizer in place before any side effect (and put back when another writer
//!    removed it);
//! 3. `common::validate` (defence in depth) → `InvalidSpec`, no retry until it changes;
//! 4. external resources (the database: the crate `controller_database`); while they are not ready
//!    the children wait and status says why;
//! 5. Deployment and Service ([`crate::children`]), skipped when already converged,
//!    never onto an object we do not control (`ResourceConflict`).
//!
//! Each step ends the pass with an `Outcome`: the status it observed (if any), an Event
//! it owes, and what happens next. `finish` reports it in one place: the status is
//! written at the end of the pass, only when it changed ([`crate::report`]).
//!
//! Reads come from the watch caches; the only API calls are writes that change
//! something, so a reconcile at steady state makes no request at all.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::queue::Next;
use common::AppService;
use common::names::FINALIZER;
use common::validation::validate;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, instrument, warn};

use crate::children::{converge, delete, lookup};
use crate::config_revision::{self, Revision};
use crate::context::Context;
use crate::desired::{
    CANARY_SLOT, desired_autoscaler, desired_budget, desired_canary_deployment,
    desired_certificate, desired_deployment, desired_grant, desired_ingress, desired_route,
    desired_service, is_controlled_by,
};
use crate::error::{Error, ErrorReason, Result, Retry};
use crate::exposure::{self, Exposure};
use crate::external::{Readiness as External, Report};
use crate::finalizer::{ensure_finalizer, finalize};
use crate::listeners;
use crate::optional_child::{Optional, refused_create};
use crate::outcome::Outcome;
use crate::pod_trouble::pod_trouble;
use crate::report::write_status;
use crate::status::{Observation, Observed, Rollout, external_changes, rollout_of, status_of};
use crate::subject::Subject;
use crate::view::{Child, DeploymentView};
use common::names::{
    ANNOTATION_CONFIG_REVISION, LABEL_MANAGED_BY, MANAGED_BY, autoscaler_name, budget_name,
    canary_deployment_name, deployment_name, route_name, service_name,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;

/// A name taken by someone else's object is re-checked at least this often. The watch on
/// objects without our label wakes the AppService as soon as the name is free; this is
/// only a backstop should that watch be down.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(60);

/// Entry point for the kube-runtime `Controller`.
#[instrument(skip(ctx, app), fields(object = %ObjectRef::from_obj(&*app), generation = app.metadata.generation.unwrap_or_default()))]
pub async fn reconcile(app: Arc<AppService>, ctx: Arc<Context>) -> Result<Next> {
    if !ctx.is_leader() {
        return Ok(Next::await_change());
    }
    let key = ObjectRef::from_obj(&*app);
    // An excluded namespace (kube-system, the release namespace, ...) gets nothing written,
    // not even a status: the chart's admission policy refuses our writes there anyway.
    if let Some(namespace) = key.namespace.as_deref()
        && ctx.config().is_excluded(namespace)
    {
        ctx.metrics().excluded();
        warn!(object = %key, "AppService in an excluded namespace (--exclude-namespaces): not reconciled, nothing is written there");
        return Ok(Next::await_change());
    }
    // With sharding: only what this member serves.
    // Labels on the object mean nothing, and the share lets a namespace go only between
    // writes, so there is nothing to acknowledge.
    if let Some(share) = ctx.share()
        && !share.serves(app.namespace().as_deref().unwrap_or_default())
    {
        return Ok(Next::await_change());
    }
    // A status we wrote that the cache has caught up with is no longer needed: drop it
    // here, not only when writing status, which a pass may never reach.
    ctx.drop_stale_status_write(&key, app.metadata.resource_version.as_deref());
    let started = Instant::now();
    let mut leading = ctx.leadership();
    // Losing the lease stops this reconcile at its next await point.
    let result = tokio::select! {
        r = pass(&app, &ctx) => r,
        _ = leading.wait_for(|l| !*l) => Err(Error::NotLeader),
    };
    ctx.metrics().reconciled(result.is_ok(), started.elapsed());
    if result.is_ok() {
        ctx.reset_failures(&key);
    }
    result
}

/// Retry policy for failed reconciles: see [`Error::retry`].
pub fn error_policy(app: Arc<AppService>, error: &Error, ctx: Arc<Context>) -> Next {
    let key = ObjectRef::from_obj(&*app);
    ctx.metrics().error(error.metric_label());
    let retry = error.retry();
    let attempt = ctx.record_failure(&key);
    let delay = ctx
        .backoff_policy()
        .delay(retry, attempt, rand::random::<f64>())
        // A registry that is back is seen within a hold's recheck, not a 5-minute backoff.
        .map(|d| match error {
            Error::External {
                reason: ErrorReason::Registry,
                ..
            } => d.min(crate::image_gate::HOLD_RECHECK),
            _ => d,
        });
    match delay {
        Some(delay) => {
            warn!(object = %key, %error, ?retry, attempt, delay_ms = delay.as_millis() as u64, "reconcile failed; retrying");
            Next::requeue(delay)
        }
        None => {
            if retry == Retry::Permanent && !matches!(error, Error::NotLeader) {
                warn!(object = %key, %error, "reconcile failed permanently; waiting for a change");
            }
            Next::await_change()
        }
    }
}

/// The steps, then the one report of what they observed. The AppService's identity is
/// checked here, once: every step after takes the [`Subject`].
async fn pass(app: &AppService, ctx: &Context) -> Result<Next> {
    let subject = Subject::of(app)?;
    let api: Api<AppService> = Api::namespaced(ctx.client().clone(), subject.namespace());
    let (app, outcome) = if let Some(deleted) = &app.metadata.deletion_timestamp {
        if app.finalizers().iter().any(|f| f == FINALIZER) {
            ctx.metrics()
                .set_held(&subject.key(), Some(deleted.0.as_second()));
        }
        (Cow::Borrowed(app), finalize(&subject, ctx, &api).await?)
    } else {
        let app = ensure_finalizer(app, ctx, &api).await?;
        // The object the finalizer patch returned is the same AppService (same identity).
        let outcome = converge_app(&Subject::of(&app)?, ctx).await?;
        (app, outcome)
    };
    finish(ctx, &api, &app, outcome).await
}

/// Reports `outcome`: the status (when it changed), then the Event it owes. When the pass
/// failed, its error is what the error policy sees; a status write that failed as well
/// is logged.
async fn finish(
    ctx: &Context,
    api: &Api<AppService>,
    app: &AppService,
    outcome: Outcome,
) -> Result<Next> {
    if outcome.gone {
        let key = ObjectRef::from_obj(app);
        ctx.forget(&key);
        ctx.metrics().set_ready(&key, None);
        ctx.metrics().set_held(&key, None);
    }
    if let Some(status) = &outcome.status
        && let Err(e) = write_status(ctx, api, app, status).await
    {
        return match outcome.next {
            Ok(_) => Err(e),
            Err(cause) => {
                warn!(error = %e, "could not write status");
                Err(cause)
            }
        };
    }
    outcome.next
}

/// Validation, the external step, then the children.
async fn converge_app(app: &Subject<'_>, ctx: &Context) -> Result<Outcome> {
    if let Err(errors) = validate(app, None) {
        let found = Observation::InvalidSpec(errors.to_string());
        let deployment = cached_deployment(ctx, app);
        let observed = Observed::new(&found).deployments(deployment.as_deref(), None);
        let status = status_of(app, &observed, &ctx.clock().now());
        // Retrying cannot help; the next change of the object triggers a reconcile.
        return Ok(Outcome::status(status, Ok(Next::await_change())));
    }

    // External resources (the database) before the children: the Deployment must not
    // point at a credentials Secret that does not exist yet.
    let mut report = ctx.external().ensure(app).await?;
    let database_done = matches!(report.outcome, External::Done);
    // Image verification next: an image that may not run holds the spec back, and the
    // children converge to what ran before (or none are made, when nothing ran).
    if let Some(images) = ctx.images() {
        let live = live_images(ctx, app);
        images
            .check(app, &live, &mut report, &ctx.clock().now())
            .await;
    }
    if matches!(report.outcome, External::Done) {
        return Box::pin(converge_children(app, ctx, &report, None)).await;
    }
    let held = report
        .images
        .as_ref()
        .and_then(|i| i.hold.as_ref())
        .and_then(|hold| hold.apply(app));
    if database_done && let Some(held) = held {
        let mut outcome = Box::pin(converge_children(app, ctx, &report, Some(&held))).await?;
        // The hold decides when to look again (or the backoff of a registry that is
        // down), unless converging the children failed.
        if outcome.next.is_ok() {
            outcome.next = match report.outcome {
                External::Failed(e) => Err(e),
                External::NotReady(after) => Ok(Next::requeue(after)),
                External::Done => outcome.next,
            };
        }
        return Ok(outcome);
    }
    let deployment = cached_deployment(ctx, app);
    let observed = Observed::new(&Observation::Blocked)
        .external(&report)
        .deployments(deployment.as_deref(), None);
    let status = status_of(app, &observed, &ctx.clock().now());
    let next = match report.outcome {
        External::Failed(e) => Err(e),
        External::NotReady(after) => Ok(Next::requeue(after)),
        External::Done => Ok(Next::await_change()),
    };
    Ok(Outcome::status(status, next))
}

/// The Deployment and the Service (and the canary Deployment while `spec.canary` asks
/// for one), once nothing blocks them; or, while an image is held (`held`: the
/// AppService rendered with what ran before), converged to that, with the hold's verdict.
async fn converge_children(
    app: &Subject<'_>,
    ctx: &Context,
    report: &Report,
    held: Option<&AppService>,
) -> Result<Outcome> {
    let owner = app.key();
    let namespace = app.namespace();
    // The children run the verified digests (`image@digest`), never the spec rewritten.
    let pinned;
    let render = match (held, report.images.as_ref().map(|i| &i.pins)) {
        (Some(held), _) => Subject::of(held)?,
        (None, Some(pins)) if !pins.is_empty() => {
            pinned = pins.apply(app);
            Subject::of(&pinned)?
        }
        _ => *app,
    };
    // The configuration the Pods read, as one revision in their template: a change of
    // its data rolls them. One that does not exist holds the children as they are.
    let pod = match config_revision::revision(ctx.client(), ctx.digests(), namespace, &render.spec)
        .await?
    {
        Revision::Missing(missing) => return Ok(config_missing(ctx, app, report, &missing)),
        Revision::None => Cow::Borrowed(&report.pod),
        Revision::Of(revision) => {
            let mut pod = report.pod.clone();
            pod.annotations
                .insert(ANNOTATION_CONFIG_REVISION.to_owned(), revision);
            Cow::Owned(pod)
        }
    };
    // Every name is checked before any child is written: a half-built AppService
    // (Pods without a Service, or the reverse) would look like progress.
    let want_deployment = desired_deployment(&render, &pod);
    let want_service = desired_service(app);
    let want_canary = desired_canary_deployment(&render, &pod);
    let canary_name = canary_deployment_name(app.name());
    let deployment_name = deployment_name(app.name());
    let service_name = service_name(app.name());
    // Only with every cache listed completely does a name missing from all of them mean
    // that nobody holds it (a restarted controller reconciles before its lists are in).
    let caches = ctx.caches();
    let others_known = ctx.is_ready();
    // The canary's, the budget's and the autoscaler's names are looked up whether or not
    // one is asked for: one of ours left from before is deleted. A cached miss costs
    // nothing.
    // Exposure: a route only with a Gateway configured, and only for host names no older
    // AppService holds. Without a Gateway no route is looked up (none can exist).
    // Without a Gateway, an Ingress of the configured class instead (when one is).
    let gateway = ctx.config().expose_gateway.as_ref();
    let ingress_class = ctx
        .config()
        .expose_ingress_class
        .as_deref()
        .filter(|_| gateway.is_none());
    let exposing = gateway.is_some() || ingress_class.is_some();
    let hosts_held = match &app.spec.expose {
        Some(_) if exposing => exposure::held_by_others(&caches.appservices, app),
        _ => Vec::new(),
    };
    let want_ingress = hosts_held
        .is_empty()
        .then(|| desired_ingress(app, ingress_class))
        .flatten();
    let ingress_step = async {
        match ingress_class {
            Some(_) => Optional::look(
                ctx,
                &owner,
                (
                    &caches.ingresses,
                    others_known.then_some(&caches.other_ingresses),
                ),
                (route_name(app.name()), namespace),
                want_ingress,
            )
            .await
            .map(Some),
            None => Ok(None),
        }
    };
    let want_route = hosts_held
        .is_empty()
        .then(|| desired_route(app, gateway))
        .flatten();
    let want_grant = hosts_held
        .is_empty()
        .then(|| desired_grant(app, gateway))
        .flatten();
    let grant_step = async {
        match gateway {
            Some(_) => Optional::look(
                ctx,
                &owner,
                (&caches.grants, others_known.then_some(&caches.other_grants)),
                (route_name(app.name()), namespace),
                want_grant,
            )
            .await
            .map(Some),
            None => Ok(None),
        }
    };
    let cert_manager = ctx.config().expose_cert_manager;
    let want_certificate = hosts_held
        .is_empty()
        .then(|| desired_certificate(app, exposing, cert_manager))
        .flatten();
    let certificate_step = async {
        match Some(()).filter(|()| exposing && cert_manager) {
            Some(_) => Optional::look(
                ctx,
                &owner,
                (
                    &caches.certificates,
                    others_known.then_some(&caches.other_certificates),
                ),
                (route_name(app.name()), namespace),
                want_certificate,
            )
            .await
            .map(Some),
            None => Ok(None),
        }
    };
    let route_step = async {
        match gateway {
            Some(_) => Optional::look(
                ctx,
                &owner,
                (&caches.routes, others_known.then_some(&caches.other_routes)),
                (route_name(app.name()), namespace),
                want_route,
            )
            .await
            .map(Some),
            None => Ok(None),
        }
    };
    let (live_deployment, live_service, live_canary, budget, autoscaler, route) = tokio::join!(
        lookup(
            ctx,
            &owner,
            Deployment::KIND,
            &caches.deployments,
            others_known.then_some(&caches.other_deployments),
            (&deployment_name, namespace),
        ),
        lookup(
            ctx,
            &owner,
            Service::KIND,
            &caches.services,
            others_known.then_some(&caches.other_services),
            (&service_name, namespace),
        ),
        lookup(
            ctx,
            &owner,
            CANARY_SLOT,
            &caches.deployments,
            others_known.then_some(&caches.other_deployments),
            (&canary_name, namespace),
        ),
        Optional::look(
            ctx,
            &owner,
            (
                &caches.budgets,
                others_known.then_some(&caches.other_budgets)
            ),
            (budget_name(app.name()), namespace),
            desired_budget(app),
        ),
        Optional::look(
            ctx,
            &owner,
            (
                &caches.autoscalers,
                others_known.then_some(&caches.other_autoscalers)
            ),
            (autoscaler_name(app.name()), namespace),
            desired_autoscaler(app),
        ),
        // Boxed: three more lookups' states, which a debug build would keep on the stack.
        Box::pin(async { tokio::join!(route_step, grant_step, certificate_step, ingress_step) }),
    );
    let (route, grant, certificate, ingress) = route;
    let (live_deployment, live_service, live_canary, budget, autoscaler, route, grant, certificate) = (
        live_deployment?,
        live_service?,
        live_canary?,
        budget?,
        autoscaler?,
        route?,
        grant?,
        certificate?,
    );
    let ingress = ingress?;
    let uid = app.uid();
    let ours =
        |meta: &kube::api::ObjectMeta| is_controlled_by(meta.owner_references.as_deref(), uid);
    let now = ctx.clock().now();

    let mut taken = Vec::new();
    if let Some(d) = live_deployment.as_ref().filter(|d| !ours(&d.metadata)) {
        taken.push(format!("Deployment {namespace}/{}", d.name_any()));
    }
    if let Some(s) = live_service.as_ref().filter(|s| !ours(&s.metadata)) {
        taken.push(format!("Service {namespace}/{}", s.name_any()));
    }
    // Someone else's object named like the canary blocks only a canary that is asked
    // for; without one it is not ours to care about, and it is never deleted.
    if want_canary.is_some()
        && let Some(d) = live_canary.as_ref().filter(|d| !ours(&d.metadata))
    {
        taken.push(format!("Deployment {namespace}/{}", d.name_any()));
    }
    // Likewise someone else's budget (two budgets over the same Pods make every eviction
    // of them fail) or autoscaler (two would fight over the replicas).
    taken.extend(budget.taken(uid));
    taken.extend(autoscaler.taken(uid));
    // ... or someone else's route of that name (ours would send their host names here).
    taken.extend(route.as_ref().and_then(|r| r.taken(uid)));
    taken.extend(grant.as_ref().and_then(|g| g.taken(uid)));
    taken.extend(certificate.as_ref().and_then(|c| c.taken(uid)));
    taken.extend(ingress.as_ref().and_then(|i| i.taken(uid)));
    // A certificate cert-manager is to issue: until it is, nothing can serve HTTPS.
    let issuer = app
        .spec
        .expose
        .as_ref()
        .and_then(|e| e.tls.as_ref())
        .and_then(|t| t.issuer_ref.as_ref());
    let certificate_waiting = match (issuer, cert_manager) {
        (None, _) => None,
        (Some(_), false) => Some(Err(
            "spec.expose.tls.issuerRef needs cert-manager, which is not enabled for this controller (the chart's controller.expose.certManager)".to_owned(),
        )),
        (Some(_), true) => certificate
            .as_ref()
            .and_then(Optional::live)
            .filter(|live| ours(&live.metadata))
            .map_or(Some(Ok("not written yet".to_owned())), |live| {
                crate::cert_manager::issued(live.ready.as_ref()).err().map(Ok)
            })
            .map(|waiting| {
                waiting.map(|why| {
                    format!(
                        "for cert-manager to issue Certificate {namespace}/{} ({why})",
                        route_name(app.name())
                    )
                })
            }),
    };
    // Host names our route has and this pass no longer asks for: whoever waits for one
    // may take it once the route is converged (woken now: they find it free in the
    // cache of AppServices, which already holds this spec).
    let live_hosts = route
        .as_ref()
        .and_then(Optional::live)
        .filter(|live| ours(&live.metadata))
        .map(exposure::route_hostnames)
        .or_else(|| {
            ingress
                .as_ref()
                .and_then(Optional::live)
                .filter(|live| ours(&live.metadata))
                .map(exposure::ingress_hostnames)
        });
    if let Some(live_hosts) = live_hosts {
        let asked: &[String] = match (&app.spec.expose, hosts_held.is_empty()) {
            (Some(expose), true) => &expose.hostnames,
            _ => &[],
        };
        let released: Vec<String> = live_hosts
            .into_iter()
            .filter(|h| !asked.contains(h))
            .collect();
        ctx.wake(exposure::waiting_for(
            &caches.appservices,
            &released,
            Some(&owner),
        ));
    }
    // What the status says of exposure, from the route as it was before this pass.
    let exposure = match (&app.spec.expose, gateway) {
        (None, _) => None,
        (Some(_), _) if !exposing => Some(Exposure::Unavailable),
        (Some(_), _) if !hosts_held.is_empty() => Some(Exposure::Conflict(hosts_held)),
        (Some(expose), None) => Some(
            match ingress
                .as_ref()
                .and_then(Optional::live)
                .filter(|live| ours(&live.metadata))
            {
                Some(live) if live.admitted => Exposure::Accepted {
                    url: exposure::url(expose),
                },
                _ => Exposure::Pending {
                    waiting: format!(
                        "for the ingress controller of class {} to admit the Ingress",
                        ingress_class.unwrap_or_default()
                    ),
                },
            },
        ),
        (Some(expose), Some(gateway)) => Some(
            route
                .as_ref()
                .and_then(Optional::live)
                .filter(|live| ours(&live.metadata))
                .map_or_else(
                    || Exposure::Pending {
                        waiting: exposure::accepting(gateway),
                    },
                    |live| exposure::acceptance(live, gateway, expose),
                ),
        ),
    };
    if !taken.is_empty() {
        let our_deployment = live_deployment.as_ref().filter(|d| ours(&d.metadata));
        let found = Observation::Conflict {
            message: conflict_message(&taken),
            service_taken: live_service.as_ref().is_some_and(|s| !ours(&s.metadata)),
        };
        let observed = Observed::new(&found)
            .external(report)
            .deployments(our_deployment, None);
        let status = status_of(app, &observed, &now);
        // The watch on foreign objects wakes us when the name is free; this is a backstop.
        return Ok(Outcome::status(status, Ok(Next::requeue(CONFLICT_RECHECK))));
    }
    // A canary of ours that is no longer asked for (promoted or aborted) goes, once.
    let stale_canary = live_canary
        .as_ref()
        .filter(|d| want_canary.is_none() && ours(&d.metadata))
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .and_then(|d| {
            let labelled = d.labels.get(LABEL_MANAGED_BY) == Some(MANAGED_BY);
            d.metadata.uid.clone().map(|uid| (uid, !labelled))
        });

    // The children as a set: each desired one is created or applied, a canary of ours
    // no longer desired is deleted (on its uid), and nothing a pass created is undone. A
    // name someone took after our caches last heard turns up as a refused create (409),
    // so the order of creates decides what such a race leaves: a new Service goes first,
    // alone. Its name taken, no Deployment is created (no Pod of this AppService starts);
    // a Deployment's name taken, only the Service stays, which selects no Pod. Children
    // that exist already are converged at once.
    let canary_step = async {
        match (want_canary, &stale_canary) {
            (Some(want), _) => converge(ctx, &owner, CANARY_SLOT, want, live_canary.clone())
                .await
                .map(Some),
            (None, Some((stale_uid, relabel))) => delete::<Deployment>(
                ctx,
                &owner,
                CANARY_SLOT,
                (&canary_name, namespace),
                stale_uid,
                *relabel,
            )
            .await
            .map(|()| None),
            (None, None) => Ok(None),
        }
    };
    let optional_step = Box::pin(async {
        let (budget, autoscaler, route, grant, certificate, ingress) = tokio::join!(
            budget.converge(ctx, &owner, namespace, uid),
            autoscaler.converge(ctx, &owner, namespace, uid),
            async {
                match route {
                    Some(route) => Some(route.converge(ctx, &owner, namespace, uid).await),
                    None => None,
                }
            },
            async {
                match grant {
                    Some(grant) => Some(grant.converge(ctx, &owner, namespace, uid).await),
                    None => None,
                }
            },
            async {
                match certificate {
                    Some(c) => Some(c.converge(ctx, &owner, namespace, uid).await),
                    None => None,
                }
            },
            async {
                match ingress {
                    Some(i) => Some(i.converge(ctx, &owner, namespace, uid).await),
                    None => None,
                }
            },
        );
        [
            Some(budget),
            Some(autoscaler),
            route,
            grant,
            certificate,
            ingress,
        ]
    });
    // Boxed: the converges' states are large, and a debug build copies them about.
    let deployments = Box::pin(async {
        tokio::join!(
            converge(
                ctx,
                &owner,
                Deployment::KIND,
                want_deployment,
                live_deployment.clone()
            ),
            canary_step,
            optional_step,
        )
    });
    let service_step = Box::pin(converge(
        ctx,
        &owner,
        Service::KIND,
        want_service,
        live_service.clone(),
    ));
    let (service, (deployment, canary, optional)) = if live_service.is_none() {
        match service_step.await {
            Ok(service) => (Ok(service), deployments.await),
            Err(e) if refused_create(&e) => {
                ctx.created((Service::KIND, owner.clone()));
                return Err(e);
            }
            Err(e) => {
                return Ok(rejected(
                    app,
                    report,
                    "Service",
                    live_deployment.as_ref(),
                    e,
                    &now,
                ));
            }
        }
    } else {
        tokio::join!(service_step, deployments)
    };
    let deployment_refused =
        live_deployment.is_none() && deployment.as_ref().is_err_and(refused_create);
    let canary_refused = live_canary.is_none() && canary.as_ref().is_err_and(refused_create);
    // The next pass asks the API server for a refused name instead of the caches.
    for (slot, refused) in [
        (Deployment::KIND, deployment_refused),
        (CANARY_SLOT, canary_refused),
    ] {
        if refused {
            ctx.created((slot, owner.clone()));
        }
    }
    let (deployment, canary) = match (deployment, canary) {
        (Err(e), _) if deployment_refused => return Err(e),
        (_, Err(e)) if canary_refused => return Err(e),
        children => children,
    };
    let mut optional_failed = None;
    for child in optional.into_iter().flatten() {
        match child.result {
            Err(e) if child.refused => {
                ctx.created((child.kind, owner.clone()));
                return Err(e);
            }
            Err(e) => optional_failed = optional_failed.or(Some((child.kind, e))),
            Ok(()) => {}
        }
    }
    let deployment = match deployment {
        Ok(d) => d,
        Err(e) => {
            return Ok(rejected(
                app,
                report,
                "Deployment",
                live_deployment.as_ref(),
                e,
                &now,
            ));
        }
    };
    if let Err(e) = service {
        return Ok(rejected(app, report, "Service", Some(&deployment), e, &now));
    }
    let canary = match canary {
        Ok(c) => c,
        Err(e) => {
            return Ok(rejected(
                app,
                report,
                "canary Deployment",
                Some(&deployment),
                e,
                &now,
            ));
        }
    };
    if let Some((kind, e)) = optional_failed {
        return Ok(rejected(app, report, kind, Some(&deployment), e, &now));
    }
    // HTTPS: this AppService's listeners on the Gateway (none once it no longer asks,
    // which removes those it had). The route's verdict holds only while they serve.
    let exposure = match (gateway, &app.spec.expose) {
        // An Ingress (or nothing): only the Certificate may still be awaited.
        (None, _) => match (exposure, certificate_waiting) {
            (
                Some(
                    Exposure::Pending { .. } | Exposure::Accepted { .. } | Exposure::Refused { .. },
                ),
                Some(Err(message)),
            ) => Some(Exposure::Refused { message }),
            (
                Some(
                    Exposure::Pending { .. } | Exposure::Accepted { .. } | Exposure::Refused { .. },
                ),
                Some(Ok(waiting)),
            ) => Some(Exposure::Pending { waiting }),
            (exposure, _) => exposure,
        },
        (Some(gateway_ref), expose) => {
            let want = match (expose, &exposure) {
                (
                    Some(expose),
                    Some(
                        Exposure::Pending { .. }
                        | Exposure::Accepted { .. }
                        | Exposure::Refused { .. },
                    ),
                ) => listeners::desired_listeners(
                    (namespace, app.name()),
                    expose,
                    ctx.config().expose_https_port,
                ),
                _ => std::collections::BTreeMap::new(),
            };
            match (listeners::converge(ctx, app, &want).await, exposure) {
                // The Secret a Certificate is to fill cannot be served before it is issued.
                (
                    _,
                    Some(
                        Exposure::Pending { .. }
                        | Exposure::Accepted { .. }
                        | Exposure::Refused { .. },
                    ),
                ) if certificate_waiting.is_some() => match certificate_waiting {
                    Some(Err(message)) => Some(Exposure::Refused { message }),
                    Some(Ok(waiting)) => Some(Exposure::Pending { waiting }),
                    None => None,
                },
                (Err(message), Some(_)) => Some(Exposure::Refused { message }),
                (Ok(false), Some(Exposure::Accepted { .. })) => Some(Exposure::Pending {
                    waiting: format!("for Gateway {gateway_ref} to serve its HTTPS listeners"),
                }),
                (_, exposure) => exposure,
            }
        }
    };
    // Whether we changed what a Deployment runs (not only its metadata, such as the
    // desired-hash annotation added after an upgrade or a label put back).
    let spec_written = live_deployment
        .as_ref()
        .is_none_or(|live| live.spec != deployment.spec)
        || canary
            .as_ref()
            .is_some_and(|c| live_canary.as_ref().is_none_or(|live| live.spec != c.spec))
        || stale_canary.is_some();

    // An edit of a Deployment's metadata (an annotation bumps its generation), by
    // someone else or by us, leaves it briefly unobserved by the Deployment controller.
    // That is no rollout: keep the status as it is rather than flap Ready, and look again
    // when the Deployment controller has caught up (its status update wakes us).
    let unobserved = |d: &DeploymentView| {
        d.status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .unwrap_or(0)
            < d.metadata.generation.unwrap_or(0)
    };
    let unobserved = unobserved(&deployment) || canary.as_ref().is_some_and(unobserved);
    let settled =
        app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation;
    // ... unless the external step's conditions moved (the database became ready again):
    // that must reach status now, or DatabaseReady would wait for the next rollout.
    if unobserved && settled && !spec_written && !external_changes(app, report) {
        debug!("Deployment metadata changed and not yet observed; status kept");
        return Ok(Outcome::next(Ok(Next::requeue(
            ctx.config().rollout_requeue,
        ))));
    }

    let found = if held.is_some() {
        Observation::Held
    } else {
        Observation::Applied
    };
    // A rollout in progress may be waiting on Pods that will not start until someone
    // acts; the Deployment's status does not say so, the Pods do. Only once Pods exist
    // that are not ready (a Deployment not yet observed, or one whose Pods are all
    // ready, has none to ask about).
    let unready = |d: &DeploymentView| {
        d.status
            .as_ref()
            .is_some_and(|s| s.replicas.unwrap_or(0) > s.ready_replicas.unwrap_or(0))
    };
    let trouble = match rollout_of(&deployment, canary.as_ref()).0 {
        Rollout::InProgress { .. }
            if unready(&deployment) || canary.as_ref().is_some_and(unready) =>
        {
            pod_trouble(ctx.client(), namespace, app.name()).await
        }
        Rollout::InProgress { .. } | Rollout::Complete { .. } | Rollout::Stuck { .. } => None,
    };
    let observed = Observed::new(&found)
        .external(report)
        .deployments(Some(&deployment), canary.as_ref())
        .pods(trouble.as_ref())
        .exposure(exposure.as_ref());
    let status = status_of(app, &observed, &now);
    let next = match rollout_of(&deployment, canary.as_ref()).0 {
        Rollout::InProgress { message, .. } => {
            debug!(%message, "rollout in progress");
            ctx.config().rollout_requeue
        }
        // A stuck rollout moves when the Deployment does (its status wakes us): the
        // ReplicaSet controller creates the Pods once the cause is gone.
        Rollout::Complete { .. } | Rollout::Stuck { .. } => ctx.config().resync_interval,
    };
    // A governed image's tag is resolved again this often: a new signed digest rolls out.
    let next = match report.images.as_ref().and_then(|i| i.recheck) {
        Some(recheck) => next.min(recheck),
        None => next,
    };
    // A host name held by another AppService is freed by its deletion (its route's
    // event wakes us) or by an edit of its host names (which nothing here watches for):
    // this is the backstop.
    let next = match exposure {
        Some(Exposure::Conflict(_)) => next.min(CONFLICT_RECHECK),
        _ => next,
    };
    Ok(Outcome::status(status, Ok(Next::requeue(next))))
}

/// Status while a ConfigMap or Secret the Pods read is missing: the children stay as they
/// are (the Pods would not start without it). Its creation wakes the AppService; the
/// recheck is a backstop should that watch be down.
fn config_missing(ctx: &Context, app: &Subject, report: &Report, missing: &[String]) -> Outcome {
    let message = format!(
        "{} {} not exist in namespace {}; the Pods read {}",
        missing.join(" and "),
        if missing.len() == 1 { "does" } else { "do" },
        app.namespace(),
        if missing.len() == 1 { "it" } else { "them" },
    );
    let found = Observation::ConfigMissing(message);
    let deployment = cached_deployment(ctx, app);
    let observed = Observed::new(&found)
        .external(report)
        .deployments(deployment.as_deref(), None);
    let status = status_of(app, &observed, &ctx.clock().now());
    Outcome::status(status, Ok(Next::requeue(CONFLICT_RECHECK)))
}

/// Why nothing is created while `taken` names are held by objects we do not control.
fn conflict_message(taken: &[String]) -> String {
    let one = taken.len() == 1;
    format!(
        "{} already {} and {} not controlled by this AppService; left untouched, and nothing is created until {} deleted or renamed (or the AppService is renamed)",
        taken.join(" and "),
        if one { "exists" } else { "exist" },
        if one { "is" } else { "are" },
        if one { "it is" } else { "they are" },
    )
}

/// A child failed to converge. When the API server keeps rejecting a child we built (HTTP
/// 400/422, after a repair), or another writer keeps changing it, status says so before
/// the error goes to the error policy, which retries with backoff: the cause may be
/// another writer's fields as well as the spec.
fn rejected(
    app: &Subject,
    report: &Report,
    kind: &str,
    deployment: Option<&DeploymentView>,
    error: Error,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Outcome {
    let message = match &error {
        Error::Kube(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => {
            format!("the API server rejected the {kind}: {}", status.message)
        }
        Error::Drift { .. } => error.to_string(),
        _ => return Outcome::next(Err(error)),
    };
    let found = Observation::Rejected(message);
    let observed = Observed::new(&found)
        .external(report)
        .deployments(deployment, None);
    Outcome::status(status_of(app, &observed, now), Err(error))
}

/// What our Deployments of `app` run, from the cache: what keeps running when an image
/// is held and status records nothing.
fn live_images(ctx: &Context, app: &Subject) -> crate::image_verdict::Live {
    let image =
        |name: &str| cached_child(ctx, app, name).and_then(|d| d.image().map(str::to_owned));
    crate::image_verdict::Live {
        image: image(&deployment_name(app.name())),
        canary: image(&canary_deployment_name(app.name())),
    }
}

/// Our Deployment of `app` from the cache, for the ready count of a blocked status.
fn cached_deployment(ctx: &Context, app: &Subject) -> Option<Arc<DeploymentView>> {
    cached_child(ctx, app, &deployment_name(app.name()))
}

/// Our Deployment `name` of `app` from the cache, if it is ours.
fn cached_child(ctx: &Context, app: &Subject, name: &str) -> Option<Arc<DeploymentView>> {
    ctx.caches()
        .deployments
        .get(&ObjectRef::new(name).within(app.namespace()))
        .filter(|d| is_controlled_by(d.metadata.owner_references.as_deref(), app.uid()))
}
