//! Reviews for the unit tests of admission.

use serde_json::{Value, json};

use super::{Request, decode_review};

/// A decoded review; the body is leaked so the request can borrow it for the test.
pub fn decoded(body: Vec<u8>) -> Request<'static> {
    decode_review(Box::leak(body.into_boxed_slice())).unwrap()
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
