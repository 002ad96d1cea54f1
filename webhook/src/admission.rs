//! Admission decisions: `/mutate` applies `common`'s defaults as a JSON patch, `/validate`
//! runs `common`'s validation and then the CEL policies. Both are pure functions of the
//! review (and the active policy set), so they are tested without a server.
//!
//! Bad input never panics and never becomes a 500: a body that is not an AdmissionReview
//! is a [`ReviewError`] (HTTP 400); a review of something that is not a well-formed
//! AppService is answered `allowed: false` with code 400 and the reason.

use std::fmt::Display;

use common::names::GROUP;
use common::validation::{ErrorType, FieldErrors};
use common::{AppService, defaults};
use json_patch::{Patch, PatchOperation};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use serde::Deserialize;
use serde_json::Value;

use crate::metrics::{self, Decision};
use crate::policy::{PolicySet, Violation};

/// The only AdmissionReview version the API server still sends.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// Kind and version of the resource this webhook admits.
pub const KIND: &str = "AppService";
pub const VERSION: &str = "v1alpha1";

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

/// Parses an AdmissionReview body, reporting the JSON path of a type error.
pub fn decode_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    // Path tracking costs on every request; only a body that fails pays for it.
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(plain) => {
            // The tracked pass does not check for trailing characters; keep the plain
            // error for that case.
            let de = &mut serde_json::Deserializer::from_slice(body);
            let err = serde_path_to_error::deserialize::<_, AdmissionReview<DynamicObject>>(de)
                .err()
                .map_or_else(|| plain.to_string(), |e| describe(&e));
            return Err(ReviewError::Decode(err));
        }
    };
    if review.types.api_version != REVIEW_API_VERSION || review.types.kind != "AdmissionReview" {
        return Err(ReviewError::Version {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    review.try_into().map_err(|_| ReviewError::MissingRequest)
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

/// What a review is about, once it is known to concern an AppService write.
enum Subject {
    /// CREATE or UPDATE of the AppService itself.
    Write,
    /// Anything we let through untouched (DELETE, CONNECT, a subresource).
    PassThrough,
}

/// Checks the kind and operation; `Err` is the response to send as is.
fn subject(req: &AdmissionRequest<DynamicObject>) -> Result<Subject, Box<AdmissionResponse>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(Subject::PassThrough);
    }
    // `/status` and `/scale` writes are checked by the CRD schema; their kind is not
    // AppService (scale is autoscaling/v1 Scale), so they must not be refused here.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return Ok(Subject::PassThrough);
    }
    let kind = &req.kind;
    if kind.group != GROUP || kind.kind != KIND || kind.version != VERSION {
        let got = if kind.group.is_empty() {
            format!("{}/{}", kind.version, kind.kind)
        } else {
            format!("{}/{} {}", kind.group, kind.version, kind.kind)
        };
        return Err(bad_request(
            req,
            format!("this webhook admits {GROUP}/{VERSION} {KIND} only, got {got}"),
        ));
    }
    Ok(Subject::Write)
}

/// A well-formed review whose content cannot be admitted as is: `allowed: false`, 400.
fn bad_request(req: &AdmissionRequest<DynamicObject>, message: String) -> Box<AdmissionResponse> {
    let mut response = AdmissionResponse::from(req);
    response.allowed = false;
    response.result = Status::failure(&message, "BadRequest").with_code(400);
    Box::new(response)
}

/// The object and its typed form; `Err` is the response to send.
fn decode_object(
    req: &AdmissionRequest<DynamicObject>,
    object: Option<&DynamicObject>,
    field: &str,
) -> Result<(Value, AppService), Box<AdmissionResponse>> {
    let Some(object) = object else {
        return Err(bad_request(
            req,
            format!("{field} is missing from the request"),
        ));
    };
    let raw = serde_json::to_value(object)
        .map_err(|e| bad_request(req, format!("{field} cannot be serialized: {e}")))?;
    let typed =
        typed(&raw).map_err(|e| bad_request(req, format!("{field} is not a valid {KIND}: {e}")))?;
    Ok((raw, typed))
}

