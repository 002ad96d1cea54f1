//! The admission and operations routes through `Router::oneshot`, with fixture reviews.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use http::StatusCode;
use serde_json::{Value, json};
use support::{bytes, fixture, oneshot, patch_of, response_of, state};
use webhook::{ops_router, router};

/// Two policies: images from one registry, two replicas in production.
const POLICIES: &str = include_str!("fixtures/registry-policies.yaml");

fn apply(object: &Value, patch: &Value) -> Value {
    let mut patched = object.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut patched, &patch).unwrap();
    patched
}

#[tokio::test]
async fn mutate_applies_defaults_and_the_name_label() {
    let app = router(state(None));
    let review = fixture("create-minimal.json");
    let (status, body) = oneshot(&app, "POST", "/mutate", bytes(&review)).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["uid"], review["request"]["uid"]);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = patch_of(&response);
    let ops = patch.as_array().unwrap();
    assert_eq!(ops.len(), 3, "{patch}");
    assert!(ops.iter().all(|op| op["op"] == "add"), "{patch}");

    let object = &review["request"]["object"];
    let patched = apply(object, &patch);
    assert_eq!(patched["spec"]["replicas"], 1);
    assert_eq!(patched["spec"]["port"], 8080);
    assert_eq!(
        patched["metadata"]["labels"],
        json!({"team": "payments", "app.kubernetes.io/name": "checkout"})
    );
    // Everything else is byte-for-byte what the user sent.
    let mut expected = object.clone();
    expected["spec"]["replicas"] = json!(1);
    expected["spec"]["port"] = json!(8080);
    expected["metadata"]["labels"]["app.kubernetes.io/name"] = json!("checkout");
    assert_eq!(patched, expected);
}

#[tokio::test]
async fn mutate_is_idempotent() {
    let app = router(state(None));
    let mut review = fixture("create-minimal.json");
    let (_, body) = oneshot(&app, "POST", "/mutate", bytes(&review)).await;
    let patched = apply(&review["request"]["object"], &patch_of(&response_of(&body)));
    review["request"]["object"] = patched;
    let (status, body) = oneshot(&app, "POST", "/mutate", bytes(&review)).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response.get("patch"),
        None,
        "a defaulted object gets no patch: {response}"
    );
    assert_eq!(response.get("patchType"), None);
}

#[tokio::test]
async fn validate_reports_every_error_and_the_warning() {
    let app = router(state(None));
    let (status, body) = oneshot(
        &app,
        "POST",
        "/validate",
        bytes(&fixture("create-invalid.json")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    let message = response["status"]["message"].as_str().unwrap();
    for expected in [
        r#"metadata.name: Invalid value: "Bad_Name""#,
        "spec.replicas: Invalid value: 1001: must be between 0 and 1000",
        "spec.port: Invalid value: 0: must be between 1 and 65535",
        r#"spec.env[1].name: Duplicate value: "GOOD""#,
        r#"spec.env[2].name: Invalid value: "9lives""#,
        r#"spec.resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1"#,
        "spec.database.class: Required value",
    ] {
        assert!(
            message.contains(expected),
            "{expected:?} missing from {message}"
        );
    }
    let causes = response["status"]["details"]["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 7, "{causes:?}");
    let warnings = response["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].as_str().unwrap().contains(":latest"));
}

#[tokio::test]
async fn validate_allows_a_good_object_and_warns_on_untagged_images() {
    let app = router(state(None));
    let review = fixture("create-minimal.json");
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    let response = response_of(&body);
    assert_eq!(response["allowed"], true);
    assert_eq!(response.get("warnings"), None);

    let mut untagged = review;
    untagged["request"]["object"]["spec"]["image"] = json!("registry.example.com/checkout");
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&untagged)).await;
    let response = response_of(&body);
    assert_eq!(response["allowed"], true);
    assert!(
        response["warnings"][0].as_str().unwrap().contains("no tag"),
        "{response}"
    );
}

#[tokio::test]
async fn update_of_an_immutable_field_is_denied() {
    let app = router(state(None));
    let review = fixture("update-class.json");
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    let response = response_of(&body);
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["message"],
        r#"spec.database.class: Invalid value: "large-postgresql": field is immutable while the database is enabled"#
    );
    // Disabling the database in the same update lifts the rule.
    let mut disabled = review;
    disabled["request"]["object"]["spec"]["database"]["enabled"] = json!(false);
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&disabled)).await;
    assert_eq!(response_of(&body)["allowed"], true);
}

#[tokio::test]
async fn policies_allow_and_deny() {
    let app = router(state(Some(POLICIES)));
    let mut review = fixture("create-minimal.json");
    review["request"]["object"]["spec"]["replicas"] = json!(3);
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    assert_eq!(
        response_of(&body)["allowed"],
        true,
        "registry image, 3 replicas in production"
    );

    review["request"]["object"]["spec"]["replicas"] = json!(1);
    review["request"]["object"]["spec"]["image"] = json!("docker.io/library/nginx:1.27");
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    let response = response_of(&body);
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["message"],
        "policy \"allowed-registry\": image docker.io/library/nginx:1.27 is not from registry.example.com; \
         policy \"production-replicas\": AppServices in production need at least 2 replicas"
    );

    // The replicas policy is scoped to the production namespace by its expression.
    review["request"]["namespace"] = json!("dev");
    review["request"]["object"]["spec"]["image"] = json!("registry.example.com/nginx:1.27");
    let (_, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    assert_eq!(response_of(&body)["allowed"], true);
}

