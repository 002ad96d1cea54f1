//! Admission decisions: `/mutate` applies `common`'s defaults as a JSON patch, `/validate`
//! runs `common`'s validation and then the CEL policies. Both are pure functions of the
//! review (and the active policy set), so they are tested without a server.
//!
//! Bad input never panics and never becomes a 500: a body that is not an AdmissionReview
//! is a [`ReviewError`] (HTTP 400); a review of something that is not a well-formed
//! AppService is answered `allowed: false` with code 400 and the reason; an object over
//! the size bounds of [`crate::review`] is denied with 422 naming each bound.
//!
//! The review is decoded once ([`crate::review`]); the generic JSON copy of the object
//! that CEL needs is made only when policies are active.
//!
//! Every rule is judged on one form of the object, the hub version (`v1beta1`), for
//! `object` and `oldObject` alike, whatever version the client wrote
//! ([`crate::review::hub`]); a write of the scale subresource is judged on the cached
//! AppService with the new replicas ([`scale`], [`crate::appservices`]); an UPDATE
//! that asks for nothing new is not judged again ([`ratchet`]).
//!
//! This module decodes the review and decides what it is about; [`mutate`],
//! [`validate`] and [`scale`] (one submodule each) answer it.

#[cfg(test)]
mod fixtures;
mod mutate;
pub mod ratchet;
mod scale;
mod validate;

pub use mutate::{DefaultsError, defaults_patch, defaults_patch_v1alpha1, mutate};
pub use validate::{validate, validate_with};

use common::conversion::Version;
use common::names::GROUP;
use common::validation::{ErrorType, FieldErrors};
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{Status, TypeMeta};
use serde_json::value::RawValue;

use crate::metrics::{self, Decision};
use crate::policy::Violation;
use crate::review::{self, Object, ObjectError, ReviewKind};

pub use crate::review::{Request, ReviewError};

/// The only AdmissionReview version the API server still sends.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// Kind of the resource this webhook admits, in either version (`v1alpha1`, `v1beta1`):
/// the API server sends the version the client wrote.
pub const KIND: &str = "AppService";

/// What `/mutate` and `/validate` accept.
pub const ADMISSION_REVIEW: ReviewKind = ReviewKind {
    kind: "AdmissionReview",
    api_version: REVIEW_API_VERSION,
};

/// Parses an AdmissionReview body once, reporting the JSON path of a type error. The
/// request borrows `object` and `oldObject` from `body`.
pub fn decode_review(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    review::decode_review(body, ADMISSION_REVIEW)
}

/// The metrics label of an operation.
pub fn operation_label(op: &Operation) -> metrics::Operation {
    match op {
        Operation::Create => metrics::Operation::Create,
        Operation::Update => metrics::Operation::Update,
        Operation::Delete => metrics::Operation::Delete,
        Operation::Connect => metrics::Operation::Connect,
    }
}

/// The decision a response carries, for metrics and logs.
pub fn decision(response: &AdmissionResponse) -> Decision {
    if response.allowed && response.patch.is_some() {
        Decision::Patched
    } else if response.allowed {
        Decision::Allowed
    } else {
        Decision::Denied
    }
}

/// An allowing response to `req`.
fn allow(req: &Request<'_>) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.types = TypeMeta {
        api_version: REVIEW_API_VERSION.to_owned(),
        kind: "AdmissionReview".to_owned(),
    };
    response.uid.clone_from(&req.uid);
    response.allowed = true;
    response.result = Status::default();
    response
}

/// A response to `req` refusing it with `status`.
fn deny(req: &Request<'_>, status: Status) -> AdmissionResponse {
    let mut response = allow(req);
    response.allowed = false;
    response.result = status;
    response
}

/// A refusal of `req` for a fault of the webhook (HTTP 500 in the status).
fn internal_error(req: &Request<'_>, message: &str) -> AdmissionResponse {
    deny(
        req,
        Status::failure(message, "InternalError").with_code(500),
    )
}

