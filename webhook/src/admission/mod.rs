//! Admission decisions: `/mutate` applies `common`'s defaults as a JSON patch, `/validate`
//! runs `common`'s validation and then the CEL policies. Both are pure functions of the
//! decoded review (and, for `/validate`, of what [`Judge`] holds), so they are tested
//! without a server.
//!
//! A body is decoded once ([`decode_review`]) into a [`Review`]: the request, and what it
//! is about ([`Subject`]), with the Scales of a scale write already read (the handler
//! needs their resourceVersion before judging: [`Review::scale_target`]). The objects of
//! an AppService write stay unread until the endpoint judging them decodes each once
//! ([`crate::review`]); nothing here reads JSON, so nothing parses a body or an object
//! twice.
//!
//! Bad input never panics and never becomes a 500: a body that is not an AdmissionReview
//! is a [`ReviewError`] (HTTP 400); a review of something that is not a well-formed
//! AppService is answered `allowed: false` with code 400 and the reason; an object over
//! the size bounds of [`crate::review`] is denied with 422 naming each bound.
//!
//! Every rule is judged on one form of the object, the hub version (`v1beta1`), for
//! `object` and `oldObject` alike, whatever version the client wrote
//! ([`crate::review::hub`]); a write of the scale subresource is judged on the cached
//! AppService with the new replicas ([`scale`], [`crate::appservices`]); an UPDATE
//! that asks for nothing new is not judged again ([`ratchet`]); a host name another
//! AppService holds is refused ([`hostnames`]).
//!
//! This module decodes the review and decides what it is about; [`mutate`],
//! [`validate`] and [`scale`] (one submodule each) answer it.

#[cfg(test)]
mod fixtures;
pub mod hostnames;
mod mutate;
pub mod ratchet;
mod scale;
mod validate;

pub use mutate::{DefaultsError, defaults_patch, defaults_patch_v1alpha1, mutate};
pub use validate::{Judge, validate};

use bytes::Bytes;
use common::conversion::Version;
use common::names::GROUP;
use common::validation::{ErrorType, FieldErrors};
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{Status, TypeMeta};

use crate::appservices::ScaleTarget;
use crate::metrics::{self, Decision};
use crate::policy::Violation;
use crate::review::{self, Json, ObjectError, Objects, ReviewKind};

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

/// An AdmissionReview, decoded once: the request, and what it is about.
#[derive(Debug)]
pub struct Review {
    pub request: Request,
    subject: Subject,
}

/// Parses an AdmissionReview body once, reporting the JSON path of a type error, and
/// decides what it is about. The objects share `body`; nothing of it is copied.
pub fn decode_review(body: &Bytes) -> Result<Review, ReviewError> {
    let (request, objects) = review::decode_request(body, ADMISSION_REVIEW)?;
    let subject = Subject::of(&request, objects);
    Ok(Review { request, subject })
}

impl Review {
    /// The AppService a scale write is judged on, when it asks for new replicas: the
    /// handler lets the cache catch up with it first ([`crate::appservices`]).
    pub fn scale_target(&self) -> Option<ScaleTarget> {
        let Subject::Scale(Ok(write)) = &self.subject else {
            return None;
        };
        let namespace = self.request.namespace.clone()?;
        let resource_version = write.resource_version.clone()?;
        (write.replicas != write.old_replicas && !self.request.name.is_empty()).then(|| {
            ScaleTarget {
                namespace,
                name: self.request.name.clone(),
                resource_version,
            }
        })
    }

