//! One rule, enforced in two places, must not drift apart.
//!
//! The bounds of an AppService are written twice: as the CRD's schema and CEL rules,
//! which the API server enforces, and as `common::validate`, which the webhook and the
//! controller run. Each case below sits on a bound or just past it. Every one is sent to
//! a real API server (a dry-run create in the stored version, no webhook registered, so
//! only the CRD decides) and to `common::validate` (after `common` defaults, as the
//! webhook sees it), and the two verdicts must be the expected ones. A CRD bound changed
//! without the Rust rule (or the reverse) fails here.
//!
//! The Rust rules may be stricter than the CRD, never looser: wherever the API server
//! refuses, `common::validate` must refuse too. Where only Rust refuses (an image
//! reference the schema cannot parse, say), the case says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use common::AppService;
use common::types::{
    MAX_CLASS_LEN, MAX_ENV, MAX_ENV_NAME_LEN, MAX_ENV_VALUE_LEN, MAX_ID, MAX_IMAGE_LEN, MAX_PORT,
    MAX_PORT_NAME_LEN, MAX_PORTS, MAX_REPLICAS, MAX_RESOURCE_ENTRIES, MAX_ROLLOUT_PERCENT,
    MIN_CANARY_REPLICAS, MIN_ID, MIN_NON_ROOT_UID, MIN_PORT, MIN_REPLICAS,
};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

/// Who accepts a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Both,
    Neither,
    /// The API server accepts, `common::validate` refuses (a stricter semantic rule).
    OnlyApiServer,
}

fn base() -> Value {
    json!({"image": "registry.example.com/app:v1"})
}

fn with(key: &str, value: Value) -> Value {
    let mut spec = base();
    spec[key] = value;
    spec
}

fn port(name: &str, number: i64) -> Value {
    json!({"name": name, "port": number, "protocol": "TCP"})
}

fn ports(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| port(&format!("p{i}"), 8000 + i as i64))
            .collect(),
    )
}

fn env(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("VAR_{i}"), "value": "x"}))
            .collect(),
    )
}

/// `resources` with `n` extended resources under `which` (`limits` or `requests`).
fn resources(which: &str, n: usize) -> Value {
    let entries: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("example.com/device-{i}"), json!("1")))
        .collect();
    json!({ which: entries })
}

/// A DNS subdomain of exactly `len` characters (labels of at most 63).
fn subdomain(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        if !out.is_empty() {
            out.push('.');
        }
        let room = (len - out.len()).min(63);
        out.push_str(&"a".repeat(room));
    }
    out
}

