//! A host name belongs to one AppService in the whole cluster: a CREATE or UPDATE whose
//! hub form (`spec.expose.hostnames`; a `v1alpha1` object carries it in its conversion
//! annotation) claims a host name another AppService holds is refused, one field error
//! per such host name. The answer never names the holder, whose namespace and name a
//! tenant must not learn; the admins' log does.
//!
//! Judged on [`crate::appservices`] (its index of host names), so only with
//! `--watch-appservices`; without it nothing is checked here. Two creates within the
//! watch's lag can both pass: the controller then lets the oldest keep the host name and
//! reports the other (`ExposureConflict`).

use std::borrow::Cow;

use common::validation::{FieldError, FieldErrors};

use super::Request;
use crate::appservices::AppServiceCache;
use crate::review::App;

/// The detail of a refused host name. It says only that the name is taken.
pub const HELD_ELSEWHERE: &str = "is already exposed by another AppService";

/// The host names `app` claims, in the hub form.
fn claimed(app: &App) -> Cow<'_, [String]> {
    match app {
        App::V1beta1(app) => app
            .spec
            .expose
            .as_ref()
            .map_or(Cow::Borrowed(&[][..]), |expose| {
                Cow::Borrowed(&expose.hostnames[..])
            }),
        App::V1alpha1(app) => common::conversion::v1beta1_expose(app)
            .map_or(Cow::Borrowed(&[][..]), |expose| {
                Cow::Owned(expose.hostnames)
            }),
    }
}