    /// A refusal of this review for a fault of the webhook (HTTP 500 in the status), such
    /// as policies that did not finish in time.
    pub fn denied(&self, message: &str) -> AdmissionResponse {
        internal_error(&self.request, message)
    }
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
fn allow(req: &Request) -> AdmissionResponse {
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
fn deny(req: &Request, status: Status) -> AdmissionResponse {
    let mut response = allow(req);
    response.allowed = false;
    response.result = status;
    response
}

/// A refusal of `req` for a fault of the webhook (HTTP 500 in the status).
fn internal_error(req: &Request, message: &str) -> AdmissionResponse {
    deny(
        req,
        Status::failure(message, "InternalError").with_code(500),
    )
}

/// What a review is about.
#[derive(Debug)]
enum Subject {
    /// CREATE or UPDATE of the AppService itself, in this version; its objects are
    /// decoded by the endpoint that judges them, each once.
    Write { version: Version, objects: Objects },
    /// UPDATE of an AppService's scale subresource: its Scales, read; `Err` is why they
    /// could not be (answered 400).
    Scale(Result<scale::ScaleWrite, String>),
    /// Anything we let through untouched (DELETE, CONNECT, `/status`, other subresources).
    PassThrough,
    /// Not a write this webhook admits (answered 400 with this message).
    Refused(String),
}

/// The group and resource of a scale review: `autoscaling/v1` Scale of `appservices`.
const SCALE_GROUP: &str = "autoscaling";
const SCALE_KIND: &str = "Scale";
const RESOURCE: &str = "appservices";

impl Subject {
    /// Checks the kind and operation; the Scales of a scale write are read here.
    fn of(req: &Request, objects: Objects) -> Subject {
        if !matches!(req.operation, Operation::Create | Operation::Update) {
            return Subject::PassThrough;
        }
        match req.sub_resource.as_deref() {
            None | Some("") => {}
            // A Scale of an AppService: its replicas are judged with the AppService's rules.
            // The API server sends UPDATE for every scale write (a patch included).
            Some("scale")
                if req.resource.group == GROUP
                    && req.resource.resource == RESOURCE
                    && req.kind.group == SCALE_GROUP
                    && req.kind.kind == SCALE_KIND =>
            {
                return match req.operation {
                    Operation::Update => Subject::Scale(scale::ScaleWrite::of(objects)),
                    _ => Subject::PassThrough,
                };
            }
            // `/status` is the controller's report (the configurations do not send it);
            // nothing else of an AppService is a write of what it asks for.
            Some(_) => return Subject::PassThrough,
        }
        let kind = &req.kind;
        match Version::from_version(&kind.version) {
            Some(version) if kind.group == GROUP && kind.kind == KIND => {
                Subject::Write { version, objects }
            }
            _ => {
                let got = if kind.group.is_empty() {
                    format!("{}/{}", kind.version, kind.kind)
                } else {
                    format!("{}/{} {}", kind.group, kind.version, kind.kind)
                };
                Subject::Refused(format!(
                    "this webhook admits {GROUP}/v1alpha1 and {GROUP}/v1beta1 {KIND} only, got {got}"
                ))
            }
        }
    }
}

/// A well-formed review whose content cannot be admitted as is: `allowed: false`, 400.
fn bad_request(req: &Request, message: String) -> Box<AdmissionResponse> {
    Box::new(deny(
        req,
        Status::failure(&message, "BadRequest").with_code(400),
    ))
}

/// The response to an object (`field`: "object" or "oldObject") that cannot be decoded.
fn object_error(
    req: &Request,
    field: &str,
    version: Version,
    error: ObjectError,
) -> Box<AdmissionResponse> {
    match error {
        ObjectError::TooLarge(errors) => too_large(req, &errors),
        ObjectError::Invalid(e) => bad_request(
            req,
            format!("{field} is not a valid {} {KIND}: {e}", version.as_str()),
        ),
    }
}

/// The object (`field`) of a write, when the request has one.
fn present<'j>(
    req: &Request,
    json: Option<&'j Json>,
    field: &str,
) -> Result<&'j Json, Box<AdmissionResponse>> {
    json.ok_or_else(|| bad_request(req, format!("{field} is missing from the request")))
}

/// A denial of an object over a size bound, in the format of a validation failure.
fn too_large(req: &Request, errors: &FieldErrors) -> Box<AdmissionResponse> {
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
    use super::fixtures::{app, decoded, judge, review};
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
            for response in [mutate(&req), validate(&req, &judge(&set))] {
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
        for response in [mutate(&req), validate(&req, &judge(&PolicySet::default()))] {
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
            validate(&req, &judge(&PolicySet::default()))
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
                &judge(&PolicySet::default()),
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
