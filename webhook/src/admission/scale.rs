//! A write of an AppService's scale subresource (`kubectl scale`, an HPA, anything with
//! `appservices/scale`), judged by the AppService's own rules.
//!
//! The review carries `autoscaling/v1` Scales (old and new replicas, the stored
//! resourceVersion), not the AppService. The webhook answers from memory: the
//! AppService comes from [`crate::appservices`], at the very resourceVersion of the
//! old Scale, and the canonical object is that AppService with `spec.replicas`
//! replaced. Validation and policies then run as for an UPDATE of the AppService in the
//! hub version: `object` is the AppService with the new replicas, `oldObject` the
//! stored one, `request` is the scale request (kind `autoscaling/v1 Scale`,
//! subresource `scale`).
//!
//! Answers without judging: replicas unchanged (nothing asked for, as in
//! [`super::ratchet`]). Refusals that say why, with a code a client acts on: the
//! AppService not (yet) in the cache or the cache behind the stored version is 409
//! Conflict (retried by kubectl, the HPA and client-go); an AppService too large to
//! cache, or the cache over its byte budget, is 422 / 503 naming the bound; a webhook
//! started without `--watch-appservices` refuses every scale write (500): a
//! configuration that sends `/scale` to it must never let one through unjudged.

use std::collections::BTreeMap;

use common::conversion::Version;
use kube::core::Status;
use kube::core::admission::{AdmissionResponse, Operation};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Request, allow, bad_request, decode, denial, deny, internal_error};
use crate::appservices::{AppServiceCache, Lookup, MAX_CACHED_OBJECT_BYTES};
use crate::policy::PolicySet;
use crate::review::App;

