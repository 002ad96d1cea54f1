//! The webhook's CEL policies against the API server's own CEL: every expression of the
//! table runs as a real ValidatingAdmissionPolicy (with a binding) on the harness's
//! kube-apiserver and as a webhook policy, on the same AppService, and the decisions (and
//! the messages, where the expression evaluates) must match. Expressions the API server
//! refuses when the policy is created must be refused by the webhook at load.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use common::AppService;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, DeleteParams, PostParams};
use kube::core::cel::AdmissionRequest as CelRequest;
use serde_json::{Value, json};
use webhook::policy::PolicySet;

/// What an expression does with the table's object.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Allowed,
    /// Denied with this message (the expression evaluated to false).
    Denied(String),
    /// Denied because the expression failed to evaluate.
    Error,
    /// Refused when the policy is created (API server) or loaded (webhook).
    Refused,
}

struct Case {
    expression: &'static str,
    message_expression: Option<&'static str>,
}

/// Accepted by the webhook, refused by the harness's kube-apiserver 1.37 when the
/// ValidatingAdmissionPolicy is created ("undeclared reference to 'cel'" / "'math'"):
/// its VAP environment does not declare the bindings and math libraries. The webhook
/// keeps them (kube-cel provides them); the table asserts both sides as measured.
const ONLY_IN_THE_WEBHOOK: [&str; 4] = [
    "cel.bind(r, object.spec.replicas, r * 2 == 6)",
    "cel.bind(names, object.spec.env.map(e, e.name), names.size() == 2 && 'LOG_LEVEL' in names)",
    "math.abs(object.spec.replicas - 10) < 5",
    "math.greatest(1, object.spec.replicas, 2) == 3",
];

const fn case(expression: &'static str) -> Case {
    Case {
        expression,
        message_expression: None,
    }
}

const CASES: &[Case] = &[
    case("object.spec.replicas >= 2"),
    case("object.spec.replicas > 5"),
    case("object.spec.port == 8080"),
    case("object.spec.env.all(e, !e.name.startsWith('AWS_'))"),
    case("object.spec.env.exists(e, e.name == 'LOG_LEVEL')"),
    case("object.spec.env.exists_one(e, e.name.startsWith('A'))"),
    case("object.spec.env.map(e, e.name).filter(n, n.endsWith('LEVEL')).size() == 1"),
    case("size(object.spec.env) == 2 && object.spec.env[0].value.upperAscii() == 'INFO'"),
    case("cel.bind(r, object.spec.replicas, r * 2 == 6)"),
    case(
        "cel.bind(names, object.spec.env.map(e, e.name), names.size() == 2 && 'LOG_LEVEL' in names)",
    ),
    case("sets.contains(['LOG_LEVEL', 'AWS_REGION', 'X'], object.spec.env.map(e, e.name))"),
    case("sets.intersects(['X'], object.spec.env.map(e, e.name))"),
    case("math.abs(object.spec.replicas - 10) < 5"),
    case("math.greatest(1, object.spec.replicas, 2) == 3"),
    case("object.metadata.labels['app.kubernetes.io/name'] == object.metadata.name"),
    case("'team' in object.metadata.labels && object.metadata.labels.team == 'payments'"),
    case("quantity(object.spec.resources.limits.memory).compareTo(quantity('128Mi')) > 0"),
    case("object.spec.image.matches('^registry[.]example[.]com/')"),
    case("object.spec.image.split(':')[1] == 'latest'"),
    Case {
        expression: "object.spec.image.endsWith(':latest')",
        message_expression: Some("'tag ' + object.spec.image.split(':')[1] + ' is not latest'"),
    },
    case("request.operation == 'CREATE' && request.namespace == object.metadata.__namespace__"),
    case("request.operation == 'CREATE' && request.namespace == object.metadata.namespace"),
    case("object.spec.replicas == 3 ? true : false"),
    case("!(!true) && -(-1) == 1"),
    case("[1, 2, 3].exists(x, x > 2) && [1, 2].map(x, x * 2) == [2, 4]"),
    case("has(object.spec.database)"),
    case("object.spec.missing == 1"),
    case(
        "object.metadata.name.size() <= 63 && object.metadata.name.lowerAscii() == object.metadata.name",
    ),
    case("url('https://example.com/a').getHost() == 'example.com'"),
    case("object.spec.replicas + 'a' == 'b'"),
    case("objet.spec.replicas > 0"),
    case("object.spec.replicas >"),
    case("[1].all(x, x > 0) && x > 0"),
];

fn object(name: &str, case: &str) -> Value {
    json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "AppService",
        "metadata": {"name": name, "labels": {
            "team": "payments", "app.kubernetes.io/name": name, "conformance-case": case}},
        "spec": {
            "image": "registry.example.com/app:v1.2.3",
            "replicas": 3,
            "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "AWS_REGION", "value": "eu"}],
            "resources": {"limits": {"memory": "256Mi"}}
        }
    })
}

