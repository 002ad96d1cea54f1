//! The ImagePolicy CRD in front of its first consumer, the API server: the schema's
//! defaults and bounds and its CEL rules refuse what `common::image_policy` refuses, so
//! a policy the controller would reject never gets stored by a new write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use common::image_policy::{
    ImagePolicy, MAX_IMAGE_PATTERNS, MAX_KEYS, MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN,
    MAX_PUBLIC_KEY_LEN, MAX_SELECTOR_EXPRESSIONS, MAX_SELECTOR_LABELS, MAX_SELECTOR_VALUES,
    Pattern, PolicyMode, parse_selector, refusal,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";

fn policy(name: &str, spec: serde_json::Value) -> ImagePolicy {
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

/// The raw object, for specs the Rust type cannot hold (a missing required field).
async fn create_raw(
    cp: &harness::ControlPlane,
    name: &str,
    spec: serde_json::Value,
) -> Result<(), kube::Error> {
    let ar = kube::core::ApiResource::erase::<ImagePolicy>(&());
    let api: Api<kube::core::DynamicObject> = Api::all_with(cp.client(), &ar);
    let obj: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.map(|_| ())
}

async fn installed() -> Result<&'static harness::ControlPlane, Box<dyn std::error::Error>> {
    let cp = harness::shared().await?;
    cp.apply_crd(&common::crd::image_policy_crd()).await?;
    Ok(cp)
}

