//! The finalizer: on before anything we may have to clean up exists, only where there may
//! be such a thing, released once the external resources of a deleted AppService are gone.

use std::borrow::Cow;

use crate::queue::Next;
use common::AppService;
use common::names::FINALIZER;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

use crate::context::Context;
use crate::error::Result;
use crate::external::Step;
use crate::metrics::Written;
use crate::outcome::Outcome;
use crate::status::{Observation, Observed, status_of};
use crate::subject::Subject;

/// The finalizer goes on every AppService before anything may be made for it, and comes
/// back whenever another writer removes it: without it a delete skips the cleanup (of a
/// database, or of one a later edit asks for). Returns the object as it is now.
pub(crate) async fn ensure_finalizer<'a>(
    app: &'a AppService,
    ctx: &Context,
    api: &Api<AppService>,
) -> Result<Cow<'a, AppService>> {
    if app.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Cow::Borrowed(app));
    }
    let mut finalizers = app.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patched = patch_finalizers(api, app, finalizers).await?;
    ctx.metrics().write(Written::AppServices);
    debug!("added finalizer");
    Ok(Cow::Owned(patched))
}

/// Sets the finalizers of `app`, guarded by its resourceVersion.
async fn patch_finalizers(
    api: &Api<AppService>,
    app: &AppService,
    finalizers: Vec<String>,
) -> kube::Result<AppService> {
    let patch = json!({"metadata": {
        "resourceVersion": app.metadata.resource_version,
        "finalizers": finalizers,
    }});
    api.patch(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Deletion: clean up external resources, then let the object go.
pub(crate) async fn finalize(
    app: &Subject<'_>,
    ctx: &Context,
    api: &Api<AppService>,
) -> Result<Outcome> {
    if !app.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Outcome::gone());
    }
    // A pass queued while the last one released the finalizer sees the object as it was
    // then until the cache hears of the release: its cleanup is done already.
    let key = ObjectRef::from_obj(&**app);
    if ctx.released_from(&key, app.metadata.resource_version.as_deref()) {
        debug!("finalizer already released from this version; nothing to clean up");
        return Ok(Outcome::gone());
    }
    // A pass after a cleanup whose finalizer removal failed (a conflict: the object
    // changed meanwhile) has only the removal left.
    let uid = app.metadata.uid.clone();
    // Whoever waits for one of its host names may take it now (it is terminating: no
    // longer a holder).
    if let Some(expose) = &app.spec.expose {
        ctx.wake(crate::exposure::waiting_for(
            &ctx.caches().appservices,
            &expose.hostnames,
            Some(&key),
        ));
    }
    // Its HTTPS listeners on the shared Gateway (no owner reference can collect them).
    // A failure is logged, not retried forever: a listener left behind names a Secret
    // the Gateway may no longer read (its ReferenceGrant is collected), so it serves
    // nothing, and it is removed by hand.
    if let Err(message) =
        crate::listeners::converge(ctx, app, &std::collections::BTreeMap::new()).await
    {
        tracing::warn!(%message, "HTTPS listeners of a deleted AppService not removed");
    }
    if uid.as_deref().is_some_and(|u| ctx.cleaned_up(&key, u)) {
        debug!("external cleanup already done; removing the finalizer");
    } else {
        match ctx.external().cleanup(app).await {
            Ok(Step::Done) => {}
            Ok(Step::NotReady(after)) => return Ok(Outcome::next(Ok(Next::requeue(after)))),
            Err(e) => {
                ctx.metrics().cleanup_failed();
                let message = e.to_string();
                // Announced once by the status it writes (`report::announcements`).
                let found = Observation::CleanupFailed(message);
                let status = status_of(app, &Observed::new(&found), &ctx.clock().now());
                return Ok(Outcome::status(status, Err(e)));
            }
        }
        if let Some(uid) = uid {
            ctx.remember_cleanup(&key, uid);
        }
    }
    let finalizers: Vec<String> = app
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    match patch_finalizers(api, app, finalizers).await {
        Ok(_) => {}
        // Already gone: nothing left to do.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.metrics().write(Written::AppServices);
    if let Some(rv) = app.metadata.resource_version.clone() {
        ctx.remember_release(key, rv);
    }
    info!("cleanup done, finalizer removed");
    Ok(Outcome::gone())
}