/// One field error for each host name of `app` another AppService holds, skipping a host
/// name that already has an error of its own in `errors` (malformed, listed twice). Each
/// refusal is logged with both AppServices' names, for the admins.
pub(super) fn refused(
    req: &Request,
    app: &App,
    appservices: &AppServiceCache,
    errors: &FieldErrors,
) -> Vec<FieldError> {
    let hostnames = claimed(app);
    if hostnames.is_empty() {
        return Vec::new();
    }
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let name = app.name().filter(|n| !n.is_empty()).unwrap_or(&req.name);
    appservices
        .held_elsewhere(namespace, name, &hostnames)
        .into_iter()
        .filter_map(|taken| {
            let hostname = hostnames.get(taken.index)?;
            let field = format!("spec.expose.hostnames[{}]", taken.index);
            tracing::info!(
                uid = %req.uid,
                namespace,
                name,
                hostname = %hostname,
                holder_namespace = %taken.holder_namespace,
                holder_name = %taken.holder_name,
                "host name refused: another AppService exposes it"
            );
            (!errors.iter().any(|e| e.field == field))
                .then(|| FieldError::invalid_str(field, hostname, HELD_ELSEWHERE))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{app, decoded, review};
    use super::super::{Judge, Review, validate};
    use super::*;
    use crate::appservices::DEFAULT_CACHE_BYTES;
    use crate::metrics::Metrics;
    use crate::policy::PolicySet;
    use kube::core::admission::AdmissionResponse;
    use serde_json::{Value, json};

    /// A cache holding `team-a/shop`, exposing `shop.example.com`.
    fn held() -> AppServiceCache {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        cache.apply(
            serde_json::from_value(json!({
                "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                "metadata": {"name": "shop", "namespace": "team-a", "resourceVersion": "7",
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"image": "shop:v1", "ports": [{"name": "http", "port": 8080}],
                         "expose": {"hostnames": ["shop.example.com"]}}
            }))
            .unwrap(),
        );
        cache
    }

    /// A v1beta1 review of `namespace/name` exposing `hosts` (`old`: the stored object's
    /// host names, for an UPDATE).
    fn v1beta1(namespace: &str, name: &str, hosts: &[&str], old: Option<&[&str]>) -> Review {
        let object = |hosts: &[&str], image: &str| {
            json!({"apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                   "metadata": {"name": name, "namespace": namespace},
                   "spec": {"image": image, "ports": [{"name": "http", "port": 8080}],
                            "expose": {"hostnames": hosts}}})
        };
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        let mut body: Value = serde_json::from_slice(&review(
            operation,
            object(hosts, "shop:v2"),
            old.map(|old| object(old, "shop:v1")),
        ))
        .unwrap();
        body["request"]["kind"]["version"] = json!("v1beta1");
        body["request"]["namespace"] = json!(namespace);
        body["request"]["name"] = json!(name);
        decoded(serde_json::to_vec(&body).unwrap())
    }

    fn judged(
        req: &Review,
        cache: Option<&AppServiceCache>,
        metrics: &Metrics,
    ) -> AdmissionResponse {
        let policies = PolicySet::default();
        validate(
            req,
            &Judge {
                policies: &policies,
                namespace_object: None,
                appservices: cache,
                metrics: Some(metrics),
            },
        )
    }

    fn refusals(metrics: &Metrics) -> u64 {
        let text = metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("appservice_webhook_exposure_refusals_total "))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_host_name_another_appservice_holds_is_refused_without_naming_it() {
        let (cache, metrics) = (held(), Metrics::new());
        let req = v1beta1(
            "team-b",
            "store",
            &["store.example.com", "shop.example.com"],
            None,
        );
        let response = judged(&req, Some(&cache), &metrics);
        assert!(!response.allowed);
        assert_eq!(response.result.code, 422);
        assert_eq!(
            response.result.message,
            "spec.expose.hostnames[1]: Invalid value: \"shop.example.com\": is already exposed by another AppService"
        );
        let details = response.result.details.clone().unwrap();
        assert_eq!(details.causes.len(), 1);
        assert_eq!(details.causes[0].field, "spec.expose.hostnames[1]");
        // Nothing of the holder: not its namespace, not its name.
        let answer = serde_json::to_string(&response.into_review()).unwrap();
        assert!(!answer.contains("team-a"), "{answer}");
        assert!(!answer.contains("\"shop\""), "{answer}");
        assert_eq!(refusals(&metrics), 1);
        // The same name in another namespace is another AppService.
        let req = v1beta1("team-b", "shop", &["shop.example.com"], None);
        assert!(!judged(&req, Some(&cache), &metrics).allowed);
        assert_eq!(refusals(&metrics), 2);
    }

    #[test]
    fn the_holder_updates_its_own_host_names() {
        let (cache, metrics) = (held(), Metrics::new());
        let req = v1beta1(
            "team-a",
            "shop",
            &["shop.example.com", "www.shop.example.com"],
            Some(&["shop.example.com"]),
        );
        let response = judged(&req, Some(&cache), &metrics);
        assert!(response.allowed, "{:?}", response.result);
        // And a CREATE of that name (re-created before the watch saw the deletion).
        let req = v1beta1("team-a", "shop", &["shop.example.com"], None);
        assert!(judged(&req, Some(&cache), &metrics).allowed);
        // Another object's UPDATE adding the host name is refused.
        let req = v1beta1(
            "team-b",
            "store",
            &["store.example.com", "shop.example.com"],
            Some(&["store.example.com"]),
        );
        assert!(!judged(&req, Some(&cache), &metrics).allowed);
        assert_eq!(refusals(&metrics), 1);
    }

    #[test]
    fn a_v1alpha1_write_is_judged_on_its_hub_host_names() {
        let (cache, metrics) = (held(), Metrics::new());
        let mut object = app(json!({"image": "shop:v1", "port": 8080}));
        object["metadata"]["annotations"] = json!({
            common::names::ANNOTATION_V1BETA1_EXPOSE: r#"{"hostnames":["shop.example.com"]}"#
        });
        let req = decoded(review("CREATE", object.clone(), None));
        let response = judged(&req, Some(&cache), &metrics);
        assert!(!response.allowed);
        assert_eq!(
            response.result.message,
            "spec.expose.hostnames[0]: Invalid value: \"shop.example.com\": is already exposed by another AppService"
        );
        assert_eq!(refusals(&metrics), 1);
        // Without the annotation it exposes nothing.
        let plain = app(json!({"image": "shop:v1", "port": 8080}));
        assert!(
            judged(
                &decoded(review("CREATE", plain, None)),
                Some(&cache),
                &metrics
            )
            .allowed
        );
    }

    #[test]
    fn without_the_appservice_cache_nothing_is_checked() {
        let metrics = Metrics::new();
        let req = v1beta1("team-b", "store", &["shop.example.com"], None);
        assert!(judged(&req, None, &metrics).allowed);
        assert_eq!(refusals(&metrics), 0);
    }

    #[test]
    fn a_host_name_with_its_own_error_is_refused_once() {
        let (cache, metrics) = (held(), Metrics::new());
        let req = v1beta1(
            "team-b",
            "store",
            &["shop.example.com", "shop.example.com"],
            None,
        );
        let response = judged(&req, Some(&cache), &metrics);
        assert!(!response.allowed);
        let causes = response.result.details.unwrap().causes;
        let fields: Vec<_> = causes
            .iter()
            .map(|c| (c.field.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                ("spec.expose.hostnames[1]", "FieldValueDuplicate"),
                ("spec.expose.hostnames[0]", "FieldValueInvalid"),
            ]
        );
    }
}