fn typed(raw: &Value) -> Result<AppService, String> {
    AppService::deserialize(raw).map_err(|plain| {
        serde_path_to_error::deserialize::<_, AppService>(raw)
            .err()
            .map_or_else(|| plain.to_string(), |e| describe(&e))
    })
}

/// `/mutate`: the JSON patch that applies `common`'s defaults, or no patch at all when the
/// object is already defaulted.
pub fn mutate(req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    match subject(req) {
        Err(response) => return *response,
        Ok(Subject::PassThrough) => return AdmissionResponse::from(req),
        Ok(Subject::Write) => {}
    }
    let (raw, app) = match decode_object(req, req.object.as_ref(), "object") {
        Ok(decoded) => decoded,
        Err(response) => return *response,
    };
    let patch = match defaults_patch(&raw, &app) {
        Ok(patch) => patch,
        Err(message) => {
            tracing::error!(%message, "defaults patch does not apply to the incoming object");
            let mut response = AdmissionResponse::from(req);
            response.allowed = false;
            response.result = Status::failure(&message, "InternalError").with_code(500);
            return response;
        }
    };
    let response = AdmissionResponse::from(req);
    if patch.0.is_empty() {
        return response;
    }
    match response.with_patch(patch) {
        Ok(response) => response,
        Err(e) => {
            let mut response = AdmissionResponse::from(req);
            response.allowed = false;
            response.result = Status::failure(&e.to_string(), "InternalError").with_code(500);
            response
        }
    }
}

/// The patch from `raw` to its defaulted form.
///
/// The diff is taken between the typed object and the typed, defaulted object, so both
/// sides went through the same serialization: a field the user wrote in an equivalent
/// form, or a field the types do not know, appears identically on both sides and yields
/// no operation. Defaulting only fills absent fields, so the patch holds only `add`
/// operations; it is checked to apply to the object exactly as received.
pub fn defaults_patch(raw: &Value, app: &AppService) -> Result<Patch, String> {
    let before = serde_json::to_value(app).map_err(|e| e.to_string())?;
    let mut defaulted = app.clone();
    defaults::default_object(&mut defaulted);
    let after = serde_json::to_value(&defaulted).map_err(|e| e.to_string())?;
    let patch = json_patch::diff(&before, &after);
    if let Some(op) = patch
        .0
        .iter()
        .find(|op| !matches!(op, PatchOperation::Add(_)))
    {
        return Err(format!("defaulting produced a non-add operation: {op}"));
    }
    let mut check = raw.clone();
    json_patch::patch(&mut check, &patch).map_err(|e| e.to_string())?;
    Ok(patch)
}

/// `/validate`: every field error of `common::validation` and every policy violation in
/// one denial, with warnings in both outcomes. `namespace_object` is the namespace's
/// metadata for policies that use `namespaceObject` (None without `--namespace-labels`).
pub fn validate(
    req: &AdmissionRequest<DynamicObject>,
    policies: &PolicySet,
    namespace_object: Option<Value>,
) -> AdmissionResponse {
    match subject(req) {
        Err(response) => return *response,
        Ok(Subject::PassThrough) => return AdmissionResponse::from(req),
        Ok(Subject::Write) => {}
    }
    let (raw, app) = match decode_object(req, req.object.as_ref(), "object") {
        Ok(decoded) => decoded,
        Err(response) => return *response,
    };
    let mut warnings = Vec::new();
    let old = match (&req.operation, req.old_object.as_ref()) {
        (Operation::Update, Some(old)) => match serde_json::to_value(old) {
            Ok(old_raw) => {
                let old_typed = match typed(&old_raw) {
                    Ok(old_typed) => Some(old_typed),
                    Err(e) => {
                        // Refusing would block every update of an object stored before a
                        // schema change, including the fix; the API server's CEL
                        // transition rules still guard immutable fields.
                        warnings.push(format!(
                            "the stored object is not a valid {KIND} ({e}); update rules were not checked"
                        ));
                        None
                    }
                };
                Some((old_raw, old_typed))
            }
            Err(_) => None,
        },
        _ => None,
    };
    let report = common::validation::validate_report(
        &app,
        old.as_ref().and_then(|(_, typed)| typed.as_ref()),
    );
    warnings.extend(report.warnings);
    let violations = policies.evaluate(
        &raw,
        old.as_ref().map(|(raw, _)| raw),
        req.to_cel_request(),
        namespace_object,
    );

    let mut response = AdmissionResponse::from(req);
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    if report.errors.is_empty() && violations.is_empty() {
        return response;
    }
    response.allowed = false;
    response.result = denial(&app, &report.errors, &violations);
    response
}

