//! Which UPDATEs are not judged again: the rules (validation and policies) judge what a
//! user asks for, so an UPDATE that asks for nothing new is admitted as it is.
//!
//! This is what lets the controller finish its work on objects that violate a rule
//! added after they were written: its own writes to the main resource add or remove
//! the finalizer (metadata only), and its status goes through the status subresource,
//! which the webhook configurations do not cover. Without it, a policy added later
//! would refuse the finalizer's removal and the object could never be deleted.
//!
//! * An UPDATE whose spec, labels and annotations are those of the stored object is
//!   not judged: finalizers, owner references and the API server's own fields
//!   (resourceVersion, generation, managedFields, timestamps) are bookkeeping; so is
//!   the name label `/mutate` adds to an object stored without one.
//! * An UPDATE of an object being deleted (`deletionTimestamp` set on the stored
//!   object) is not judged: nothing runs from its spec any more, and what is left to
//!   do is releasing finalizers.

use std::collections::BTreeMap;

use common::names::LABEL_NAME;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// Why an UPDATE is admitted without being judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unjudged {
    /// Spec, labels and annotations are unchanged.
    NothingJudgedChanged,
    /// The stored object is being deleted.
    BeingDeleted,
}

/// What of an object the rules judge, and whether it is being deleted. The spec is
/// compared as the API server wrote it: it serializes `object` and `oldObject` alike
/// (map keys sorted), so equal specs are equal text, and the comparison costs no copy.
#[derive(Deserialize, Default)]
struct Judged<'a> {
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
    #[serde(default)]
    metadata: Meta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deletion_timestamp: Option<Value>,
}

impl Judged<'_> {
    /// Whether this object (the new one) asks for nothing `old` did not have.
    fn same_as(&self, old: &Judged<'_>) -> bool {
        // Absent, null and empty maps are the same set of labels.
        let map = |m: &Option<BTreeMap<String, String>>| m.clone().unwrap_or_default();
        let mut labels = map(&self.metadata.labels);
        let old_labels = map(&old.metadata.labels);
        // `/mutate` adds the name label to an object stored without it (one written
        // before the webhook ran) on any UPDATE, the controller's finalizer write too:
        // that default is not the writer's change.
        if !old_labels.contains_key(LABEL_NAME)
            && labels
                .get(LABEL_NAME)
                .is_some_and(|v| Some(v) == self.metadata.name.as_ref())
        {
            labels.remove(LABEL_NAME);
        }
        self.spec.map(RawValue::get) == old.spec.map(RawValue::get)
            && labels == old_labels
            && map(&self.metadata.annotations) == map(&old.metadata.annotations)
    }
}

/// Whether the UPDATE of `old` to `new` (both in the version of the review) is admitted
/// without judging it, and why. Objects that cannot be read are judged as usual.
pub fn unjudged(old: &RawValue, new: &RawValue) -> Option<Unjudged> {
    let old: Judged<'_> = serde_json::from_str(old.get()).ok()?;
    if old
        .metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|t| !t.is_null())
    {
        return Some(Unjudged::BeingDeleted);
    }
    let new: Judged<'_> = serde_json::from_str(new.get()).ok()?;
    new.same_as(&old).then_some(Unjudged::NothingJudgedChanged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    fn object(spec: Value, metadata: Value) -> Value {
        json!({"apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
               "metadata": metadata, "spec": spec})
    }

    #[test]
    fn bookkeeping_is_not_judged_and_anything_else_is() {
        let spec = json!({"image": "nginx:latest", "replicas": 1});
        let old = object(
            spec.clone(),
            json!({"name": "a", "resourceVersion": "1", "labels": {"team": "x"}}),
        );
        let finalized = object(
            spec.clone(),
            json!({"name": "a", "resourceVersion": "1", "labels": {"team": "x"},
                   "finalizers": ["platform.example.com/cleanup"], "generation": 2,
                   "managedFields": [{"manager": "appservice-controller"}]}),
        );
        assert_eq!(
            unjudged(&raw(&old), &raw(&finalized)),
            Some(Unjudged::NothingJudgedChanged)
        );
        assert_eq!(
            unjudged(&raw(&finalized), &raw(&old)),
            Some(Unjudged::NothingJudgedChanged)
        );
        for changed in [
            object(
                json!({"image": "nginx:latest", "replicas": 0}),
                json!({"name": "a", "labels": {"team": "x"}}),
            ),
            object(spec.clone(), json!({"name": "a", "labels": {"team": "y"}})),
            object(
                spec.clone(),
                json!({"name": "a", "labels": {"team": "x"}, "annotations": {"k": "v"}}),
            ),
        ] {
            assert_eq!(unjudged(&raw(&old), &raw(&changed)), None, "{changed}");
        }
        // The name label `/mutate` adds to an object stored without one is no change.
        let defaulted = object(
            spec.clone(),
            json!({"name": "a", "labels": {"team": "x", "app.kubernetes.io/name": "a"}}),
        );
        assert_eq!(
            unjudged(&raw(&old), &raw(&defaulted)),
            Some(Unjudged::NothingJudgedChanged)
        );
        let renamed = object(
            spec.clone(),
            json!({"name": "a", "labels": {"team": "x", "app.kubernetes.io/name": "b"}}),
        );
        assert_eq!(unjudged(&raw(&old), &raw(&renamed)), None);
        // Absent and empty labels are the same.
        let bare = object(spec.clone(), json!({"name": "a"}));
        let empty = object(
            spec.clone(),
            json!({"name": "a", "labels": {}, "annotations": null}),
        );
        assert_eq!(
            unjudged(&raw(&bare), &raw(&empty)),
            Some(Unjudged::NothingJudgedChanged)
        );
    }

    #[test]
    fn an_object_being_deleted_is_not_judged() {
        let old = object(
            json!({"image": "nginx:latest"}),
            json!({"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z",
                   "finalizers": ["platform.example.com/cleanup"]}),
        );
        let released = object(
            json!({"image": "other:latest"}),
            json!({"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}),
        );
        assert_eq!(
            unjudged(&raw(&old), &raw(&released)),
            Some(Unjudged::BeingDeleted)
        );
    }
}
