//! `/convert`: the CRD conversion webhook. A ConversionReview (`apiextensions.k8s.io/v1`)
//! carries objects in one version of AppService and the version the API server wants;
//! each object is converted by `common::conversion` (pure, lossless both ways).
//!
//! Memory: a ConversionReview carries a whole page of a list (thousands of objects), so
//! the objects are not decoded at once. The request keeps each object as its raw JSON
//! borrowed from the body; one object at a time is decoded, converted and appended to
//! the answer's array as JSON text. The cost is the body, the converted objects' text,
//! and one object's tree, instead of a tree of every object (about ten times the body).
//!
//! A body that is not a ConversionReview is a [`ReviewError`] (HTTP 400); a
//! review that asks for an unknown version, or holds an object that cannot be converted,
//! is answered with `result.status: Failure` and a message naming the object, which the
//! API server passes on to its client. Nothing here panics on input.

use common::conversion::{self, Version};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

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
    #[error("object {index} is not JSON this webhook can handle: {error}")]
    Json { index: usize, error: String },
}

#[derive(Deserialize)]
struct Request<'a> {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    /// Each object's JSON text, borrowed from the body; decoded one at a time.
    #[serde(default, borrow)]
    objects: Vec<&'a RawValue>,
}

/// The answer: a ConversionReview with a response.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: Response,
    /// On success, this whole answer as JSON, written while converting ([`convert_all`]):
    /// the converted objects exist once, as the text that is sent.
    #[serde(skip)]
    encoded: Option<Vec<u8>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub uid: String,
    /// How many objects were converted (they are in the encoded answer only).
    #[serde(skip)]
    pub converted_count: usize,
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
    /// The answer as JSON: on success the text written while converting, else the
    /// failure encoded now.
    pub fn to_json(self) -> serde_json::Result<Vec<u8>> {
        match self.encoded {
            Some(encoded) => Ok(encoded),
            None => serde_json::to_vec(&self),
        }
    }

    /// Whether every object was converted.
    pub fn succeeded(&self) -> bool {
        self.response.result.status == "Success"
    }

    fn new(uid: String, result: Result<(Vec<u8>, usize), ConversionFailure>) -> Self {
        let (encoded, converted_count, result) = match result {
            Ok((encoded, count)) => (
                Some(encoded),
                count,
                ResultStatus {
                    status: "Success",
                    message: String::new(),
                },
            ),
            Err(failure) => (
                None,
                0,
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
                converted_count,
                result,
            },
            encoded,
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
    let converted = convert_all(&request.uid, &request.objects, desired, body.len());
    Ok(ReviewResponse::new(request.uid, converted))
}

/// Writes the successful answer: the ConversionReview around the converted objects,
/// each appended as it is converted, into one buffer sized for about the body (pages are
/// only used as they are written).
fn convert_all(
    uid: &str,
    objects: &[&RawValue],
    desired: Version,
    body_len: usize,
) -> Result<(Vec<u8>, usize), ConversionFailure> {
    let json = |index: usize| {
        move |error: serde_json::Error| ConversionFailure::Json {
            index,
            error: error.to_string(),
        }
    };
    let mut out = Vec::with_capacity(body_len + body_len / 8 + 256);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, REVIEW_API_VERSION).map_err(json(0))?;
    out.extend_from_slice(b",\"kind\":\"ConversionReview\",\"response\":{\"uid\":");
    serde_json::to_writer(&mut out, uid).map_err(json(0))?;
    out.extend_from_slice(b",\"convertedObjects\":[");
    for (index, raw) in objects.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        let converted = convert_one(index, raw, desired)?;
        serde_json::to_writer(&mut out, &converted).map_err(json(index))?;
    }
    out.extend_from_slice(b"],\"result\":{\"status\":\"Success\"}}}");
    Ok((out, objects.len()))
}

/// Decodes and converts one object; only this object's trees are alive.
fn convert_one(index: usize, raw: &RawValue, desired: Version) -> Result<Value, ConversionFailure> {
    let failure = |object: &Value, error| {
        let metadata = |field: &str| {
            object
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                .map(ToOwned::to_owned)
        };
        ConversionFailure::Object {
            index,
            namespace: metadata("namespace").unwrap_or_default(),
            name: metadata("name").unwrap_or_else(|| "<unnamed>".to_owned()),
            api_version: desired.api_version(),
            error,
        }
    };
    // The body was valid JSON, so is each of its values; decoding can only fail past
    // serde_json's limits (nesting), which is this object's failure.
    let object: Value =
        serde_json::from_str(raw.get()).map_err(|error| ConversionFailure::Json {
            index,
            error: error.to_string(),
        })?;
    conversion::convert_object(&object, desired).map_err(|e| failure(&object, e))
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
        let value: Value = serde_json::from_slice(&answer.to_json().unwrap()).unwrap();
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
        assert_eq!(answer.response.converted_count, 0);
        assert!(
            answer
                .response
                .result
                .message
                .starts_with("converting object 1 (shop/b) to platform.example.com/v1beta1: object is not a valid v1alpha1 AppService: spec.image"),
            "{}",
            answer.response.result.message
        );
        let value: Value = serde_json::from_slice(&answer.to_json().unwrap()).unwrap();
        assert!(value["response"].get("convertedObjects").is_none());
        assert_eq!(value["response"]["result"]["status"], "Failure");
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
