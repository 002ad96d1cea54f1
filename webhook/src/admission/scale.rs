//! A write of an AppService's scale subresource (`kubectl scale`, an HPA, anything with
//! `appservices/scale`), judged by the AppService's own rules.
//!
//! The review carries `autoscaling/v1` Scales (old and new replicas, the stored
//! resourceVersion), not the AppService; they are read when the review is decoded
//! ([`ScaleWrite`]), so the handler knows what to wait for in the cache before judging.
//! The webhook answers from memory: the AppService comes from [`crate::appservices`], at
//! the very resourceVersion of the old Scale, and the canonical object is that
//! AppService with `spec.replicas` replaced. Validation and policies then run as for an
//! UPDATE of the AppService in the hub version: `object` is the AppService with the new
//! replicas, `oldObject` the stored one, `request` is the scale request (kind
//! `autoscaling/v1 Scale`, subresource `scale`). The cached AppService is decoded once;
//! the new replicas are set on that decode for validation and put in while its JSON is
//! converted for the policies.
//!
//! Answers without judging: replicas unchanged (nothing asked for, as in
//! [`super::ratchet`]). Refusals that say why, with a code a client acts on: the
//! AppService not (yet) in the cache or the cache behind the stored version is 409
//! Conflict (retried by kubectl, the HPA and client-go); an AppService too large to
//! cache, or the cache over its byte budget, is 422 / 503 naming the bound; a webhook
//! started without `--watch-appservices` refuses every scale write (500): a
//! configuration that sends `/scale` to it must never let one through unjudged.

use common::conversion::Version;
use kube::core::Status;
use kube::core::admission::AdmissionResponse;
use serde_json::value::RawValue;

use super::{Judge, Request, allow, bad_request, denial, deny, internal_error, object_error};
use crate::appservices::{Lookup, MAX_CACHED_OBJECT_BYTES};
use crate::expression::{Replace, With};
use crate::review::policy::{self, Source};
use crate::review::{App, Json, Objects};

/// A scale write, read once from its two Scales.
#[derive(Debug)]
pub(super) struct ScaleWrite {
    /// The replicas asked for.
    pub replicas: i32,
    pub old_replicas: i32,
    /// The stored AppService's resourceVersion (the old Scale's).
    pub resource_version: Option<String>,
}

impl ScaleWrite {
    /// The Scales of a scale write; `Err` is why they are not (the message of a 400).
    pub(super) fn of(objects: Objects) -> Result<ScaleWrite, String> {
        let scale = |json: Option<Json>, field: &str| {
            let Some(json) = json else {
                return Err(format!("{field} is missing from the scale request"));
            };
            json.scale()
                .map_err(|e| format!("{field} is not an autoscaling/v1 Scale: {e}"))
        };
        let new = scale(objects.object, "object");
        let old = scale(objects.old_object, "oldObject");
        let (new, old) = (new?, old?);
        Ok(ScaleWrite {
            replicas: new.replicas(),
            old_replicas: old.replicas(),
            resource_version: old.into_resource_version(),
        })
    }
}

/// A refusal of a scale write with `code`, `reason` and `message`.
fn refuse(req: &Request, code: u16, reason: &str, message: &str) -> AdmissionResponse {
    deny(req, Status::failure(message, reason).with_code(code))
}

/// `/validate` of a scale write.
pub(super) fn validate(
    req: &Request,
    write: &Result<ScaleWrite, String>,
    judge: &Judge<'_>,
) -> AdmissionResponse {
    let write = match write {
        Ok(write) => write,
        Err(message) => return *bad_request(req, message.clone()),
    };
    if write.replicas == write.old_replicas {
        return allow(req);
    }
    let Some(cache) = judge.appservices else {
        return refuse(
            req,
            500,
            "InternalError",
            "this webhook does not watch AppServices (--watch-appservices), so it cannot judge a write of the scale subresource",
        );
    };
    let Some(resource_version) = write.resource_version.as_deref() else {
        return *bad_request(req, "oldObject has no metadata.resourceVersion".to_owned());
    };
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let who = format!("AppService {namespace}/{}", req.name);
    match cache.lookup(namespace, &req.name, resource_version) {
        Lookup::Found(stored) => scaled(req, judge, stored, write.replicas),
        Lookup::Missing => refuse(
            req,
            409,
            "Conflict",
            &format!("the {who} is not in the webhook's cache yet; retry the scale write"),
        ),
        Lookup::Stale { cached } => refuse(
            req,
            409,
            "Conflict",
            &format!(
                "the webhook's cache holds the {who} at resourceVersion {cached}, not {resource_version} yet; retry the scale write"
            ),
        ),
        Lookup::TooLarge(bytes) => refuse(
            req,
            422,
            "Invalid",
            &format!(
                "the {who} is {bytes} bytes of JSON, more than the {MAX_CACHED_OBJECT_BYTES} the webhook keeps to judge scale writes; set spec.replicas on the AppService itself"
            ),
        ),
        Lookup::OverBudget { budget } => refuse(
            req,
            503,
            "ServiceUnavailable",
            &format!(
                "the webhook's AppService cache is at its budget of {budget} bytes (--appservice-cache-bytes), so the {who} cannot be judged on a scale write; set spec.replicas on the AppService itself"
            ),
        ),
    }
}

