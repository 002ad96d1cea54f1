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

use std::fmt::Display;

use common::conversion::Version;
use common::names::GROUP;
use common::validation::{ErrorType, FieldErrors};
use common::{AppService, defaults, v1alpha1};
use json_patch::{Patch, PatchOperation};
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{Status, TypeMeta};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::metrics::{self, Decision};
use crate::policy::{PolicySet, Violation};
use crate::review::{self, App, Envelope, Object, ObjectError};

pub use crate::review::Request;

/// The only AdmissionReview version the API server still sends.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// Kind of the resource this webhook admits, in either version (`v1alpha1`, `v1beta1`):
/// the API server sends the version the client wrote.
pub const KIND: &str = "AppService";

/// A request body that is not a usable AdmissionReview: answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not a valid AdmissionReview: {0}")]
    Decode(String),
    #[error(
        "unsupported AdmissionReview {api_version:?} kind {kind:?}: expected {REVIEW_API_VERSION} AdmissionReview"
    )]
    Version { api_version: String, kind: String },
    #[error("AdmissionReview has no request")]
    MissingRequest,
}

/// Parses an AdmissionReview body once, reporting the JSON path of a type error. The
/// request borrows `object` and `oldObject` from `body`.
pub fn decode_review(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    // serde's derived structs also accept a JSON array; an AdmissionReview is an object.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ReviewError::Decode(
            "expected a JSON object (an AdmissionReview)".to_owned(),
        ));
    }
    // Path tracking costs on every request; only a body that fails pays for it.
    let review: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(plain) => {
            // The tracked pass does not check for trailing characters; keep the plain
            // error for that case.
            let de = &mut serde_json::Deserializer::from_slice(body);
            let err = serde_path_to_error::deserialize::<_, Envelope<'_>>(de)
                .err()
                .map_or_else(|| plain.to_string(), |e| describe(&e));
            return Err(ReviewError::Decode(err));
        }
    };
    if review.api_version != REVIEW_API_VERSION || review.kind != "AdmissionReview" {
        return Err(ReviewError::Version {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review.request.ok_or(ReviewError::MissingRequest)
}

/// Formats a path-carrying serde error as `path: error` (no path for the root).
fn describe<E: Display>(err: &serde_path_to_error::Error<E>) -> String {
    let path = err.path().to_string();
    if path == "." {
        err.inner().to_string()
    } else {
        format!("{path}: {}", err.inner())
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

/// A denial of the review in `body` with `message` (HTTP 500 in the status), when the
/// body is a review at all.
pub fn denied(body: &[u8], message: &str) -> Option<AdmissionResponse> {
    let req = decode_review(body).ok()?;
    let mut response = allow(&req);
    response.allowed = false;
    response.result = Status::failure(message, "InternalError").with_code(500);
    Some(response)
}

/// What a review is about, once it is known to concern an AppService write.
enum Subject {
    /// CREATE or UPDATE of the AppService itself, in this version.
    Write(Version),
    /// Anything we let through untouched (DELETE, CONNECT, a subresource).
    PassThrough,
}

/// Checks the kind and operation; `Err` is the response to send as is.
fn subject(req: &Request<'_>) -> Result<Subject, Box<AdmissionResponse>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(Subject::PassThrough);
    }
    // `/status` and `/scale` writes are checked by the CRD schema; their kind is not
    // AppService (scale is autoscaling/v1 Scale), so they must not be refused here.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return Ok(Subject::PassThrough);
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
    let mut response = allow(req);
    response.allowed = false;
    response.result = Status::failure(&message, "BadRequest").with_code(400);
    Box::new(response)
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
    let mut response = allow(req);
    response.allowed = false;
    response.result = denial(&req.name, errors, &[]);
    Box::new(response)
}

/// `/mutate`: the JSON patch that applies `common`'s defaults, or no patch at all when the
/// object is already defaulted.
pub fn mutate(req: &Request<'_>) -> AdmissionResponse {
    let version = match subject(req) {
        Err(response) => return *response,
        Ok(Subject::PassThrough) => return allow(req),
        Ok(Subject::Write(version)) => version,
    };
    let object = match decode(req, req.object, "object", version) {
        Ok(object) => object,
        Err(response) => return *response,
    };
    let patch = match &object.app {
        App::V1alpha1(app) => defaults_patch_v1alpha1(app),
        App::V1beta1(app) => defaults_patch(app),
    };
    let patch = match patch {
        Ok(patch) => patch,
        Err(message) => {
            tracing::error!(%message, "defaults patch does not apply to the incoming object");
            let mut response = allow(req);
            response.allowed = false;
            response.result = Status::failure(&message, "InternalError").with_code(500);
            return response;
        }
    };
    let response = allow(req);
    if patch.0.is_empty() {
        return response;
    }
    match response.with_patch(patch) {
        Ok(response) => response,
        Err(e) => {
            let mut response = allow(req);
            response.allowed = false;
            response.result = Status::failure(&e.to_string(), "InternalError").with_code(500);
            response
        }
    }
}

/// The patch from `app` (as decoded by [`review::decode_object`]) to its defaulted form.
///
/// The diff is taken between the typed object and the typed, defaulted object, so both
/// sides went through the same serialization: a field the user wrote in an equivalent
/// form appears identically on both sides and yields no operation, and fields the types
/// do not hold are never touched. The decoded metadata keeps whether `labels` exists, so
/// a label lands in the existing map or brings a new one. Defaulting only fills absent
/// fields, so only `add` operations are allowed; anything else is an internal error.
pub fn defaults_patch(app: &AppService) -> Result<Patch, String> {
    let mut defaulted = app.clone();
    defaults::default_object(&mut defaulted);
    add_only_patch(app, &defaulted)
}

/// [`defaults_patch`] for a `v1alpha1` object: that version's defaults, in its shape.
pub fn defaults_patch_v1alpha1(app: &v1alpha1::AppService) -> Result<Patch, String> {
    let mut defaulted = app.clone();
    defaults::default_v1alpha1_object(&mut defaulted);
    add_only_patch(app, &defaulted)
}

fn add_only_patch<T: serde::Serialize + PartialEq>(
    app: &T,
    defaulted: &T,
) -> Result<Patch, String> {
    if defaulted == app {
        return Ok(Patch(Vec::new()));
    }
    let before = serde_json::to_value(app).map_err(|e| e.to_string())?;
    let after = serde_json::to_value(defaulted).map_err(|e| e.to_string())?;
    let patch = json_patch::diff(&before, &after);
    if let Some(op) = patch
        .0
        .iter()
        .find(|op| !matches!(op, PatchOperation::Add(_)))
    {
        return Err(format!("defaulting produced a non-add operation: {op}"));
    }
    Ok(patch)
}

/// `/validate`: every field error of `common::validation` and every policy violation in
/// one denial, with warnings in both outcomes. `namespace_object` is the namespace's
/// metadata for policies that use `namespaceObject` (None without `--namespace-labels`).
pub fn validate(
    req: &Request<'_>,
    policies: &PolicySet,
    namespace_object: Option<Value>,
) -> AdmissionResponse {
    let version = match subject(req) {
        Err(response) => return *response,
        Ok(Subject::PassThrough) => return allow(req),
        Ok(Subject::Write(version)) => version,
    };
    let object = match decode(req, req.object, "object", version) {
        Ok(object) => object,
        Err(response) => return *response,
    };
    let mut warnings = Vec::new();
    let old = if matches!(req.operation, Operation::Update) {
        let Some(raw_old) = req.old_object else {
            // Without it the update rules (immutable fields) cannot be checked.
            return *bad_request(
                req,
                "oldObject is missing from the UPDATE request".to_owned(),
            );
        };
        match review::decode_spec_only(raw_old, version) {
            Ok(old) => Some(old),
            Err(e) => {
                // Refusing would block every update of an object stored before a schema
                // change, including the fix; the API server's CEL transition rules still
                // guard immutable fields.
                warnings.push(format!(
                    "the stored object is not a valid {KIND} ({e}); update rules were not checked"
                ));
                None
            }
        }
    } else {
        None
    };
    let old = old.map(|old| old.app);
    let report = match (&object.app, old) {
        (App::V1alpha1(new), Some(App::V1alpha1(old))) => {
            common::validation::validate_v1alpha1_report(new, Some(&old))
        }
        (App::V1alpha1(new), _) => common::validation::validate_v1alpha1_report(new, None),
        (App::V1beta1(new), Some(App::V1beta1(old))) => {
            common::validation::validate_report(new, Some(&old))
        }
        (App::V1beta1(new), _) => common::validation::validate_report(new, None),
    };
    warnings.extend(report.warnings);
    let violations = if policies.is_empty() {
        Vec::new()
    } else {
        let Some(raw) = req.object else {
            return allow(req);
        };
        let old_raw = req
            .old_object
            .filter(|_| matches!(req.operation, Operation::Update));
        policies.evaluate_raw(
            raw,
            old_raw,
            &req.to_cel_request(),
            namespace_object.as_ref(),
        )
    };

    let mut response = allow(req);
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    if report.errors.is_empty() && violations.is_empty() {
        return response;
    }
    response.allowed = false;
    let name = object.app.name().unwrap_or_default();
    response.result = denial(name, &report.errors, &violations);
    response
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
    use super::*;
    use serde_json::json;

    /// A decoded review; the body is leaked so the request can borrow it for the test.
    fn decoded(body: Vec<u8>) -> Request<'static> {
        decode_review(Box::leak(body.into_boxed_slice())).unwrap()
    }

    fn review(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
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

    fn app(spec: Value) -> Value {
        json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "AppService",
            "metadata": {"name": "checkout", "namespace": "shop"},
            "spec": spec
        })
    }

    fn patch_of(response: &AdmissionResponse) -> Value {
        serde_json::from_slice(response.patch.as_deref().unwrap_or(b"[]")).unwrap()
    }

    #[test]
    fn defaults_are_added_and_nothing_else() {
        let object = json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "AppService",
            "metadata": {"name": "checkout", "namespace": "shop", "labels": {"team": "payments"},
                         "creationTimestamp": null, "futureMetadataField": {"x": 1}},
            "spec": {"image": "nginx:1.27", "futureField": [1, 2], "resources": {"limits": {"cpu": "1000m"}},
                     "env": [], "database": {"class": "x"}},
            "status": {"unknownStatus": true}
        });
        let req = decoded(review("CREATE", object.clone(), None));
        let response = mutate(&req);
        assert!(response.allowed);
        let mut ops: Vec<Value> = serde_json::from_value(patch_of(&response)).unwrap();
        ops.sort_by_key(|op| op["path"].as_str().unwrap_or_default().to_owned());
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/metadata/labels/app.kubernetes.io~1name", "value": "checkout"}),
                json!({"op": "add", "path": "/spec/port", "value": 8080}),
                json!({"op": "add", "path": "/spec/replicas", "value": 1}),
            ]
        );
        // Applying it keeps every unknown and equivalently-written field.
        let mut patched = object.clone();
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<Patch>(patch_of(&response)).unwrap(),
        )
        .unwrap();
        assert_eq!(patched["spec"]["futureField"], json!([1, 2]));
        assert_eq!(patched["spec"]["resources"]["limits"]["cpu"], "1000m");
        assert_eq!(patched["spec"]["env"], json!([]));
        assert_eq!(patched["spec"]["database"], json!({"class": "x"}));
        assert_eq!(patched["metadata"]["futureMetadataField"], json!({"x": 1}));
        assert_eq!(patched["metadata"]["labels"]["team"], "payments");
    }

    #[test]
    fn defaulted_object_gets_no_patch() {
        let object = app(json!({"image": "nginx:1.27"}));
        let req = decoded(review("CREATE", object.clone(), None));
        let first = mutate(&req);
        let mut patched = object;
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<Patch>(patch_of(&first)).unwrap(),
        )
        .unwrap();
        let again = mutate(&decoded(review("CREATE", patched, None)));
        assert!(again.allowed);
        assert_eq!(again.patch, None, "second pass must not patch");
    }

    #[test]
    fn labels_absent_or_null_get_a_whole_map() {
        for labels in [None, Some(Value::Null)] {
            let mut object = app(json!({"image": "nginx:1.27", "replicas": 2, "port": 80}));
            if let Some(labels) = labels {
                object["metadata"]["labels"] = labels;
            }
            let response = mutate(&decoded(review("UPDATE", object.clone(), Some(object))));
            assert_eq!(
                patch_of(&response),
                json!([{"op": "add", "path": "/metadata/labels", "value": {"app.kubernetes.io/name": "checkout"}}])
            );
        }
    }

    #[test]
    fn user_name_label_and_generate_name_are_respected() {
        let mut object = app(json!({"image": "nginx:1.27", "replicas": 0, "port": 80}));
        object["metadata"]["labels"] = json!({"app.kubernetes.io/name": "shop"});
        assert_eq!(mutate(&decoded(review("CREATE", object, None))).patch, None);

        let generated = json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "metadata": {"generateName": "checkout-"}, "spec": {"image": "nginx:1.27"}});
        let response = mutate(&decoded(review("CREATE", generated, None)));
        let paths: Vec<String> = patch_of(&response)
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["path"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(paths.len(), 2);
        assert!(paths.iter().all(|p| p.starts_with("/spec/")), "{paths:?}");
    }

    #[test]
    fn valid_object_is_allowed_with_warnings() {
        let req = decoded(review("CREATE", app(json!({"image": "nginx"})), None));
        let response = validate(&req, &PolicySet::default(), None);
        assert!(response.allowed);
        let warnings = response.warnings.unwrap_or_default();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("no tag"), "{warnings:?}");

        let pinned = decoded(review("CREATE", app(json!({"image": "nginx:1.27"})), None));
        assert_eq!(
            validate(&pinned, &PolicySet::default(), None).warnings,
            None
        );
    }

    #[test]
    fn every_field_error_in_one_denial() {
        let object = app(json!({
            "image": "nginx:latest", "replicas": 5000, "port": 70000,
            "env": [{"name": "1BAD", "value": "x"}, {"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            "database": {"enabled": true}
        }));
        let response = validate(
            &decoded(review("CREATE", object, None)),
            &PolicySet::default(),
            None,
        );
        assert!(!response.allowed);
        assert_eq!(response.result.code, 422);
        let message = &response.result.message;
        for expected in [
            "spec.replicas: Invalid value: 5000: must be between 0 and 1000",
            "spec.port: Invalid value: 70000: must be between 1 and 65535",
            "spec.env[0].name: Invalid value: \"1BAD\"",
            "spec.env[2].name: Duplicate value: \"A\"",
            "spec.database.class: Required value",
        ] {
            assert!(
                message.contains(expected),
                "{expected:?} missing from {message}"
            );
        }
        assert!(
            message.starts_with('[') && message.ends_with(']'),
            "{message}"
        );
        let causes = response
            .result
            .details
            .map(|d| d.causes)
            .unwrap_or_default();
        assert_eq!(causes.len(), 5);
        assert_eq!(causes[0].field, "spec.replicas");
        assert!(
            causes[0].message.starts_with("Invalid value: "),
            "{}",
            causes[0].message
        );
        // Warnings travel with a denial too.
        assert!(response.warnings.unwrap_or_default()[0].contains(":latest"));
    }

    #[test]
    fn update_rules_use_the_old_object() {
        let old =
            app(json!({"image": "nginx:1.27", "database": {"enabled": true, "class": "small"}}));
        let new =
            app(json!({"image": "nginx:1.27", "database": {"enabled": true, "class": "large"}}));
        let response = validate(
            &decoded(review("UPDATE", new.clone(), Some(old.clone()))),
            &PolicySet::default(),
            None,
        );
        assert!(!response.allowed);
        assert!(
            response
                .result
                .message
                .contains("spec.database.class: Invalid value: \"large\": field is immutable"),
            "{}",
            response.result.message
        );
        // The same object on CREATE is fine.
        assert!(
            validate(
                &decoded(review("CREATE", new, None)),
                &PolicySet::default(),
                None
            )
            .allowed
        );
        // An undecodable stored object does not block the update.
        let broken_old = app(json!({"image": 7}));
        let response = validate(
            &decoded(review("UPDATE", old, Some(broken_old))),
            &PolicySet::default(),
            None,
        );
        assert!(response.allowed);
        assert!(response.warnings.unwrap_or_default()[0].contains("update rules were not checked"));
    }

    #[test]
    fn policies_deny_after_field_validation() {
        let set = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: registry, expression: \"object.spec.image.startsWith('registry.example.com/')\", message: use the company registry}\n",
        )
        .unwrap();
        let ok = app(json!({"image": "registry.example.com/checkout:v1"}));
        assert!(validate(&decoded(review("CREATE", ok, None)), &set, None).allowed);
        let bad = app(json!({"image": "docker.io/checkout:v1", "port": 0}));
        let response = validate(&decoded(review("CREATE", bad, None)), &set, None);
        assert!(!response.allowed);
        assert_eq!(
            response.result.message,
            "spec.port: Invalid value: 0: must be between 1 and 65535; policy \"registry\": use the company registry"
        );
    }

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
    fn update_without_old_object_is_refused() {
        let object =
            app(json!({"image": "nginx:1.27", "database": {"enabled": true, "class": "large"}}));
        let response = validate(
            &decoded(review("UPDATE", object, None)),
            &PolicySet::default(),
            None,
        );
        assert!(!response.allowed);
        assert_eq!(response.result.code, 400);
        assert_eq!(
            response.result.message,
            "oldObject is missing from the UPDATE request"
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

    #[test]
    fn malformed_reviews() {
        assert!(matches!(decode_review(b"{"), Err(ReviewError::Decode(_))));
        assert!(matches!(decode_review(b"[]"), Err(ReviewError::Decode(_))));
        let trailing = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"} x"#;
        let err = decode_review(trailing).unwrap_err().to_string();
        assert!(err.contains("trailing characters"), "{err}");
        let err = decode_review(
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":1}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("request.uid"), "{err}");
        assert!(matches!(
            decode_review(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#),
            Err(ReviewError::Version { .. })
        ));
        assert!(matches!(
            decode_review(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
            Err(ReviewError::MissingRequest)
        ));
    }
}