/// The parts of a Scale the rules need.
#[derive(Deserialize)]
struct Scale {
    #[serde(default)]
    metadata: ScaleMeta,
    #[serde(default)]
    spec: ScaleSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScaleMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// `replicas` is `omitempty` in Go: a Scale to zero has no `replicas` at all.
#[derive(Default, Deserialize)]
struct ScaleSpec {
    #[serde(default)]
    replicas: i32,
}

fn scale_of(
    req: &Request<'_>,
    raw: Option<&RawValue>,
    field: &str,
) -> Result<Scale, Box<AdmissionResponse>> {
    let Some(raw) = raw else {
        return Err(bad_request(
            req,
            format!("{field} is missing from the scale request"),
        ));
    };
    serde_json::from_str(raw.get())
        .map_err(|e| bad_request(req, format!("{field} is not an autoscaling/v1 Scale: {e}")))
}

/// A refusal of a scale write with `code`, `reason` and `message`.
fn refuse(req: &Request<'_>, code: u16, reason: &str, message: &str) -> AdmissionResponse {
    deny(req, Status::failure(message, reason).with_code(code))
}

/// `/validate` of a scale write.
pub(super) fn validate(
    req: &Request<'_>,
    policies: &PolicySet,
    namespace_object: Option<Value>,
    appservices: Option<&AppServiceCache>,
) -> AdmissionResponse {
    // The API server sends UPDATE for every scale write (a patch included).
    if !matches!(req.operation, Operation::Update) {
        return allow(req);
    }
    let (new, old) = match (
        scale_of(req, req.object, "object"),
        scale_of(req, req.old_object, "oldObject"),
    ) {
        (Ok(new), Ok(old)) => (new, old),
        (Err(response), _) | (_, Err(response)) => return *response,
    };
    if new.spec.replicas == old.spec.replicas {
        return allow(req);
    }
    let Some(cache) = appservices else {
        return refuse(
            req,
            500,
            "InternalError",
            "this webhook does not watch AppServices (--watch-appservices), so it cannot judge a write of the scale subresource",
        );
    };
    let Some(resource_version) = old.metadata.resource_version.as_deref() else {
        return *bad_request(req, "oldObject has no metadata.resourceVersion".to_owned());
    };
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let who = format!("AppService {namespace}/{}", req.name);
    match cache.lookup(namespace, &req.name, resource_version) {
        Lookup::Found(stored) => judge(req, policies, namespace_object, &stored, new.spec.replicas),
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

/// Validation and policies on the stored AppService with `replicas`.
fn judge(
    req: &Request<'_>,
    policies: &PolicySet,
    namespace_object: Option<Value>,
    stored: &RawValue,
    replicas: i32,
) -> AdmissionResponse {
    let scaled = match with_replicas(stored, replicas) {
        Ok(scaled) => scaled,
        Err(error) => {
            return internal_error(
                req,
                &format!("the cached AppService cannot be read: {error}"),
            );
        }
    };
    let (new, old) = match (
        decode(req, Some(&scaled), "object", Version::V1beta1),
        decode(req, Some(stored), "oldObject", Version::V1beta1),
    ) {
        (Ok(new), Ok(old)) => (new, old),
        (Err(response), _) | (_, Err(response)) => return *response,
    };
    let (App::V1beta1(new_app), App::V1beta1(old_app)) = (&new.app, &old.app) else {
        return internal_error(req, "the cached AppService is not in the hub version");
    };
    let report = common::validation::validate_report(new_app, Some(old_app));
    let violations = policies.evaluate_raw(
        &scaled,
        Some(stored),
        &req.to_cel_request(),
        namespace_object.as_ref(),
    );
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

/// `object` with `spec.replicas` set; every other member as it was.
fn with_replicas(object: &RawValue, replicas: i32) -> Result<Box<RawValue>, serde_json::Error> {
    let mut top: BTreeMap<String, Box<RawValue>> = serde_json::from_str(object.get())?;
    let mut spec: serde_json::Map<String, Value> = match top.get("spec") {
        Some(spec) => serde_json::from_str(spec.get())?,
        None => serde_json::Map::new(),
    };
    spec.insert("replicas".to_owned(), Value::from(replicas));
    top.insert("spec".to_owned(), serde_json::value::to_raw_value(&spec)?);
    serde_json::value::to_raw_value(&top)
}

#[cfg(test)]
mod tests {
    use super::super::validate_with;
    use super::*;
    use crate::admission::decode_review;
    use crate::appservices::DEFAULT_CACHE_BYTES;
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

    fn answer(body: &[u8], cache: Option<&AppServiceCache>) -> AdmissionResponse {
        let req = decode_review(body).unwrap();
        validate_with(&req, &policies(), None, cache)
    }

    #[test]
    fn a_scale_write_is_judged_like_the_appservice_with_its_replicas() {
        let cache = cached("shop:v1", 2, "7");
        // Down to 1 in a prod- namespace: the replicas policy.
        let response = answer(&scale_review(Some(2), Some(1), "7", &[]), Some(&cache));
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
        let response = answer(&scale_review(Some(2), None, "7", &[]), Some(&cache));
        assert!(
            response
                .result
                .message
                .contains("no-scale-to-zero-by-others"),
            "{}",
            response.result.message
        );
        // Up is fine; the same replicas is not judged at all.
        assert!(answer(&scale_review(Some(2), Some(3), "7", &[]), Some(&cache)).allowed);
        assert!(answer(&scale_review(Some(2), Some(2), "7", &[]), None).allowed);
        // Validation too: over the bound of common.
        let response = answer(&scale_review(Some(2), Some(5000), "7", &[]), Some(&cache));
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
        let response = answer(&scale_review(Some(2), Some(3), "7", &[]), Some(&latest));
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
        let stale = answer(&scale_review(Some(2), Some(3), "8", &[]), Some(&cache));
        assert_eq!((stale.allowed, stale.result.code), (false, 409));
        assert!(
            stale.result.message.contains("resourceVersion 7, not 8"),
            "{}",
            stale.result.message
        );
        let empty = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let missing = answer(&scale_review(Some(2), Some(3), "7", &[]), Some(&empty));
        assert_eq!((missing.allowed, missing.result.code), (false, 409));
        let unwatched = answer(&scale_review(Some(2), Some(3), "7", &[]), None);
        assert_eq!((unwatched.allowed, unwatched.result.code), (false, 500));
        assert!(unwatched.result.message.contains("--watch-appservices"));
    }

    #[test]
    fn replicas_are_replaced_and_nothing_else() {
        let raw = RawValue::from_string(
            r#"{"a":1,"spec":{"image":"x","replicas":2,"env":[{"name":"A"}]}}"#.into(),
        )
        .unwrap();
        let out: Value = serde_json::from_str(with_replicas(&raw, 0).unwrap().get()).unwrap();
        assert_eq!(
            out,
            json!({"a": 1, "spec": {"image": "x", "replicas": 0, "env": [{"name": "A"}]}})
        );
    }
}
