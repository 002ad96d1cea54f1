//! `/validate`: `common`'s validation, then the CEL policies; every problem in one answer.

use kube::core::admission::{AdmissionResponse, Operation};
use serde_json::Value;

use super::{KIND, Request, allow, bad_request, denial, written_object};
use crate::policy::PolicySet;
use crate::review::{self, App};

/// `/validate`: every field error of `common::validation` and every policy violation in
/// one denial, with warnings in both outcomes. `namespace_object` is the namespace's
/// metadata for policies that use `namespaceObject` (None without `--namespace-labels`).
pub fn validate(
    req: &Request<'_>,
    policies: &PolicySet,
    namespace_object: Option<Value>,
) -> AdmissionResponse {
    let (version, object) = match written_object(req) {
        Ok(written) => written,
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::{app, decoded, review};
    use super::*;
    use serde_json::json;

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
}