/// What the API server answers for `value`, dry run.
async fn try_create(api: &Api<AppService>, value: Value) -> Result<(), String> {
    let app: AppService = serde_json::from_value(value).unwrap();
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&params, &app).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message.clone()),
        Err(other) => panic!("dry-run create: {other}"),
    }
}

#[tokio::test]
async fn webhook_policies_decide_like_validating_admission_policies() {
    support::install_provider();
    let cp = harness::shared().await.expect("control plane");
    let ns = cp.namespace().await.expect("namespace");
    let client = cp.client();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let apps: Api<AppService> = Api::namespaced(client.clone(), &ns);

    // The object as the API server sees it (defaults, metadata), for the webhook side.
    let seen: AppService = apps
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &serde_json::from_value(object("conf", "none")).unwrap(),
        )
        .await
        .unwrap();
    let seen = serde_json::to_value(&seen).unwrap();
    let request = CelRequest {
        operation: "CREATE".into(),
        namespace: ns.to_string(),
        name: "conf".into(),
        ..Default::default()
    };

    let prefix = format!("conf-{ns}");
    let mut server = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let name = format!("{prefix}-{i}");
        let mut validation =
            json!({"expression": case.expression, "message": format!("case {i} denied")});
        if let Some(m) = case.message_expression {
            validation["messageExpression"] = json!(m);
        }
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["platform.example.com"], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE"], "resources": ["appservices"]}]},
                "validations": [
                    {"expression": "!('sentinel' in object.metadata.labels)", "message": "sentinel"},
                    validation
                ]
            }
        });
        match policies
            .create(
                &PostParams::default(),
                &serde_json::from_value(policy).unwrap(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 422 => {
                println!(
                    "{:<90} API server refused: {}",
                    case.expression, status.message
                );
                server.push(Some(Outcome::Refused));
                continue;
            }
            Err(other) => panic!("creating {name}: {other}"),
        }
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.to_string()}},
                    "objectSelector": {"matchLabels": {"conformance-case": i.to_string()}}
                }
            }
        });
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(binding).unwrap(),
            )
            .await
            .unwrap();
        server.push(None);
    }

    // Wait until each policy is in effect (its sentinel denies), then ask.
    for (i, case) in CASES.iter().enumerate() {
        if server[i].is_some() {
            continue;
        }
        harness::eventually(
            &format!("policy {i} in effect"),
            Duration::from_secs(60),
            || async {
                let mut sentinel = object("sentinel", &i.to_string());
                sentinel["metadata"]["labels"]["sentinel"] = json!("1");
                try_create(&apps, sentinel)
                    .await
                    .is_err_and(|message| message.contains("sentinel"))
            },
        )
        .await
        .unwrap();
        let outcome = match try_create(&apps, object("conf", &i.to_string())).await {
            Ok(()) => Outcome::Allowed,
            Err(message) if message.contains("resulted in error") => Outcome::Error,
            Err(message) => {
                let text = message
                    .split_once("denied request: ")
                    .map_or(message.as_str(), |(_, m)| m);
                Outcome::Denied(text.to_owned())
            }
        };
        println!("{:<90} API server: {outcome:?}", case.expression);
        server[i] = Some(outcome);
    }

    // The same through the webhook's policies.
    let mut mismatches = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let mut yaml = format!(
            "policies:\n  - name: case\n    expression: {:?}\n    message: {:?}\n",
            case.expression,
            format!("case {i} denied")
        );
        if let Some(m) = case.message_expression {
            yaml.push_str(&format!("    messageExpression: {m:?}\n"));
        }
        let webhook = match PolicySet::from_yaml(Path::new("conformance.yaml"), &yaml) {
            Err(_) => Outcome::Refused,
            Ok(set) => match set
                .evaluate(seen.clone(), None, request.clone(), None)
                .pop()
            {
                None => Outcome::Allowed,
                Some(v) if v.message.starts_with("evaluation error") => Outcome::Error,
                Some(v) => Outcome::Denied(v.message),
            },
        };
        let expected = server[i].clone().unwrap();
        println!("{:<90} webhook: {webhook:?}", case.expression);
        if ONLY_IN_THE_WEBHOOK.contains(&case.expression) {
            if expected != Outcome::Refused || webhook == Outcome::Refused {
                mismatches.push(format!(
                    "{}: expected refused by the API server only; API server {expected:?}, webhook {webhook:?}",
                    case.expression
                ));
            }
            continue;
        }
        if webhook != expected {
            mismatches.push(format!(
                "{}: API server {expected:?}, webhook {webhook:?}",
                case.expression
            ));
        }
    }
    for i in 0..CASES.len() {
        let name = format!("{prefix}-{i}");
        let _ = bindings.delete(&name, &DeleteParams::default()).await;
        let _ = policies.delete(&name, &DeleteParams::default()).await;
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} expressions differ:\n{}",
        mismatches.len(),
        CASES.len(),
        mismatches.join("\n")
    );
}