fn cases() -> Vec<(&'static str, Value, Verdict)> {
    use Verdict::*;
    let image_of = |len: usize| {
        // registry.example.com/<path>:v1, the path split into components the grammar allows.
        let fixed = "registry.example.com/".len() + ":v1".len();
        let mut path = String::new();
        while path.len() < len - fixed {
            if !path.is_empty() {
                path.push('/');
            }
            let room = (len - fixed - path.len()).min(40);
            path.push_str(&"a".repeat(room));
        }
        format!("registry.example.com/{path}:v1")
    };
    vec![
        ("a plain spec", base(), Both),
        ("an empty image", with("image", json!("")), Neither),
        (
            "an image of 255 characters",
            with("image", json!(image_of(255))),
            Both,
        ),
        (
            "an image at the schema's length bound (its name too long to pull)",
            with("image", json!(image_of(MAX_IMAGE_LEN))),
            OnlyApiServer,
        ),
        (
            "an image past the length bound",
            with("image", json!(image_of(MAX_IMAGE_LEN + 1))),
            Neither,
        ),
        (
            "replicas at the lower bound",
            with("replicas", json!(MIN_REPLICAS)),
            Both,
        ),
        (
            "replicas at the upper bound",
            with("replicas", json!(MAX_REPLICAS)),
            Both,
        ),
        (
            "replicas below the bound",
            with("replicas", json!(MIN_REPLICAS - 1)),
            Neither,
        ),
        (
            "replicas above the bound",
            with("replicas", json!(MAX_REPLICAS + 1)),
            Neither,
        ),
        (
            "the lowest port",
            with("ports", json!([port("http", MIN_PORT.into())])),
            Both,
        ),
        (
            "the highest port",
            with("ports", json!([port("http", MAX_PORT.into())])),
            Both,
        ),
        (
            "port 0",
            with("ports", json!([port("http", i64::from(MIN_PORT) - 1)])),
            Neither,
        ),
        (
            "a port too high",
            with("ports", json!([port("http", i64::from(MAX_PORT) + 1)])),
            Neither,
        ),
        ("the most ports", with("ports", ports(MAX_PORTS)), Both),
        (
            "one port too many",
            with("ports", ports(MAX_PORTS + 1)),
            Neither,
        ),
        (
            "a port name at the length bound",
            with("ports", json!([port(&"a".repeat(MAX_PORT_NAME_LEN), 80)])),
            Both,
        ),
        (
            "a port name past the length bound",
            with(
                "ports",
                json!([port(&"a".repeat(MAX_PORT_NAME_LEN + 1), 80)]),
            ),
            Neither,
        ),
        (
            "an empty port name",
            with("ports", json!([port("", 80)])),
            Neither,
        ),
        (
            "two ports of one name",
            with("ports", json!([port("http", 80), port("http", 81)])),
            Neither,
        ),
        (
            "one number twice for one protocol",
            with("ports", json!([port("a", 80), port("b", 80)])),
            Neither,
        ),
        (
            "one number for two protocols",
            with(
                "ports",
                json!([port("a", 53), {"name": "b", "port": 53, "protocol": "UDP"}]),
            ),
            Both,
        ),
        (
            "an unknown protocol",
            with(
                "ports",
                json!([{"name": "a", "port": 80, "protocol": "HTTP"}]),
            ),
            Neither,
        ),
        (
            "the most resource limits",
            with("resources", resources("limits", MAX_RESOURCE_ENTRIES)),
            Both,
        ),
        (
            "one resource request too many",
            with("resources", resources("requests", MAX_RESOURCE_ENTRIES + 1)),
            Neither,
        ),
        ("the most env vars", with("env", env(MAX_ENV)), Both),
        (
            "one env var too many",
            with("env", env(MAX_ENV + 1)),
            Neither,
        ),
        (
            "an env name at the length bound",
            with(
                "env",
                json!([{"name": "A".repeat(MAX_ENV_NAME_LEN), "value": "x"}]),
            ),
            Both,
        ),
        (
            "an env name past the length bound",
            with(
                "env",
                json!([{"name": "A".repeat(MAX_ENV_NAME_LEN + 1), "value": "x"}]),
            ),
            Neither,
        ),
        (
            "an env value at the length bound",
            with(
                "env",
                json!([{"name": "A", "value": "x".repeat(MAX_ENV_VALUE_LEN)}]),
            ),
            Both,
        ),
        (
            "an env value past the length bound",
            with(
                "env",
                json!([{"name": "A", "value": "x".repeat(MAX_ENV_VALUE_LEN + 1)}]),
            ),
            Neither,
        ),
        (
            "two env vars of one name",
            with(
                "env",
                json!([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
            ),
            Neither,
        ),
        (
            "a database class at the length bound",
            with("database", json!({"class": subdomain(MAX_CLASS_LEN)})),
            Both,
        ),
        (
            "a database class past the length bound",
            with("database", json!({"class": subdomain(MAX_CLASS_LEN + 1)})),
            Neither,
        ),
        (
            "an empty database class",
            with("database", json!({"class": ""})),
            Neither,
        ),
        ("an empty podSecurity", with("podSecurity", json!({})), Both),
        (
            "every id at its upper bound",
            with(
                "podSecurity",
                json!({"runAsUser": MAX_ID, "runAsGroup": MAX_ID, "fsGroup": MAX_ID,
                       "readOnlyRootFilesystem": true}),
            ),
            Both,
        ),
        (
            "group ids at their lower bound",
            with(
                "podSecurity",
                json!({"runAsGroup": MIN_ID, "fsGroup": MIN_ID}),
            ),
            Both,
        ),
        (
            "the lowest non-root user",
            with("podSecurity", json!({"runAsUser": MIN_NON_ROOT_UID})),
            Both,
        ),
        (
            "root under the default profile",
            with("podSecurity", json!({"runAsUser": MIN_ID})),
            Neither,
        ),
        (
            "root under Restricted",
            with(
                "podSecurity",
                json!({"profile": "Restricted", "runAsUser": MIN_ID}),
            ),
            Neither,
        ),
        (
            "root under Baseline",
            with(
                "podSecurity",
                json!({"profile": "Baseline", "runAsUser": MIN_ID}),
            ),
            Both,
        ),
        (
            "a user id past the upper bound",
            with("podSecurity", json!({"runAsUser": MAX_ID + 1})),
            Neither,
        ),
        (
            "a group id below the lower bound",
            with("podSecurity", json!({"runAsGroup": MIN_ID - 1})),
            Neither,
        ),
        (
            "an fsGroup past the upper bound",
            with(
                "podSecurity",
                json!({"profile": "Baseline", "fsGroup": MAX_ID + 1}),
            ),
            Neither,
        ),
        (
            "an unknown profile",
            with("podSecurity", json!({"profile": "Privileged"})),
            Neither,
        ),
        ("an empty rollout", with("rollout", json!({})), Both),
        (
            "rollout settings at their bounds",
            with(
                "rollout",
                json!({"maxSurge": 0, "maxUnavailable": format!("{MAX_ROLLOUT_PERCENT}%")}),
            ),
            Both,
        ),
        (
            "rollout percentages with leading zeros",
            with(
                "rollout",
                json!({"maxSurge": "0%", "maxUnavailable": "007%"}),
            ),
            Both,
        ),
        (
            "one rollout setting 0, the other defaulted",
            with("rollout", json!({"maxUnavailable": "0%"})),
            Both,
        ),
        (
            "a negative maxSurge",
            with("rollout", json!({"maxSurge": -1})),
            Neither,
        ),
        (
            "a maxUnavailable past 100%",
            with(
                "rollout",
                json!({"maxUnavailable": format!("{}%", MAX_ROLLOUT_PERCENT + 1)}),
            ),
            Neither,
        ),
        (
            "a number as a string",
            with("rollout", json!({"maxSurge": "5"})),
            Neither,
        ),
        (
            "a canary of one replica, both defaulted",
            with("canary", json!({"image": "registry.example.com/app:v2"})),
            Both,
        ),
        (
            "a canary of every replica",
            {
                let mut spec = with(
                    "canary",
                    json!({"image": "registry.example.com/app:v2", "replicas": 3}),
                );
                spec["replicas"] = json!(3);
                spec
            },
            Both,
        ),
        (
            "a canary of more replicas than the AppService",
            {
                let mut spec = with(
                    "canary",
                    json!({"image": "registry.example.com/app:v2", "replicas": 4}),
                );
                spec["replicas"] = json!(3);
                spec
            },
            Neither,
        ),
        (
            "a canary of no replica",
            with(
                "canary",
                json!({"image": "registry.example.com/app:v2", "replicas": MIN_CANARY_REPLICAS - 1}),
            ),
            Neither,
        ),
        (
            "a canary without an image",
            with("canary", json!({"replicas": 1})),
            Neither,
        ),
        (
            "a canary image of a pullable length",
            with("canary", json!({"image": image_of(255)})),
            Both,
        ),
        (
            "a canary image at the schema's length bound, as spec.image",
            with("canary", json!({"image": image_of(MAX_IMAGE_LEN)})),
            OnlyApiServer,
        ),
        (
            "a canary image past the length bound",
            with("canary", json!({"image": image_of(MAX_IMAGE_LEN + 1)})),
            Neither,
        ),
        (
            "a canary image that does not parse",
            with("canary", json!({"image": "Nginx:1.0"})),
            OnlyApiServer,
        ),
        (
            "both rollout settings 0",
            with("rollout", json!({"maxSurge": 0, "maxUnavailable": "0%"})),
            Neither,
        ),
    ]
}

/// Whether the API server accepts `spec` (a dry-run create: nothing is stored). Sent as
/// raw JSON: some cases are not even expressible in the Rust types.
async fn api_server_accepts(api: &Api<DynamicObject>, name: &str, spec: &Value) -> bool {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1",
        "kind": "AppService",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&params, &obj).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 422 => false,
        Err(e) => panic!("{name}: the API server did not answer with a verdict: {e}"),
    }
}

