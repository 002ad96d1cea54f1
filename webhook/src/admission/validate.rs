//! `/validate`: `common`'s validation, the host names other AppServices hold
//! ([`super::hostnames`]), then the CEL policies; every problem in one answer. All judge
//! the hub form of the object; an UPDATE that asks for nothing new is not judged again
//! ([`super::ratchet`]); a scale write goes to [`super::scale`].

use common::conversion::Version;
use kube::core::admission::{AdmissionResponse, Operation};
use serde_json::Value;

use super::{
    KIND, Request, Review, Subject, allow, bad_request, denial, hostnames, internal_error,
    object_error, ratchet, scale,
};
use crate::appservices::AppServiceCache;
use crate::metrics::Metrics;
use crate::policy::PolicySet;
use crate::review::hub::{Hub, HubError};
use crate::review::policy::{self, Source};
use crate::review::shell::{Metadata, Stored, Written};
use crate::review::{App, Json, ObjectError, Objects};

/// What a review is judged with, besides the review itself.
#[derive(Debug)]
pub struct Judge<'a> {
    /// The policies in force.
    pub policies: &'a PolicySet,
    /// The namespace's metadata, for policies that read `namespaceObject` (`None`
    /// without `--namespace-labels`).
    pub namespace_object: Option<Value>,
    /// What a scale write is judged on, and who holds each host name (`None` without
    /// `--watch-appservices`: a scale write is then refused, it cannot be judged, and
    /// host names are not checked).
    pub appservices: Option<&'a AppServiceCache>,
    /// Where refusals of a taken host name are counted (`None` in unit tests).
    pub metrics: Option<&'a Metrics>,
}

/// `/validate`: every field error of `common::validation` and every policy violation in
/// one denial, with warnings in both outcomes.
pub fn validate(review: &Review, judge: &Judge<'_>) -> AdmissionResponse {
    let req = &review.request;
    match &review.subject {
        Subject::Write { version, objects } => write(req, *version, objects, judge),
        Subject::Scale(write) => scale::validate(req, write, judge),
        Subject::PassThrough => allow(req),
        Subject::Refused(message) => *bad_request(req, message.clone()),
    }
}

/// A CREATE or UPDATE of the AppService itself. Each object is read once: an UPDATE's
/// new object with the labels and annotations the ratchet compares, a CREATE's without.
fn write(
    req: &Request,
    version: Version,
    objects: &Objects,
    judge: &Judge<'_>,
) -> AdmissionResponse {
    let object = objects.object.as_ref();
    if matches!(req.operation, Operation::Update) {
        let stored = objects.old_object.as_ref().map(Json::stored);
        judge_write(
            req,
            version,
            objects,
            object.map(Json::updated),
            stored,
            judge,
        )
    } else {
        judge_write(
            req,
            version,
            objects,
            object.map(Json::written),
            None,
            judge,
        )
    }
}