/// The Status of a denial: the Kubernetes aggregate of field errors, then the policies,
/// with one cause per problem.
fn denial(app: &AppService, errors: &FieldErrors, violations: &[Violation]) -> Status {
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
            name: app.metadata.name.clone().unwrap_or_default(),
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
        let req = decode_review(&review("CREATE", object.clone(), None)).unwrap();
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
        let req = decode_review(&review("CREATE", object.clone(), None)).unwrap();
        let first = mutate(&req);
        let mut patched = object;
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<Patch>(patch_of(&first)).unwrap(),
        )
        .unwrap();
        let again = mutate(&decode_review(&review("CREATE", patched, None)).unwrap());
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
            let response =
                mutate(&decode_review(&review("UPDATE", object.clone(), Some(object))).unwrap());
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
        assert_eq!(
            mutate(&decode_review(&review("CREATE", object, None)).unwrap()).patch,
            None
        );

        let generated = json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "metadata": {"generateName": "checkout-"}, "spec": {"image": "nginx:1.27"}});
        let response = mutate(&decode_review(&review("CREATE", generated, None)).unwrap());
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
        let req = decode_review(&review("CREATE", app(json!({"image": "nginx"})), None)).unwrap();
        let response = validate(&req, &PolicySet::default(), None);
        assert!(response.allowed);
        let warnings = response.warnings.unwrap_or_default();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("no tag"), "{warnings:?}");

        let pinned =
            decode_review(&review("CREATE", app(json!({"image": "nginx:1.27"})), None)).unwrap();
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
            &decode_review(&review("CREATE", object, None)).unwrap(),
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
            &decode_review(&review("UPDATE", new.clone(), Some(old.clone()))).unwrap(),
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
                &decode_review(&review("CREATE", new, None)).unwrap(),
                &PolicySet::default(),
                None
            )
            .allowed
        );
        // An undecodable stored object does not block the update.
        let broken_old = app(json!({"image": 7}));
        let response = validate(
            &decode_review(&review("UPDATE", old, Some(broken_old))).unwrap(),
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
        assert!(
            validate(
                &decode_review(&review("CREATE", ok, None)).unwrap(),
                &set,
                None
            )
            .allowed
        );
        let bad = app(json!({"image": "docker.io/checkout:v1", "port": 0}));
        let response = validate(
            &decode_review(&review("CREATE", bad, None)).unwrap(),
            &set,
            None,
        );
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
            let req = decode_review(&review(op, Value::Null, Some(object.clone()))).unwrap();
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
        let req = decode_review(&serde_json::to_vec(&body).unwrap()).unwrap();
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
        let req = decode_review(&serde_json::to_vec(&body).unwrap()).unwrap();
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
        let req = decode_review(&review(
            "CREATE",
            app(json!({"image": "nginx", "replicas": "three"})),
            None,
        ))
        .unwrap();
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
        let req = decode_review(&review("CREATE", Value::Null, None)).unwrap();
        assert!(
            validate(&req, &PolicySet::default(), None)
                .result
                .message
                .contains("object is missing")
        );
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