#[tokio::test]
async fn a_minimal_policy_is_stored_with_its_defaults() -> TestResult {
    let cp = installed().await?;
    let ns = cp.namespace().await?;
    let name = format!("{ns}-minimal");
    let api: Api<ImagePolicy> = Api::all(cp.client());
    let stored = api
        .create(
            &PostParams::default(),
            &policy(
                &name,
                json!({"images": [{"glob": "registry.example.com/shop/**"}],
                       "keys": [{"name": "release", "secretRef": {"name": "signing"}}]}),
            ),
        )
        .await?;
    assert_eq!(stored.spec.mode, PolicyMode::Enforce);
    assert_eq!(refusal(&stored.spec), None);
    api.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

/// Each pattern the API server refuses is one `Pattern::parse` refuses, and the other
/// way round: the schema and the controller hold one rule.
#[tokio::test]
async fn the_api_server_and_common_agree_on_patterns() -> TestResult {
    let cp = installed().await?;
    let ns = cp.namespace().await?;
    let long = format!("registry.example.com/{}", "a".repeat(600));
    let globs = [
        "registry.example.com/shop/app",
        "registry.example.com/team-*/**",
        "*.example.com/*",
        "**",
        "localhost:5000/app",
        "localhost/app",
        "nginx",
        "library/nginx",
        "registry.example.com/app:v1",
        "registry.example.com/app@sha256",
        "Registry.example.com/app",
        "registry.example.com//app",
        "registry.example.com/",
        "registry.example.com/***",
        "registry.example.com/a?",
        "localhost:/app",
        "registry.example.com:abc/app",
        "a:1:2/app",
        "localhost:5*/app",
        long.as_str(),
    ];
    for (i, glob) in globs.iter().enumerate() {
        let name = format!("{ns}-glob-{i}");
        let spec = json!({"images": [{"glob": glob}], "keys": [{"name": "k", "publicKey": KEY}]});
        let stored = create_raw(cp, &name, spec).await;
        let parsed = Pattern::parse(glob);
        assert_eq!(
            stored.is_ok(),
            parsed.is_ok(),
            "{glob:?}: API server {stored:?}, common {parsed:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn keys_and_bounds_are_enforced_by_the_api_server() -> TestResult {
    let cp = installed().await?;
    let ns = cp.namespace().await?;
    let images = json!([{"glob": "registry.example.com/**"}]);
    let message = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Exactly one source per key.
    let both = create_raw(
        cp,
        &format!("{ns}-both"),
        json!({"images": images, "keys": [{"name": "k", "publicKey": KEY, "secretRef": {"name": "s"}}]}),
    )
    .await;
    assert!(message(both).contains("exactly one of publicKey and secretRef"));
    let neither = create_raw(
        cp,
        &format!("{ns}-neither"),
        json!({"images": images, "keys": [{"name": "k"}]}),
    )
    .await;
    assert!(message(neither).contains("exactly one of publicKey and secretRef"));
    // Key names are unique (they are what status reports).
    let twice = create_raw(
        cp,
        &format!("{ns}-twice"),
        json!({"images": images, "keys": [{"name": "k", "publicKey": KEY}, {"name": "k", "publicKey": KEY}]}),
    )
    .await;
    assert!(message(twice).contains("Duplicate value"));
    // No images, no keys, too many of either, a key too long.
    let key = json!({"name": "k", "publicKey": KEY});
    let keys: Vec<_> = (0..=MAX_KEYS)
        .map(|i| json!({"name": format!("k{i}"), "publicKey": KEY}))
        .collect();
    let many_images: Vec<_> = (0..=MAX_IMAGE_PATTERNS)
        .map(|i| json!({"glob": format!("registry.example.com/a{i}")}))
        .collect();
    let huge_key = "A".repeat(MAX_PUBLIC_KEY_LEN + 1);
    for (what, spec, field) in [
        (
            "no images",
            json!({"images": [], "keys": [key]}),
            "spec.images",
        ),
        (
            "no keys",
            json!({"images": images, "keys": []}),
            "spec.keys",
        ),
        (
            "too many keys",
            json!({"images": images, "keys": keys}),
            "spec.keys",
        ),
        (
            "too many images",
            json!({"images": many_images, "keys": [key]}),
            "spec.images",
        ),
        (
            "a huge key",
            json!({"images": images, "keys": [{"name": "k", "publicKey": huge_key}]}),
            "publicKey",
        ),
        (
            "a mode that does not exist",
            json!({"images": images, "keys": [key], "mode": "Warn"}),
            "spec.mode",
        ),
    ] {
        let m = message(create_raw(cp, &format!("{ns}-bounds"), spec).await);
        assert!(m.contains(field), "{what}: {m}");
    }
    Ok(())
}

/// Each `namespaceSelector` the API server refuses is one `parse_selector` refuses, and
/// the other way round: a policy whose selector the controller cannot evaluate (and so
/// takes as selecting every namespace) is never stored by a new write.
#[tokio::test]
async fn the_api_server_and_common_agree_on_namespace_selectors() -> TestResult {
    let cp = installed().await?;
    let ns = cp.namespace().await?;
    let exists = |n: usize| -> Vec<_> {
        (0..n)
            .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
            .collect()
    };
    let values = |n: usize| -> Vec<_> { (0..n).map(|i| format!("v{i}")).collect() };
    let labels = |n: usize| -> serde_json::Map<_, _> {
        (0..n).map(|i| (format!("k{i}"), json!("v"))).collect()
    };
    let expression = |op: &str, values: Option<Vec<String>>| {
        let mut e = json!({"key": "tier", "operator": op});
        if let Some(v) = values {
            e["values"] = json!(v);
        }
        json!({"matchExpressions": [e]})
    };
    let key = "k".repeat(MAX_LABEL_KEY_LEN);
    // Lengths are characters, not bytes, for the API server and for common alike.
    let value = "é".repeat(MAX_LABEL_VALUE_LEN);
    let long_key = "k".repeat(MAX_LABEL_KEY_LEN + 1);
    let long_value = "v".repeat(MAX_LABEL_VALUE_LEN + 1);
    let cases = [
        (
            "valid",
            json!({
                "matchLabels": {"team": "shop"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["prod"]},
                    {"key": "legacy", "operator": "DoesNotExist"}
                ]
            }),
            true,
        ),
        ("empty", json!({}), true),
        ("NotIn", expression("NotIn", Some(values(2))), true),
        ("Exists, []", expression("Exists", Some(vec![])), true),
        (
            "unknown operator",
            expression("Sometimes", Some(values(1))),
            false,
        ),
        ("In without values", expression("In", None), false),
        ("In, []", expression("In", Some(vec![])), false),
        ("NotIn without values", expression("NotIn", None), false),
        (
            "Exists with values",
            expression("Exists", Some(values(1))),
            false,
        ),
        (
            "DoesNotExist with values",
            expression("DoesNotExist", Some(values(1))),
            false,
        ),
        (
            "as many expressions as allowed",
            json!({"matchExpressions": exists(MAX_SELECTOR_EXPRESSIONS)}),
            true,
        ),
        (
            "too many expressions",
            json!({"matchExpressions": exists(MAX_SELECTOR_EXPRESSIONS + 1)}),
            false,
        ),
        (
            "as many values as allowed",
            expression("In", Some(values(MAX_SELECTOR_VALUES))),
            true,
        ),
        (
            "too many values",
            expression("In", Some(values(MAX_SELECTOR_VALUES + 1))),
            false,
        ),
        (
            "the longest key and value",
            json!({
                "matchExpressions": [{"key": key, "operator": "In", "values": [value]}],
                "matchLabels": {key.clone(): value.clone()}
            }),
            true,
        ),
        (
            "a key too long",
            json!({"matchExpressions": [{"key": long_key, "operator": "Exists"}]}),
            false,
        ),
        (
            "a value too long",
            expression("In", Some(vec![long_value.clone()])),
            false,
        ),
        (
            "as many labels as allowed",
            json!({"matchLabels": labels(MAX_SELECTOR_LABELS)}),
            true,
        ),
        (
            "too many labels",
            json!({"matchLabels": labels(MAX_SELECTOR_LABELS + 1)}),
            false,
        ),
        (
            "a label key too long",
            json!({"matchLabels": {long_key.clone(): "v"}}),
            false,
        ),
        (
            "a label value too long",
            json!({"matchLabels": {"tier": long_value}}),
            false,
        ),
    ];
    let api: Api<ImagePolicy> = Api::all(cp.client());
    for (i, (what, selector, valid)) in cases.into_iter().enumerate() {
        let name = format!("{ns}-selector-{i}");
        let spec = json!({
            "images": [{"glob": format!("registry.invalid/{ns}/**")}],
            "namespaceSelector": selector.clone(),
            "keys": [{"name": "k", "publicKey": KEY}]
        });
        let stored = create_raw(cp, &name, spec).await;
        let parsed = parse_selector(&serde_json::from_value::<LabelSelector>(selector)?);
        assert_eq!(stored.is_ok(), valid, "{what}: API server {stored:?}");
        if let Err(kube::Error::Api(status)) = &stored {
            // Refused for the selector, not for anything else.
            assert!(
                status.message.contains("spec.namespaceSelector"),
                "{what}: {}",
                status.message
            );
        }
        assert_eq!(parsed.is_ok(), valid, "{what}: common {parsed:?}");
        if stored.is_ok() {
            api.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}