/// Validation and policies on the stored AppService with `replicas`. The stored object
/// is decoded once; the scaled one is that decode with the new replicas, for the rules
/// and (put in while the JSON is converted) for the policies.
fn scaled(
    req: &Request,
    judge: &Judge<'_>,
    stored: Box<RawValue>,
    replicas: i32,
) -> AdmissionResponse {
    let stored = Json::from(stored);
    let decoded = stored
        .written()
        .and_then(|written| written.decode(Version::V1beta1));
    let old = match decoded {
        Ok(old) => old,
        Err(error) => return *object_error(req, "object", Version::V1beta1, error),
    };
    let App::V1beta1(old_app) = &old.app else {
        return internal_error(req, "the cached AppService is not in the hub version");
    };
    let mut new_app = old_app.clone();
    new_app.spec.replicas = Some(replicas);
    let report = common::validation::validate_report(&new_app, Some(old_app));
    let violations = if judge.policies.is_empty() {
        Vec::new()
    } else {
        let replicas = serde_json::Value::from(replicas);
        let replace = [Replace {
            path: &["spec", "replicas"],
            with: With::Value(&replicas),
        }];
        let objects = policy::objects(
            judge.policies,
            Source {
                json: &stored,
                replace: &replace,
            },
            Some(Source::json(&stored)),
        );
        judge.policies.evaluate_objects(
            objects,
            &req.to_cel_request(),
            judge.namespace_object.as_ref(),
        )
    };
    let mut response = allow(req);
    if !report.warnings.is_empty() {
        response.warnings = Some(report.warnings.clone());
    }
    if report.errors.is_empty() && violations.is_empty() {
        return response;
    }
    response.allowed = false;
    response.result = denial(&req.name, &report.errors, &violations);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{decode_review, fixtures, validate};
    use crate::appservices::{AppServiceCache, DEFAULT_CACHE_BYTES, ScaleTarget};
    use crate::policy::PolicySet;
    use serde_json::json;

    fn scale_review(old: Option<i32>, new: Option<i32>, rv: &str, groups: &[&str]) -> Vec<u8> {
        let scale = |replicas: Option<i32>| {
            let mut spec = json!({});
            if let Some(r) = replicas {
                spec["replicas"] = json!(r);
            }
            json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                   "metadata": {"name": "checkout", "namespace": "prod-eu", "resourceVersion": rv},
                   "spec": spec, "status": {"replicas": 2}})
        };
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "resource": {"group": "platform.example.com", "version": "v1beta1", "resource": "appservices"},
                "subResource": "scale",
                "name": "checkout", "namespace": "prod-eu", "operation": "UPDATE",
                "userInfo": {"username": "hpa", "groups": groups},
                "object": scale(new), "oldObject": scale(old)
            }
        }))
        .unwrap()
    }

    fn cached(image: &str, replicas: i32, rv: &str) -> AppServiceCache {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        cache.apply(
            serde_json::from_value(json!({
                "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                "metadata": {"name": "checkout", "namespace": "prod-eu", "resourceVersion": rv},
                "spec": {"image": image, "replicas": replicas, "ports": [{"name": "http", "port": 8080}]}
            }))
            .unwrap(),
        );
        cache
    }

    fn policies() -> PolicySet {
        PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            include_str!("../../../examples/policies/no-latest-in-production.yaml"),
        )
        .unwrap()
    }

    fn answer(body: Vec<u8>, cache: Option<&AppServiceCache>) -> AdmissionResponse {
        let review = decode_review(&body.into()).unwrap();
        let policies = policies();
        let judge = Judge {
            policies: &policies,
            namespace_object: None,
            appservices: cache,
            metrics: None,
        };
        validate(&review, &judge)
    }

    #[test]
    fn a_scale_write_is_judged_like_the_appservice_with_its_replicas() {
        let cache = cached("shop:v1", 2, "7");
        // Down to 1 in a prod- namespace: the replicas policy.
        let response = answer(scale_review(Some(2), Some(1), "7", &[]), Some(&cache));
        assert!(!response.allowed);
        assert!(
            response
                .result
                .message
                .contains("production-replicas-by-name"),
            "{}",
            response.result.message
        );
        // To zero (no `replicas` in the Scale): the sre policy and the replicas policy.
        let response = answer(scale_review(Some(2), None, "7", &[]), Some(&cache));
        assert!(
            response
                .result
                .message
                .contains("no-scale-to-zero-by-others"),
            "{}",
            response.result.message
        );
        // Up is fine; the same replicas is not judged at all.
        assert!(answer(scale_review(Some(2), Some(3), "7", &[]), Some(&cache)).allowed);
        assert!(answer(scale_review(Some(2), Some(2), "7", &[]), None).allowed);
        // Validation too: over the bound of common.
        let response = answer(scale_review(Some(2), Some(5000), "7", &[]), Some(&cache));
        assert!(
            response
                .result
                .message
                .contains("spec.replicas: Invalid value: 5000"),
            "{}",
            response.result.message
        );
        // The stored image is judged as in any update: latest in production is refused.
        let latest = cached("shop:latest", 2, "7");
        let response = answer(scale_review(Some(2), Some(3), "7", &[]), Some(&latest));
        assert!(
            response
                .result
                .message
                .contains("pinned-images-in-production"),
            "{}",
            response.result.message
        );
    }

    #[test]
    fn a_cache_that_cannot_answer_refuses_with_a_reason() {
        let cache = cached("shop:v1", 2, "7");
        let stale = answer(scale_review(Some(2), Some(3), "8", &[]), Some(&cache));
        assert_eq!((stale.allowed, stale.result.code), (false, 409));
        assert!(
            stale.result.message.contains("resourceVersion 7, not 8"),
            "{}",
            stale.result.message
        );
        let empty = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let missing = answer(scale_review(Some(2), Some(3), "7", &[]), Some(&empty));
        assert_eq!((missing.allowed, missing.result.code), (false, 409));
        let unwatched = answer(scale_review(Some(2), Some(3), "7", &[]), None);
        assert_eq!((unwatched.allowed, unwatched.result.code), (false, 500));
        assert!(unwatched.result.message.contains("--watch-appservices"));
    }

    /// What the handler waits for comes from the same decode that is judged: the old
    /// Scale's resourceVersion, only when new replicas are asked for.
    #[test]
    fn the_cache_is_awaited_only_for_new_replicas() {
        let review = decode_review(&scale_review(Some(2), Some(3), "7", &[]).into()).unwrap();
        assert_eq!(
            review.scale_target(),
            Some(ScaleTarget {
                namespace: "prod-eu".into(),
                name: "checkout".into(),
                resource_version: "7".into(),
            })
        );
        let same = decode_review(&scale_review(Some(2), Some(2), "7", &[]).into()).unwrap();
        assert_eq!(same.scale_target(), None);
        // The status subresource, and a write of the AppService itself, wait for nothing.
        let mut body: serde_json::Value =
            serde_json::from_slice(&scale_review(Some(2), Some(3), "7", &[])).unwrap();
        body["request"]["subResource"] = json!("status");
        let status = decode_review(&serde_json::to_vec(&body).unwrap().into()).unwrap();
        assert_eq!(status.scale_target(), None);
        let app = fixtures::app(json!({"image": "nginx:1.27"}));
        let write = fixtures::decoded(fixtures::review("UPDATE", app.clone(), Some(app)));
        assert_eq!(write.scale_target(), None);
    }

    /// Policies read the scaled object's replicas and the stored object's, both from the
    /// one decode of the cached AppService.
    #[test]
    fn policies_compare_the_new_replicas_with_the_stored_ones() {
        let set = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: no-scale-down, expression: 'object.spec.replicas >= oldObject.spec.replicas && object.spec.image == oldObject.spec.image', message: no}\n",
        )
        .unwrap();
        let cache = cached("shop:v1", 2, "7");
        let judge = Judge {
            policies: &set,
            namespace_object: None,
            appservices: Some(&cache),
            metrics: None,
        };
        let answer = |old, new| {
            let review =
                decode_review(&scale_review(Some(old), Some(new), "7", &[]).into()).unwrap();
            validate(&review, &judge)
        };
        assert!(answer(2, 3).allowed);
        let down = answer(2, 1);
        assert!(!down.allowed);
        assert_eq!(down.result.message, "policy \"no-scale-down\": no");
    }
}