/// Whether `common::validate` accepts `spec`, after `common`'s defaults. A spec the
/// Rust types cannot decode is refused (the webhook answers such a body with an error).
fn rust_accepts(name: &str, spec: &Value) -> bool {
    let Ok(mut obj) = serde_json::from_value::<AppService>(json!({
        "apiVersion": "platform.example.com/v1beta1",
        "kind": "AppService",
        "metadata": {"name": name, "namespace": "drift"},
        "spec": spec,
    })) else {
        return false;
    };
    common::defaults::default_object(&mut obj);
    common::validation::validate(&obj, None).is_ok()
}

#[tokio::test]
async fn the_crd_and_common_validate_agree_at_every_bound() {
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();
    let resource = ApiResource::erase::<AppService>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(cp.client(), &ns, &resource);
    let mut disagreements = Vec::new();
    for (i, (what, spec, expected)) in cases().into_iter().enumerate() {
        let name = format!("case-{i}");
        let server = api_server_accepts(&api, &name, &spec).await;
        let rust = rust_accepts(&name, &spec);
        let verdict = match (server, rust) {
            (true, true) => Verdict::Both,
            (false, false) => Verdict::Neither,
            (true, false) => Verdict::OnlyApiServer,
            (false, true) => {
                disagreements.push(format!(
                    "{what}: the API server refuses it but common::validate accepts it"
                ));
                continue;
            }
        };
        if verdict != expected {
            disagreements.push(format!("{what}: expected {expected:?}, got {verdict:?}"));
        }
    }
    assert!(
        disagreements.is_empty(),
        "the CRD and common::validate disagree:\n{}",
        disagreements.join("\n")
    );
}
