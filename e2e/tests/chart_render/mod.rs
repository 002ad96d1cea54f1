//! What both chart test binaries share: rendering the chart with `helm template` in each
//! certificate mode, the release's names, and the small assertions on refusals.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use common::AppService;
use kube::Client;
use serde_json::{Value, json};

pub const RELEASE: &str = "aso";

/// The namespace `installed()` excludes through `controller.excludeNamespaces`.
pub const EXCLUDED_BY_VALUE: &str = "aso-excluded";

/// The controller's admission policy (and its binding) as the chart names it.
pub const OWNED_POLICY: &str = "aso-appservice-operator-controller-owned-objects";

pub const WEBHOOK: &str = "aso-appservice-operator-webhook";

pub const CONTROLLER: &str = "aso-appservice-operator-controller";

pub fn chart_dir() -> PathBuf {
    harness::assets::workspace_root().join("charts/appservice-operator")
}

pub fn helm() -> PathBuf {
    harness::assets::bin_dir()
        .expect("asset binaries (cargo xtask assets)")
        .join("helm")
}

/// Runs helm; returns (success, stdout, stderr).
pub fn run_helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm())
        .args(args)
        // A private helm home: no repositories, plugins or caches of the user's.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("aso-helm/config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("aso-helm/cache"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("aso-helm/data"))
        .output()
        .expect("running helm");
    harness::process::outcome(&out)
}

/// Values for a certificate mode, as `--set` arguments.
pub fn mode_values(mode: &str) -> Vec<String> {
    let mut set = vec![format!("certificates.mode={mode}")];
    if mode == "secret" {
        set.push("certificates.existingSecret=my-webhook-tls".into());
        set.push(
            "certificates.caBundle=-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----"
                .into(),
        );
    }
    set
}

pub fn with_sets(base: &[&str], sets: &[String]) -> Vec<String> {
    let mut args: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    args
}

pub fn template(namespace: &str, sets: &[String]) -> Vec<Value> {
    let chart = chart_dir();
    let args = with_sets(
        &[
            "template",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            namespace,
        ],
        sets,
    );
    let (ok, stdout, stderr) = run_helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "helm template {sets:?} failed: {stderr}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).expect("helm renders YAML");
    docs.into_iter().filter(|d| d.is_object()).collect()
}

/// `helm template` with `sets`, which the chart must refuse: its error output.
pub fn template_refused(sets: &[&str]) -> String {
    let chart = chart_dir();
    let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
    let args = with_sets(&["template", RELEASE, chart.to_str().unwrap()], &sets);
    let (ok, _, stderr) = run_helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok, "{sets:?} must be rejected");
    stderr
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered chart"))
}

pub const MIGRATE: &str = "aso-appservice-operator-migrate";

/// The `from` of the webhook NetworkPolicy's rule for the webhook port.
pub fn webhook_port_peers(docs: &[Value]) -> Value {
    let policy = find(docs, "NetworkPolicy", WEBHOOK);
    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    let rule = rules
        .iter()
        .find(|r| r["ports"][0]["port"] == "https")
        .expect("a rule for the webhook port");
    rule["from"].clone()
}

/// A write the controller's identity made, refused by the chart's admission policy (not
/// by RBAC, which allows the verb): 403 naming the policy, and `expected` in its message.
pub fn refused_by_policy<T: std::fmt::Debug>(result: Result<T, kube::Error>, expected: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains(&format!("ValidatingAdmissionPolicy '{OWNED_POLICY}'")),
                "not refused by the policy: {}",
                status.message
            );
            assert!(
                status.message.contains(expected),
                "expected {expected:?} in: {}",
                status.message
            );
        }
        other => panic!("expected the policy to refuse this write ({expected}), got {other:?}"),
    }
}

/// Objects for the policy tests, as the given owner (an AppService) and labels say.
pub fn object<T: serde::de::DeserializeOwned>(
    kind: &str,
    name: &str,
    owner: Option<&AppService>,
    labelled: bool,
) -> T {
    let mut meta = json!({"name": name});
    if labelled {
        meta["labels"] = json!({common::names::LABEL_MANAGED_BY: common::names::MANAGED_BY});
    }
    if let Some(app) = owner {
        meta["ownerReferences"] = json!([{
            "apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "name": app.metadata.name, "uid": app.metadata.uid, "controller": true,
        }]);
    }
    let body = match kind {
        "Deployment" => json!({
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.example.com/x:v1"}]}
                }
            }
        }),
        "Service" => json!({"metadata": meta, "spec": {"ports": [{"port": 80}]}}),
        "Secret" => json!({"metadata": meta, "stringData": {"k": "v"}}),
        other => panic!("no template for {other}"),
    };
    serde_json::from_value(body).expect("object")
}

/// A client that acts as `user` (the admin impersonating them), as a tenant's kubectl would.
pub fn impersonating(cp: &harness::ControlPlane, user: &str) -> Client {
    let mut config = cp.admin_config();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).expect("impersonating client")
}

/// `result` is the shard-labels policy's refusal (403, its name and its reason).
pub fn shard_label_refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(
                status.message.contains(&format!(
                    "ValidatingAdmissionPolicy '{CONTROLLER}-shard-labels'"
                )) && status
                    .message
                    .contains("they decide which controller shard writes it"),
                "{what}: not refused by the shard-labels policy: {}",
                status.message
            );
        }
        other => panic!("{what}: expected the shard-labels policy to refuse it, got {other:?}"),
    }
}

/// Whether `result` is the API server's 403.
pub fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

pub fn tenant_app(name: &str) -> AppService {
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": name},
        "spec": {"image": "registry.example.com/hello:v1.0.0", "replicas": 1}
    }))
    .unwrap()
}
