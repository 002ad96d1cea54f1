//! Reviews for the unit tests of admission.

use serde_json::{Value, json};

use super::{Judge, Review, decode_review};
use crate::policy::PolicySet;

/// A decoded review.
pub fn decoded(body: Vec<u8>) -> Review {
    decode_review(&body.into()).unwrap()
}

pub fn review(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "platform.example.com", "version": "v1alpha1", "kind": "AppService"},
            "resource": {"group": "platform.example.com", "version": "v1alpha1", "resource": "appservices"},
            "name": "checkout",
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    }))
    .unwrap()
}

pub fn app(spec: Value) -> Value {
    json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "AppService",
        "metadata": {"name": "checkout", "namespace": "shop"},
        "spec": spec
    })
}

/// What a review is judged with in a unit test: `policies`, without namespace labels or
/// an AppService cache.
pub fn judge(policies: &PolicySet) -> Judge<'_> {
    Judge {
        policies,
        namespace_object: None,
        appservices: None,
        metrics: None,
    }
}
