//! A review's objects as the policies read them: `object` and `oldObject` each converted
//! once, straight from its JSON, into a CEL value of only the fields the policies read
//! ([`crate::expression::object_to_cel`]). What replaces part of an object is put in as it
//! is converted: the hub form of a `v1alpha1` object ([`super::hub`]), the new replicas
//! of a scale write. No JSON is written out to be read again.

use crate::expression::{Replace, object_to_cel};
use crate::policy::{Objects, PolicySet};

use super::{Json, MAX_POLICY_VALUES};

/// An object for the policies: its JSON, and what replaces part of it.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub json: &'a Json,
    pub replace: &'a [Replace<'a>],
}

impl<'a> Source<'a> {
    /// The object as it is.
    pub fn json(json: &'a Json) -> Self {
        Source { json, replace: &[] }
    }
}

/// `object` and `oldObject` for `policies`: `oldObject` is converted only when a policy
/// reads it and `object` could be converted (otherwise every policy denies anyway).
pub fn objects(
    policies: &PolicySet,
    object: Source<'_>,
    old_object: Option<Source<'_>>,
) -> Objects {
    let convert = |source: Source<'_>, projection| {
        object_to_cel(
            source.json.bytes(),
            projection,
            MAX_POLICY_VALUES,
            source.replace,
        )
    };
    let object = convert(object, policies.object_projection());
    let old_projection = policies.old_object_projection();
    let old_object = old_object
        .filter(|_| object.is_ok() && !old_projection.is_empty())
        .map(|old| convert(old, old_projection));
    Objects { object, old_object }
}
