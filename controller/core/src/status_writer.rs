//! The one way the controller writes a status it owns whole (the AppService's, a
//! DatabaseClass's, an ImagePolicy's), once its caller found that it changed.
//!
//! The status is sent as a forced server-side apply under our field manager, so it owns
//! every field it sets whoever wrote them before, and counted as one API write. An apply
//! cannot remove the fields another writer set beside ours: when the caller knows of
//! such `leftovers`, the status goes as one merge patch instead, setting ours and
//! removing those, on the condition that the object is still the one the caller read
//! (a 409 otherwise, retried). Either way a status is one write. What
//! counts as a change is the kind's own rule (conditions compared without their
//! transition times, ...), checked by the caller before it calls [`apply_status`]: the
//! AppService's before it works out the Events of the change.

use std::fmt::Debug;

use common::names::FIELD_MANAGER;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::metrics::{Metrics, Written};

/// The guard of a status write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Whatever the object's version now.
    None,
    /// Only on the version of the object the caller read (a 409 otherwise): a status
    /// prepared before a change the writer must not miss (a shard's handover) cannot
    /// land after it.
    ReadVersion,
}

/// Writes `status` as the status of `object`, removing the top-level fields `leftovers`
/// (set by another writer, absent from `status`), counting the write as `written`;
/// returns the object as the API server left it. With leftovers the write is always on
/// `object`'s version, whatever `guard` says.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    object: &K,
    status: &S,
    guard: Guard,
    leftovers: &[String],
    metrics: &Metrics,
    written: Written,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let result = if leftovers.is_empty() {
        let mut patch = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": {"name": object.name_any()},
            "status": status,
        });
        if guard == Guard::ReadVersion {
            patch["metadata"]["resourceVersion"] = json!(object.meta().resource_version);
        }
        api.patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?
    } else {
        let mut body = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
        if let Some(fields) = body.as_object_mut() {
            for field in leftovers {
                fields.insert(field.clone(), serde_json::Value::Null);
            }
        }
        api.patch_status(
            &object.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": object.meta().resource_version},
                "status": body,
            })),
        )
        .await?
    };
    metrics.write(written);
    Ok(result)
}
