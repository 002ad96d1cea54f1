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

use common::names::LABEL_NAME;

use crate::review::shell::Facts;

/// Why an UPDATE is admitted without being judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unjudged {
    /// Spec, labels and annotations are unchanged.
    NothingJudgedChanged,
    /// The stored object is being deleted.
    BeingDeleted,
}

/// Whether the UPDATE of `old` to `new` (both in the version of the review, as their one
/// pass read them: [`crate::review::shell`]) is admitted without judging it, and why.
/// `new` is `None` when the new object cannot be read: only the deletion of the stored
/// one then lets it through. Objects that cannot be read are otherwise judged as usual.
///
/// The spec is compared as the API server wrote it: it serializes `object` and
/// `oldObject` alike (map keys sorted), so equal specs are equal text, and the comparison
/// decodes nothing.
pub fn unjudged(old: &Facts<'_>, new: Option<&Facts<'_>>) -> Option<Unjudged> {
    if old.deleting {
        return Some(Unjudged::BeingDeleted);
    }
    same_as(new?, old).then_some(Unjudged::NothingJudgedChanged)
}

/// Whether `new` asks for nothing `old` did not have.
fn same_as(new: &Facts<'_>, old: &Facts<'_>) -> bool {
    // `/mutate` adds the name label to an object stored without it (one written before
    // the webhook ran) on any UPDATE, the controller's finalizer write too: that default
    // is not the writer's change.
    let defaulted = !old.labels.contains_key(LABEL_NAME)
        && new
            .labels
            .get(LABEL_NAME)
            .is_some_and(|value| Some(value.as_ref()) == new.name);
    let labels = if defaulted {
        new.labels.len() == old.labels.len() + 1
            && new
                .labels
                .iter()
                .filter(|(key, _)| key.as_ref() != LABEL_NAME)
                .eq(old.labels.iter())
    } else {
        new.labels == old.labels
    };
    new.spec == old.spec && labels && new.annotations == old.annotations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::Json;
    use serde_json::value::RawValue;
    use serde_json::{Value, json};

    /// The ratchet on an UPDATE of `old` to `new`, each read as the webhook reads it.
    fn unjudged(old: &Value, new: &Value) -> Option<Unjudged> {
        let json = |value: &Value| Json::from(RawValue::from_string(value.to_string()).unwrap());
        let (old, new) = (json(old), json(new));
        let stored = old.stored().unwrap();
        let written = new.updated();
        super::unjudged(
            &stored.facts().unwrap(),
            written.as_ref().ok().and_then(|w| w.facts()).as_ref(),
        )
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
            unjudged(&old, &finalized),
            Some(Unjudged::NothingJudgedChanged)
        );
        assert_eq!(
            unjudged(&finalized, &old),
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
            assert_eq!(unjudged(&old, &changed), None, "{changed}");
        }
        // The name label `/mutate` adds to an object stored without one is no change.
        let defaulted = object(
            spec.clone(),
            json!({"name": "a", "labels": {"team": "x", "app.kubernetes.io/name": "a"}}),
        );
        assert_eq!(
            unjudged(&old, &defaulted),
            Some(Unjudged::NothingJudgedChanged)
        );
        let renamed = object(
            spec.clone(),
            json!({"name": "a", "labels": {"team": "x", "app.kubernetes.io/name": "b"}}),
        );
        assert_eq!(unjudged(&old, &renamed), None);
        // Absent and empty labels are the same.
        let bare = object(spec.clone(), json!({"name": "a"}));
        let empty = object(
            spec.clone(),
            json!({"name": "a", "labels": {}, "annotations": null}),
        );
        assert_eq!(
            unjudged(&bare, &empty),
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
        assert_eq!(unjudged(&old, &released), Some(Unjudged::BeingDeleted));
    }
}