/// A denial of the review in `body` with `message` (HTTP 500 in the status), when the
/// body is a review at all.
pub fn denied(body: &[u8], message: &str) -> Option<AdmissionResponse> {
    let req = decode_review(body).ok()?;
    Some(internal_error(&req, message))
}

/// What a review is about, once it is known to concern an AppService write.
enum Subject {
    /// CREATE or UPDATE of the AppService itself, in this version.
    Write(Version),
    /// UPDATE of an AppService's scale subresource (the object is a Scale).
    Scale,
    /// Anything we let through untouched (DELETE, CONNECT, `/status`, other subresources).
    PassThrough,
}

/// The group and resource of a scale review: `autoscaling/v1` Scale of `appservices`.
const SCALE_GROUP: &str = "autoscaling";
const SCALE_KIND: &str = "Scale";
const RESOURCE: &str = "appservices";

/// Checks the kind and operation; `Err` is the response to send as is.
fn subject(req: &Request<'_>) -> Result<Subject, Box<AdmissionResponse>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(Subject::PassThrough);
    }
    match req.sub_resource.as_deref() {
        None | Some("") => {}
        // A Scale of an AppService: its replicas are judged with the AppService's rules.
        Some("scale")
            if req.resource.group == GROUP
                && req.resource.resource == RESOURCE
                && req.kind.group == SCALE_GROUP
                && req.kind.kind == SCALE_KIND =>
        {
            return Ok(Subject::Scale);
        }
        // `/status` is the controller's report (the configurations do not send it);
        // nothing else of an AppService is a write of what it asks for.
        Some(_) => return Ok(Subject::PassThrough),
    }
    let kind = &req.kind;
    let version = Version::from_version(&kind.version);
    match version {
        Some(version) if kind.group == GROUP && kind.kind == KIND => Ok(Subject::Write(version)),
        _ => {
            let got = if kind.group.is_empty() {
                format!("{}/{}", kind.version, kind.kind)
            } else {
                format!("{}/{} {}", kind.group, kind.version, kind.kind)
            };
            Err(bad_request(
                req,
                format!(
                    "this webhook admits {GROUP}/v1alpha1 and {GROUP}/v1beta1 {KIND} only, got {got}"
                ),
            ))
        }
    }
}

/// A well-formed review whose content cannot be admitted as is: `allowed: false`, 400.
fn bad_request(req: &Request<'_>, message: String) -> Box<AdmissionResponse> {
    Box::new(deny(
        req,
        Status::failure(&message, "BadRequest").with_code(400),
    ))
}

/// The version and the decoded object of an AppService CREATE or UPDATE; `Err` is the
/// response to send as is (anything else passes untouched).
fn written_object(req: &Request<'_>) -> Result<(Version, Object), Box<AdmissionResponse>> {
    match subject(req)? {
        // `/mutate` has nothing to default on a Scale: its replicas are always set.
        Subject::PassThrough | Subject::Scale => Err(Box::new(allow(req))),
        Subject::Write(version) => {
            decode(req, req.object, "object", version).map(|object| (version, object))
        }
    }
}

/// The object (`field`: "object" or "oldObject"), decoded; `Err` is the response to send.
fn decode(
    req: &Request<'_>,
    raw: Option<&RawValue>,
    field: &str,
    version: Version,
) -> Result<Object, Box<AdmissionResponse>> {
    let Some(raw) = raw else {
        return Err(bad_request(
            req,
            format!("{field} is missing from the request"),
        ));
    };
    review::decode_object(raw, version).map_err(|error| match error {
        ObjectError::TooLarge(errors) => too_large(req, &errors),
        ObjectError::Invalid(e) => bad_request(
            req,
            format!("{field} is not a valid {} {KIND}: {e}", version.as_str()),
        ),
    })
}

/// A denial of an object over a size bound, in the format of a validation failure.
fn too_large(req: &Request<'_>, errors: &FieldErrors) -> Box<AdmissionResponse> {
    Box::new(deny(req, denial(&req.name, errors, &[])))
}

