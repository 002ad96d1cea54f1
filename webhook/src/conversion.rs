//! `/convert`: the CRD conversion webhook. A ConversionReview (`apiextensions.k8s.io/v1`)
//! carries objects in one version of AppService and the version the API server wants;
//! each object is converted by `common::conversion` (pure, lossless both ways).
//!
//! A body that is not a ConversionReview is a [`ReviewError`] (HTTP 400); a
//! review that asks for an unknown version, or holds an object that cannot be converted,
//! is answered with `result.status: Failure` and a message naming the object, which the
//! API server passes on to its client. Nothing here panics on input.

use common::conversion::{self, Version};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::review::{ReviewError, ReviewKind, decode_review};

/// The only ConversionReview version the API server sends for `conversionReviewVersions: [v1]`.
pub const REVIEW_API_VERSION: &str = "apiextensions.k8s.io/v1";

/// What `/convert` accepts.
pub const CONVERSION_REVIEW: ReviewKind = ReviewKind {
    kind: "ConversionReview",
    api_version: REVIEW_API_VERSION,
};

/// Why a well-formed review is answered with `result.status: Failure`.
#[derive(Debug, thiserror::Error)]
pub enum ConversionFailure {
    #[error(
        "cannot convert to {desired:?}: this webhook converts AppServices between platform.example.com/v1alpha1 and v1beta1"
    )]
    UnknownVersion { desired: String },
    #[error("converting object {index} ({namespace}/{name}) to {api_version}: {error}")]
    Object {
        index: usize,
        namespace: String,
        name: String,
        api_version: &'static str,
        error: conversion::ConversionError,
    },
}

#[derive(Deserialize)]
struct Request {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(default)]
    objects: Vec<Value>,
}

/// The answer: a ConversionReview with a response.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: Response,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub converted_objects: Vec<Value>,
    pub result: ResultStatus,
}

/// `metav1.Status`, as much of it as a ConversionReview result uses.
#[derive(Debug, Serialize)]
pub struct ResultStatus {
    pub status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ReviewResponse {
    /// Whether every object was converted.
    pub fn succeeded(&self) -> bool {
        self.response.result.status == "Success"
    }

    fn new(uid: String, result: Result<Vec<Value>, ConversionFailure>) -> Self {
        let (converted_objects, result) = match result {
            Ok(objects) => (
                objects,
                ResultStatus {
                    status: "Success",
                    message: String::new(),
                },
            ),
            Err(failure) => (
                Vec::new(),
                ResultStatus {
                    status: "Failure",
                    message: failure.to_string(),
                },
            ),
        };
        ReviewResponse {
            api_version: REVIEW_API_VERSION,
            kind: "ConversionReview",
            response: Response {
                uid,
                converted_objects,
                result,
            },
        }
    }
}

/// Answers a ConversionReview body: every object converted, or a failure saying which
/// object could not be and why.
pub fn convert(body: &[u8]) -> Result<ReviewResponse, ReviewError> {
    let request: Request = decode_review(body, CONVERSION_REVIEW)?;
    let Some(desired) = Version::from_api_version(&request.desired_api_version) else {
        let failure = ConversionFailure::UnknownVersion {
            desired: request.desired_api_version,
        };
        return Ok(ReviewResponse::new(request.uid, Err(failure)));
    };
    let converted = request
        .objects
        .iter()
        .enumerate()
        .map(|(i, object)| {
            conversion::convert_object(object, desired).map_err(|error| {
                let metadata = |field: &str| {
                    object
                        .pointer(&format!("/metadata/{field}"))
                        .and_then(Value::as_str)
                        .map(ToOwned::to_owned)
                };
                ConversionFailure::Object {
                    index: i,
                    namespace: metadata("namespace").unwrap_or_default(),
                    name: metadata("name").unwrap_or_else(|| "<unnamed>".to_owned()),
                    api_version: desired.api_version(),
                    error,
                }
            })
        })
        .collect::<Result<Vec<_>, _>>();
    Ok(ReviewResponse::new(request.uid, converted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(desired: &str, objects: Vec<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects}
        }))
        .unwrap()
    }

    fn alpha(name: &str, port: i64) -> Value {
        json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
               "metadata": {"name": name, "namespace": "shop", "uid": "x"},
               "spec": {"image": "nginx:1.27", "port": port}})
    }

    #[test]
    fn converts_every_object() {
        let answer = convert(&review(
            "platform.example.com/v1beta1",
            vec![alpha("a", 80), alpha("b", 81)],
        ))
        .unwrap();
        assert!(answer.succeeded());
        let value = serde_json::to_value(&answer).unwrap();
        assert_eq!(value["response"]["uid"], "u-1");
        assert_eq!(value["response"]["result"], json!({"status": "Success"}));
        let objects = value["response"]["convertedObjects"].as_array().unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[1]["spec"]["ports"][0]["port"], 81);
        assert_eq!(objects[1]["apiVersion"], "platform.example.com/v1beta1");
    }

    #[test]
    fn bad_objects_and_versions_fail_the_review_with_a_message() {
        let answer = convert(&review(
            "platform.example.com/v1beta1",
            vec![
                alpha("a", 80),
                json!({"apiVersion": "platform.example.com/v1alpha1",
                "kind": "AppService", "metadata": {"name": "b", "namespace": "shop"},
                "spec": {"image": 7}}),
            ],
        ))
        .unwrap();
        assert!(!answer.succeeded());
        assert!(answer.response.converted_objects.is_empty());
        assert!(
            answer
                .response
                .result
                .message
                .starts_with("converting object 1 (shop/b) to platform.example.com/v1beta1: object is not a valid v1alpha1 AppService: spec.image"),
            "{}",
            answer.response.result.message
        );
        let answer = convert(&review("platform.example.com/v2", vec![alpha("a", 80)])).unwrap();
        assert!(!answer.succeeded());
        assert!(
            answer
                .response
                .result
                .message
                .contains("\"platform.example.com/v2\"")
        );
        let answer = convert(&review(
            "platform.example.com/v1beta1",
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap"})],
        ))
        .unwrap();
        assert!(!answer.succeeded());
    }
}
