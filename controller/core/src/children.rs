//! Converging one child (a Deployment or a Service) on what the AppService wants: find it
//! in the caches (or ask), then create, apply or repair it with as few requests as
//! possible. Reconcile decides whether a child may be written at all; this module only
//! writes children this AppService controls.

use common::AppService;
use common::names::{FIELD_MANAGER, LABEL_MANAGED_BY, MANAGED_BY};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use tracing::info;

use crate::context::Context;
use crate::drift::{Drift, desired_hash, set_hash};
use crate::error::{Error, Result};
use crate::metrics::Written;
use crate::view::{self, Child, Hashed};

/// The live child named like `desired`: from our (label-filtered) cache; else, if the
/// name is not among the taken names of objects without our label (`others`, when that
/// list is complete), there is none; else (a foreign object, or ours with a label
/// removed) from the API server.
///
/// `slot` tells apart two children of one kind (the stable and the canary Deployment)
/// in what the controller remembers of its writes: the kind for the one child of a
/// kind, [`crate::desired::CANARY_SLOT`] for the canary.
pub async fn lookup<K: Child>(
    ctx: &Context,
    owner: &ObjectRef<AppService>,
    slot: &'static str,
    cache: &Store<K::View>,
    others: Option<&Store<PartialObjectMeta<K>>>,
    (name, namespace): (&str, &str),
) -> Result<Option<K::View>> {
    let child = (slot, owner.clone());
    if let Some(obj) = cache.get(&ObjectRef::new(name).within(namespace)) {
        ctx.seen(&child);
        // Our own write of it may not have reached the cache yet (another event of the
        // AppService came first): decide on what that write returned.
        let cached = obj.meta().resource_version.as_deref();
        if let Some(written) = ctx.child_written_over::<K::View>(&child, cached) {
            return Ok(Some(written));
        }
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
    let api: Api<K::View> = Api::namespaced(ctx.client().clone(), namespace);
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
pub async fn converge<K: Child>(
    ctx: &Context,
    owner: &ObjectRef<AppService>,
    slot: &'static str,
    mut desired: K,
    live: Option<K::View>,
) -> Result<K::View> {
    let kind = K::KIND;
    // A child we built always has both; the check keeps a bug from becoming a panic.
    let (Some(name), Some(namespace)) = (
        desired.meta().name.clone(),
        desired.meta().namespace.clone(),
    ) else {
        return Err(Error::MissingField(
            "metadata.name or metadata.namespace of a child",
        ));
    };
    let hash = desired_hash(&desired).map_err(|error| Error::Serialize { kind, error })?;
    set_hash(desired.meta_mut(), hash.clone());
    let want: K::View = view::of(&desired).map_err(|error| Error::Serialize { kind, error })?;
    // Responses decode straight into views: nothing of a child but the view is kept.
    let api: Api<K::View> = Api::namespaced(ctx.client().clone(), &namespace);

    let Some(live) = live else {
        let created = Api::<K>::namespaced(ctx.client().clone(), &namespace)
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PostParams::default()
                },
                &desired,
            )
            .await?;
        ctx.metrics().write(K::WRITTEN);
        ctx.created((slot, owner.clone()));
        info!(kind, child = %name, "created");
        return view::of(&created).map_err(|error| Error::Serialize { kind, error });
    };
    let replaced = live.meta().resource_version.clone();
    let written = update(ctx, &api, &name, &desired, &hash, &want, live).await?;
    if let Some(replaced) = replaced
        && written.meta().resource_version.as_ref() != Some(&replaced)
    {
        ctx.remember_child_write((slot, owner.clone()), replaced, written.clone());
    }
    Ok(written)
}

/// Deletes our child `name` (a canary Deployment no longer asked for), on the condition
/// that it is still the object of `uid`: should it have been replaced since the cache
/// saw it (by someone else's object of that name), the API server refuses (409) and
/// nothing of theirs is deleted. Already gone (404) is done.
///
/// `relabel`: someone removed our `managed-by` label. The chart's admission policy lets
/// the controller delete only objects that carry it, so it is put back first (one merge
/// patch, with the same uid precondition), or the child would stay for good.
pub async fn delete<K: Child>(
    ctx: &Context,
    owner: &ObjectRef<AppService>,
    slot: &'static str,
    (name, namespace): (&str, &str),
    uid: &str,
    relabel: bool,
) -> Result<()> {
    let api: Api<K::View> = Api::namespaced(ctx.client().clone(), namespace);
    if relabel {
        let patch = serde_json::json!({"metadata": {
            "uid": uid,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => ctx.metrics().write(K::WRITTEN),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            ctx.metrics().write(K::WRITTEN);
            info!(kind = K::KIND, child = %name, "deleted");
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.seen(&(slot, owner.clone()));
    Ok(())
}

/// The writes of `converge` to a child that exists: nothing, a repair, or an apply.
async fn update<K: Child>(
    ctx: &Context,
    api: &Api<K::View>,
    name: &str,
    desired: &K,
    hash: &str,
    want: &K::View,
    live: K::View,
) -> Result<K::View> {
    let kind = K::KIND;
    if live.hash() == Some(hash) {
        let ops = K::View::drift(want, &live);
        if ops.is_empty() {
            return Ok(live);
        }
        return repair(ctx, api, name, want, ops, (K::KIND, K::WRITTEN)).await;
    }

    let applied = match apply(ctx, api, name, desired).await {
        Ok(applied) => applied,
        Err(Error::Kube(kube::Error::Api(status))) if matches!(status.code, 400 | 422) => {
            let ops = K::View::drift(want, &live);
            if ops.is_empty() {
                return Err(Error::Kube(kube::Error::Api(status)));
            }
            info!(kind, child = %name, reason = %status.message, "apply rejected; putting our fields back first");
            repair(ctx, api, name, want, ops, (K::KIND, K::WRITTEN)).await?;
            apply(ctx, api, name, desired).await?
        }
        Err(e) => return Err(e),
    };
    let ops = K::View::drift(want, &applied);
    if ops.is_empty() {
        return Ok(applied);
    }
    repair(ctx, api, name, want, ops, (K::KIND, K::WRITTEN)).await
}

async fn apply<K: Child>(
    ctx: &Context,
    api: &Api<K::View>,
    name: &str,
    desired: &K,
) -> Result<K::View> {
    let kind = K::KIND;
    // Force: we are the controller of this object; fields we set are ours.
    let applied = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await?;
    ctx.metrics().write(K::WRITTEN);
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
    (kind, written): (&'static str, Written),
) -> Result<V>
where
    V: Resource<DynamicType = ()> + Drift + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let paths = changed_paths(&ops);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|error| Error::Serialize { kind, error })?;
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
    ctx.metrics().write(written);
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