/// The Status of a denial: the Kubernetes aggregate of field errors, then the policies,
/// with one cause per problem.
fn denial(name: &str, errors: &FieldErrors, violations: &[Violation]) -> Status {
    let mut parts = Vec::new();
    if !errors.is_empty() {
        parts.push(errors.to_string());
    }
    parts.extend(
        violations
            .iter()
            .map(|v| format!("policy {:?}: {}", v.policy, v.message)),
    );
    let message = parts.join("; ");
    let mut causes: Vec<StatusCause> = errors
        .iter()
        .map(|e| StatusCause {
            reason: e.error_type.reason().to_owned(),
            // kubectl prints `<field>: <message>`: the message must not repeat the field.
            message: e.body(),
            field: e.field.clone(),
        })
        .collect();
    causes.extend(violations.iter().map(|v| StatusCause {
        reason: ErrorType::Forbidden.reason().to_owned(),
        message: format!("policy {:?}: {}", v.policy, v.message),
        field: String::new(),
    }));
    Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(StatusDetails {
            name: name.to_owned(),
            group: GROUP.to_owned(),
            kind: KIND.to_owned(),
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        })
}

#[cfg(test)]
mod tests {
    use super::fixtures::{app, decoded, review};
    use super::*;
    use crate::policy::PolicySet;
    use serde_json::{Value, json};

    #[test]
    fn delete_connect_and_subresources_pass_untouched() {
        let object = app(json!({"image": "nginx"}));
        for op in ["DELETE", "CONNECT"] {
            let req = decoded(review(op, Value::Null, Some(object.clone())));
            let set = PolicySet::from_yaml(
                std::path::Path::new("p"),
                "policies:\n  - {name: never, expression: 'false', message: no}\n",
            )
            .unwrap();
            for response in [mutate(&req), validate(&req, &set, None)] {
                assert!(response.allowed);
                assert_eq!(response.patch, None);
                assert_eq!(response.warnings, None);
            }
        }
        let mut body: Value = serde_json::from_slice(&review(
            "UPDATE",
            json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 3}}),
            None,
        ))
        .unwrap();
        body["request"]["subResource"] = json!("scale");
        body["request"]["kind"] = json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
        let req = decoded(serde_json::to_vec(&body).unwrap());
        assert!(mutate(&req).allowed);
    }

    #[test]
    fn wrong_kind_and_bad_objects_are_clear_denials() {
        let mut body: Value = serde_json::from_slice(&review(
            "CREATE",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
            None,
        ))
        .unwrap();
        body["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        let req = decoded(serde_json::to_vec(&body).unwrap());
        for response in [mutate(&req), validate(&req, &PolicySet::default(), None)] {
            assert!(!response.allowed);
            assert_eq!(response.result.code, 400);
            assert_eq!(response.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
            assert!(
                response.result.message.contains("got v1/Pod"),
                "{}",
                response.result.message
            );
        }
        let req = decoded(review(
            "CREATE",
            app(json!({"image": "nginx", "replicas": "three"})),
            None,
        ));
        let response = mutate(&req);
        assert!(!response.allowed);
        assert!(
            response
                .result
                .message
                .contains("spec.replicas: invalid type: string \"three\""),
            "{}",
            response.result.message
        );
        let req = decoded(review("CREATE", Value::Null, None));
        assert!(
            validate(&req, &PolicySet::default(), None)
                .result
                .message
                .contains("object is missing")
        );
    }

    #[test]
    fn oversized_objects_are_denied_naming_the_limit() {
        let env: Vec<Value> = (0..30_000)
            .map(|i| json!({"name": format!("V{i}")}))
            .collect();
        let object = app(json!({"image": "nginx:1.27", "env": env}));
        for response in [
            mutate(&decoded(review("CREATE", object.clone(), None))),
            validate(
                &decoded(review("CREATE", object.clone(), None)),
                &PolicySet::default(),
                None,
            ),
        ] {
            assert!(!response.allowed);
            assert_eq!(response.result.code, 422);
            assert_eq!(
                response.result.message,
                "spec.env: Too many: 30000: must have at most 128 items"
            );
            let causes = response
                .result
                .details
                .map(|d| d.causes)
                .unwrap_or_default();
            assert_eq!(causes[0].field, "spec.env");
        }
    }
}
