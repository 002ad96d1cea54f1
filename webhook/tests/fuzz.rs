//! Property tests: arbitrary bytes, arbitrary JSON and arbitrarily mangled reviews sent to
//! both endpoints never panic and never get a 5xx.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use axum::Router;
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{bytes, fixture, oneshot, state};

const POLICIES: &str = r#"
policies:
  - name: registry
    expression: "object.spec.image.startsWith('registry.example.com/')"
    message: "registry"
    messageExpression: "'bad image ' + string(object.spec.image)"
  - name: replicas
    expression: "object.spec.replicas >= oldObject.spec.replicas"
    message: "no scale down"
"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn app() -> Router {
    webhook::router(state(Some(POLICIES)))
}

/// Sends `body` to both endpoints; returns the statuses.
fn send(rt: &tokio::runtime::Runtime, app: &Router, body: &[u8]) -> Vec<u16> {
    rt.block_on(async {
        let mut statuses = Vec::new();
        for path in ["/mutate", "/validate"] {
            let (status, reply) = oneshot(app, "POST", path, body.to_vec()).await;
            if status.is_success() {
                // A 200 always carries a well-formed AdmissionReview answer.
                let review: Value = serde_json::from_slice(&reply).unwrap();
                assert!(review["response"]["allowed"].is_boolean(), "{review}");
            }
            statuses.push(status.as_u16());
        }
        statuses
    })
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("CREATE"),
            Just("UPDATE"),
            Just("DELETE"),
            Just("AppService"),
            Just("platform.example.com"),
            Just("v1alpha1")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-z]{1,8}".prop_map(|s| s),
                    prop_oneof![
                        Just("spec"),
                        Just("metadata"),
                        Just("image"),
                        Just("replicas"),
                        Just("port"),
                        Just("env"),
                        Just("name"),
                        Just("labels"),
                        Just("database"),
                        Just("enabled"),
                        Just("class"),
                        Just("resources")
                    ]
                    .prop_map(ToOwned::to_owned),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON pointers into the fixture that are worth replacing.
const TARGETS: [&str; 14] = [
    "/request",
    "/request/uid",
    "/request/kind",
    "/request/operation",
    "/request/object",
    "/request/object/metadata",
    "/request/object/metadata/labels",
    "/request/object/metadata/name",
    "/request/object/spec",
    "/request/object/spec/image",
    "/request/object/spec/replicas",
    "/request/object/spec/env",
    "/request/object/spec/resources",
    "/request/oldObject",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let rt = runtime();
        let app = app();
        for status in send(&rt, &app, &body) {
            prop_assert!(status < 500, "status {status}");
        }
    }

    #[test]
    fn arbitrary_json(value in arb_json()) {
        let rt = runtime();
        let app = app();
        for status in send(&rt, &app, &bytes(&value)) {
            prop_assert!(status < 500, "status {status} for {value}");
        }
    }

    #[test]
    fn mangled_reviews(
        base in prop_oneof![Just("create-minimal.json"), Just("update-class.json"), Just("create-invalid.json")],
        edits in prop::collection::vec((0..TARGETS.len(), arb_json()), 1..4),
    ) {
        let mut review = fixture(base);
        for (target, value) in edits {
            if let Some(slot) = review.pointer_mut(TARGETS[target]) {
                *slot = value;
            }
        }
        let rt = runtime();
        let app = app();
        for status in send(&rt, &app, &bytes(&review)) {
            prop_assert!(status < 500, "status {status} for {review}");
        }
    }
}

#[test]
fn state_is_shareable() {
    // The router is cloned per connection; its state must be shareable across threads.
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    let state: Arc<webhook::State> = state(Some(POLICIES));
    assert_send_sync(&state);
}