#[tokio::test]
async fn delete_is_allowed_untouched() {
    let app = router(state(Some(
        "policies:\n  - {name: never, expression: 'false', message: never}\n",
    )));
    for path in ["/mutate", "/validate"] {
        let (status, body) = oneshot(&app, "POST", path, bytes(&fixture("delete.json"))).await;
        assert_eq!(status, StatusCode::OK);
        let response = response_of(&body);
        assert_eq!(response["allowed"], true);
        assert_eq!(response.get("patch"), None);
    }
}

#[tokio::test]
async fn wrong_kind_is_a_clear_answer() {
    let app = router(state(None));
    for path in ["/mutate", "/validate"] {
        let (status, body) = oneshot(&app, "POST", path, bytes(&fixture("create-pod.json"))).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "a well-formed review gets a review back"
        );
        let response = response_of(&body);
        assert_eq!(response["allowed"], false);
        assert_eq!(response["uid"], "0f1e2d3c-0000-4000-8000-000000000004");
        assert_eq!(response["status"]["code"], 400);
        assert_eq!(
            response["status"]["message"],
            "this webhook admits platform.example.com/v1alpha1 and platform.example.com/v1beta1 AppService only, got v1/Pod"
        );
    }
}

#[tokio::test]
async fn malformed_bodies_get_400_with_a_message() {
    let app = router(state(None));
    let cases: [(&[u8], &str); 4] = [
        (b"", "EOF"),
        (b"{not json", "key must be a string"),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"EXPLODE"}}"#, "request.operation"),
        (br#"{"apiVersion":"v1","kind":"Pod"}"#, "expected admission.k8s.io/v1 AdmissionReview"),
    ];
    for (body, expected) in cases {
        for path in ["/mutate", "/validate"] {
            let (status, reply) = oneshot(&app, "POST", path, body.to_vec()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let text = String::from_utf8_lossy(&reply);
            assert!(
                text.contains(expected),
                "{expected:?} missing from {text:?}"
            );
        }
    }
}

#[tokio::test]
async fn oversize_body_gets_413() {
    let app = router(state(None));
    let mut review = fixture("create-minimal.json");
    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        json!("x".repeat(3 * 1024 * 1024));
    let (status, _) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // Just under the limit is fine.
    let mut review = fixture("create-minimal.json");
    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        json!("x".repeat(3 * 1024 * 1024 - 4096));
    let (status, body) = oneshot(&app, "POST", "/validate", bytes(&review)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response_of(&body)["allowed"], true);
}

/// A ConversionReview of `n` v1alpha1 AppServices, each padded to about `pad` bytes.
fn conversion_review(n: usize, pad: usize) -> Vec<u8> {
    let objects: Vec<Value> = (0..n)
        .map(|i| {
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": format!("app-{i}"), "namespace": "shop", "uid": format!("uid-{i}"),
                                "annotations": {"padding": "x".repeat(pad)}},
                   "spec": {"image": "registry.example.com/app:v1", "port": 8080}})
        })
        .collect();
    bytes(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "c-1", "desiredAPIVersion": "platform.example.com/v1beta1", "objects": objects}
    }))
}

#[tokio::test]
async fn convert_has_its_own_body_limit_above_the_admission_one() {
    let app = router(state(None));
    // A page of 500 objects of 10 KiB: over the 3 MiB admission limit, under /convert's 8 MiB.
    let body = conversion_review(500, 10 * 1024);
    assert!(body.len() > 3 * 1024 * 1024 && body.len() < 8 * 1024 * 1024);
    let (status, reply) = oneshot(&app, "POST", "/convert", body).await;
    assert_eq!(status, StatusCode::OK);
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["response"]["result"]["status"], "Success");
    let converted = reply["response"]["convertedObjects"].as_array().unwrap();
    assert_eq!(converted.len(), 500);
    assert_eq!(converted[499]["spec"]["ports"][0]["port"], 8080);

    // Over 8 MiB: refused before it is converted.
    let body = conversion_review(900, 10 * 1024);
    assert!(body.len() > 8 * 1024 * 1024);
    let (status, reply) = oneshot(&app, "POST", "/convert", body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        String::from_utf8_lossy(&reply).contains("limit of 8388608 bytes"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    // The admission endpoints keep their own limit.
    let (status, _) = oneshot(&app, "POST", "/validate", conversion_review(500, 10 * 1024)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn other_methods_and_paths() {
    let app = router(state(None));
    assert_eq!(
        oneshot(&app, "GET", "/validate", vec![]).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        oneshot(&app, "POST", "/nope", vec![]).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn ops_routes_report_metrics_and_readiness() {
    let state = state(None);
    let app = router(state.clone());
    oneshot(
        &app,
        "POST",
        "/validate",
        bytes(&fixture("create-invalid.json")),
    )
    .await;
    oneshot(
        &app,
        "POST",
        "/mutate",
        bytes(&fixture("create-minimal.json")),
    )
    .await;
    oneshot(&app, "POST", "/mutate", b"garbage".to_vec()).await;

    let ops = ops_router(state);
    assert_eq!(
        oneshot(&ops, "GET", "/healthz", vec![]).await.0,
        StatusCode::OK
    );
    // No certificate in this state: not ready.
    let (status, body) = oneshot(&ops, "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "no serving certificate loaded");
    let (status, body) = oneshot(&ops, "GET", "/metrics", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    for line in [
        r#"appservice_webhook_admission_requests_total{endpoint="validate",operation="CREATE",decision="denied"} 1"#,
        r#"appservice_webhook_admission_requests_total{endpoint="mutate",operation="CREATE",decision="patched"} 1"#,
        r#"appservice_webhook_admission_requests_total{endpoint="mutate",operation="unknown",decision="bad_request"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