/// The rules on a write whose objects were read once (`written`: the new one; `stored`:
/// the stored one of an UPDATE): the ratchet compares what that read; the specs are
/// decoded after it; the policies' CEL values are converted from the JSON last.
fn judge_write<M: Metadata>(
    req: &Request,
    version: Version,
    objects: &Objects,
    written: Option<Result<Written<'_, M>, ObjectError>>,
    stored: Option<Result<Stored<'_>, ObjectError>>,
    judge: &Judge<'_>,
) -> AdmissionResponse {
    let update = matches!(req.operation, Operation::Update);
    // Before the specs are decoded: the controller's finalizer writes must pass even for
    // an object the current types or bounds would refuse.
    if let (Some(Ok(stored)), Some(written)) = (&stored, &written)
        && let Some(old) = stored.facts()
        && let Some(why) =
            ratchet::unjudged(&old, written.as_ref().ok().and_then(|w| w.facts()).as_ref())
    {
        tracing::debug!(?why, "update not judged again");
        return allow(req);
    }
    let (json, written) = match (objects.object.as_ref(), written) {
        (Some(json), Some(Ok(written))) => (json, written),
        (_, Some(Err(error))) => return *object_error(req, "object", version, error),
        _ => return *bad_request(req, "object is missing from the request".to_owned()),
    };
    let object = match written.decode(version) {
        Ok(object) => object,
        Err(error) => return *object_error(req, "object", version, error),
    };
    let mut warnings = Vec::new();
    let old = match &stored {
        None if update => {
            // Without it the update rules (immutable fields) cannot be checked.
            return *bad_request(
                req,
                "oldObject is missing from the UPDATE request".to_owned(),
            );
        }
        None => None,
        Some(stored) => {
            let decoded = match stored {
                Ok(stored) => stored.decode(version).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match decoded {
                Ok(old) => Some(old),
                Err(e) => {
                    // Refusing would block every update of an object stored before a
                    // schema change, including the fix; the API server's CEL transition
                    // rules still guard immutable fields.
                    warnings.push(format!(
                        "the stored object is not a valid {KIND} ({e}); update rules were not checked"
                    ));
                    None
                }
            }
        }
    };
    let old_app = old.as_ref().map(|old| &old.app);
    let mut report = match (&object.app, old_app) {
        (App::V1alpha1(new), Some(App::V1alpha1(old))) => {
            common::validation::validate_v1alpha1_report(new, Some(old))
        }
        (App::V1alpha1(new), _) => common::validation::validate_v1alpha1_report(new, None),
        (App::V1beta1(new), Some(App::V1beta1(old))) => {
            common::validation::validate_report(new, Some(old))
        }
        (App::V1beta1(new), _) => common::validation::validate_report(new, None),
    };
    if let Some(appservices) = judge.appservices {
        let refused = hostnames::refused(req, &object.app, appservices, &report.errors);
        if !refused.is_empty() {
            if let Some(metrics) = judge.metrics {
                metrics.exposure_refused();
            }
            report.errors.0.extend(refused);
        }
    }
    warnings.extend(report.warnings);
    let violations = if judge.policies.is_empty() {
        Vec::new()
    } else {
        // Policies read the hub version, whatever version the client wrote; a stored
        // object that could not be decoded is given as it is.
        let (hub, old_hub) = match (Hub::of(&object.app), old_app.map(Hub::of).transpose()) {
            (Ok(hub), Ok(old_hub)) => (hub, old_hub.flatten()),
            (Err(error), _) | (_, Err(error)) => return hub_error(req, &error),
        };
        let (replace, old_replace) = (
            hub.as_ref().map(Hub::replacements).unwrap_or_default(),
            old_hub.as_ref().map(Hub::replacements).unwrap_or_default(),
        );
        let objects = policy::objects(
            judge.policies,
            Source {
                json,
                replace: &replace,
            },
            objects
                .old_object
                .as_ref()
                .filter(|_| update)
                .map(|json| Source {
                    json,
                    replace: &old_replace,
                }),
        );
        judge.policies.evaluate_objects(
            objects,
            &req.to_cel_request(),
            judge.namespace_object.as_ref(),
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

fn hub_error(req: &Request, error: &HubError) -> AdmissionResponse {
    tracing::error!(%error, "cannot give the object in the hub version");
    internal_error(req, &error.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{app, decoded, judge, review};
    use super::*;
    use serde_json::json;

    #[test]
    fn valid_object_is_allowed_with_warnings() {
        let req = decoded(review("CREATE", app(json!({"image": "nginx"})), None));
        let response = validate(&req, &judge(&PolicySet::default()));
        assert!(response.allowed);
        let warnings = response.warnings.unwrap_or_default();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("no tag"), "{warnings:?}");

        let pinned = decoded(review("CREATE", app(json!({"image": "nginx:1.27"})), None));
        assert_eq!(
            validate(&pinned, &judge(&PolicySet::default())).warnings,
            None
        );
    }

    /// `spec.image` and `spec.canary.image` of a v1beta1 CREATE.
    fn v1beta1_create(image: &str, canary: &str) -> Review {
        let mut body: Value = serde_json::from_slice(&review(
            "CREATE",
            json!({"apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                   "metadata": {"name": "checkout"},
                   "spec": {"image": image, "replicas": 2, "canary": {"image": canary}}}),
            None,
        ))
        .unwrap();
        body["request"]["kind"]["version"] = json!("v1beta1");
        decoded(serde_json::to_vec(&body).unwrap())
    }

    #[test]
    fn a_tag_beside_a_digest_is_allowed_with_a_warning() {
        let (stable, next) = ("a".repeat(64), "b".repeat(64));
        let req = v1beta1_create(
            &format!("registry.example.com/app:v1@sha256:{stable}"),
            &format!("registry.example.com/app:v2@sha256:{next}"),
        );
        let response = validate(&req, &judge(&PolicySet::default()));
        assert!(response.allowed, "{:?}", response.result);
        assert_eq!(
            response.warnings.unwrap_or_default(),
            [
                format!(
                    "spec.image names both tag \"v1\" and digest sha256:{stable}: the digest runs and the tag is ignored; write one of them"
                ),
                format!(
                    "spec.canary.image names both tag \"v2\" and digest sha256:{next}: the digest runs and the tag is ignored; write one of them"
                ),
            ]
        );
        // A digest alone, or a tag alone, says what runs.
        let req = v1beta1_create(
            &format!("registry.example.com/app@sha256:{stable}"),
            "registry.example.com/app:v2",
        );
        assert_eq!(validate(&req, &judge(&PolicySet::default())).warnings, None);
    }

    #[test]
    fn an_upper_case_digest_is_denied() {
        let upper = format!("registry.example.com/app@sha256:{}", "A".repeat(64));
        let req = decoded(review("CREATE", app(json!({"image": upper})), None));
        let response = validate(&req, &judge(&PolicySet::default()));
        assert!(!response.allowed);
        assert_eq!(
            response.result.message,
            format!(
                "spec.image: Invalid value: {upper:?}: not a valid image reference: invalid checksum digest format"
            )
        );
        let req = v1beta1_create("registry.example.com/app:v1", &upper);
        let response = validate(&req, &judge(&PolicySet::default()));
        assert!(!response.allowed);
        assert!(
            response
                .result
                .message
                .ends_with("not a valid image reference: invalid checksum digest format"),
            "{}",
            response.result.message
        );
        assert!(
            response.result.message.starts_with("spec.canary.image: "),
            "{}",
            response.result.message
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
            &judge(&PolicySet::default()),
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
            &judge(&PolicySet::default()),
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
                &judge(&PolicySet::default())
            )
            .allowed
        );
        // An undecodable stored object does not block the update.
        let broken_old = app(json!({"image": 7}));
        let response = validate(
            &decoded(review("UPDATE", old, Some(broken_old))),
            &judge(&PolicySet::default()),
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
        assert!(validate(&decoded(review("CREATE", ok, None)), &judge(&set)).allowed);
        let bad = app(json!({"image": "docker.io/checkout:v1", "port": 0}));
        let response = validate(&decoded(review("CREATE", bad, None)), &judge(&set));
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
            &judge(&PolicySet::default()),
        );
        assert!(!response.allowed);
        assert_eq!(response.result.code, 400);
        assert_eq!(
            response.result.message,
            "oldObject is missing from the UPDATE request"
        );
    }

    const PORTS: &str = "policies:\n  - {name: no-9999, expression: \"object.spec.ports.all(p, p.port != 9999)\", message: port 9999 is reserved}\n";

    #[test]
    fn policies_judge_the_hub_version_whatever_the_client_wrote() {
        let set = PolicySet::from_yaml(std::path::Path::new("p.yaml"), PORTS).unwrap();
        // v1alpha1 `port: 9999` is `ports[0].port: 9999` in the hub.
        let alpha = app(json!({"image": "nginx:1.27", "port": 9999}));
        let response = validate(
            &decoded(review("CREATE", alpha.clone(), None)),
            &judge(&set),
        );
        assert!(!response.allowed);
        assert!(
            response.result.message.contains("port 9999 is reserved"),
            "{}",
            response.result.message
        );
        // oldObject too: an update away from 9999 reads the old hub ports.
        let moved = app(json!({"image": "nginx:1.27", "port": 8080}));
        let old_reading = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: old, expression: \"oldObject.spec.ports[0].port == 9999\", message: m}\n",
        )
        .unwrap();
        assert!(
            validate(
                &decoded(review("UPDATE", moved, Some(alpha))),
                &judge(&old_reading)
            )
            .allowed
        );
        // v1beta1 as written.
        let mut body: Value = serde_json::from_slice(&review(
            "CREATE",
            json!({"apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                   "metadata": {"name": "checkout"},
                   "spec": {"image": "nginx:1.27", "ports": [{"name": "http", "port": 9999}]}}),
            None,
        ))
        .unwrap();
        body["request"]["kind"]["version"] = json!("v1beta1");
        let response = validate(&decoded(serde_json::to_vec(&body).unwrap()), &judge(&set));
        assert!(!response.allowed);
    }

    #[test]
    fn finalizer_writes_and_deletions_are_not_judged_again() {
        let never = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: never, expression: 'false', message: added later}\n",
        )
        .unwrap();
        let stored = app(json!({"image": "nginx:1.27", "replicas": 1, "port": 80}));
        let mut finalized = stored.clone();
        finalized["metadata"]["finalizers"] = json!(["platform.example.com/cleanup"]);
        let req = decoded(review("UPDATE", finalized.clone(), Some(stored.clone())));
        assert!(validate(&req, &judge(&never)).allowed, "finalizer added");
        let mut deleting = finalized.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut released = deleting.clone();
        released["metadata"]["finalizers"] = json!([]);
        let req = decoded(review("UPDATE", released, Some(deleting)));
        assert!(validate(&req, &judge(&never)).allowed, "finalizer released");
        // A change of the spec is judged.
        let mut scaled = stored.clone();
        scaled["spec"]["replicas"] = json!(3);
        let req = decoded(review("UPDATE", scaled, Some(stored)));
        assert!(!validate(&req, &judge(&never)).allowed);
    }

    /// The ratchet reads what each object's one pass read: a stored object being deleted
    /// lets an update through even when the new object is no AppService at all (the spec
    /// is never decoded), and a label that is not a string makes the update judged
    /// rather than refused or let through.
    #[test]
    fn the_ratchet_reads_what_the_one_pass_kept() {
        let never = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: never, expression: 'false', message: added later}\n",
        )
        .unwrap();
        let mut deleting = app(json!({"image": "nginx:1.27"}));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let broken = app(json!({"image": 7, "env": "not a list"}));
        let req = decoded(review("UPDATE", broken.clone(), Some(deleting)));
        assert!(validate(&req, &judge(&never)).allowed);
        // Not being deleted: the broken object is refused for what it is.
        let stored = app(json!({"image": "nginx:1.27"}));
        let req = decoded(review("UPDATE", broken, Some(stored.clone())));
        let response = validate(&req, &judge(&PolicySet::default()));
        assert_eq!(response.result.code, 400, "{:?}", response.result);
        assert!(
            response
                .result
                .message
                .starts_with("object is not a valid v1alpha1 AppService: spec.env: invalid type"),
            "{}",
            response.result.message
        );
        // The same labels, one of them not a string: judged, so the policy denies.
        let mut odd = stored.clone();
        odd["metadata"]["labels"] = json!({"team": 5});
        let req = decoded(review("UPDATE", odd.clone(), Some(odd)));
        let response = validate(&req, &judge(&never));
        assert!(!response.allowed);
        assert!(
            response.result.message.contains("added later"),
            "{}",
            response.result.message
        );
        // Identical objects are not judged.
        let req = decoded(review("UPDATE", stored.clone(), Some(stored)));
        assert!(validate(&req, &judge(&never)).allowed);
    }

    /// A v1alpha1 UPDATE: both objects reach the policies in the hub form, converted once
    /// each from their JSON, with the conversion annotations replaced by the conversion's
    /// and every other annotation as it came.
    #[test]
    fn policies_read_both_objects_in_the_hub_form() {
        let canary = common::names::ANNOTATION_V1BETA1_CANARY;
        let set = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            &format!(
                "policies:\n  - name: hub\n    expression: \"object.apiVersion == 'platform.example.com/v1beta1' && object.spec.ports[0].port == 8081 && oldObject.spec.ports[0].port == 8080 && object.spec.canary.image == 'shop:v2' && !('{canary}' in object.metadata.annotations) && object.metadata.annotations.team == 'shop'\"\n    message: not the hub form\n"
            ),
        )
        .unwrap();
        let old = app(json!({"image": "shop:v1", "port": 8080}));
        let mut new = app(json!({"image": "shop:v1", "port": 8081, "replicas": 2}));
        new["metadata"]["annotations"] =
            json!({"team": "shop", canary: r#"{"image":"shop:v2","replicas":1}"#});
        let response = validate(&decoded(review("UPDATE", new, Some(old))), &judge(&set));
        assert!(response.allowed, "{:?}", response.result);
    }

    /// The decoded review owns what it needs (no borrow of the body): the handler moves it
    /// to a blocking thread for costly policies instead of decoding the body there again.
    #[test]
    fn a_decoded_review_needs_no_body() {
        fn owned<T: Send + Sync + 'static>(_: &T) {}
        let req = decoded(review("CREATE", app(json!({"image": "nginx:1.27"})), None));
        owned(&req);
        let req = std::thread::spawn(move || {
            assert!(validate(&req, &judge(&PolicySet::default())).allowed);
            req
        })
        .join()
        .unwrap();
        assert_eq!(req.request.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
    }
}
