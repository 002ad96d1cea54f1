//! What both chart test binaries share: rendering the chart with `helm template` in each
//! certificate mode, and the release's names.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

pub const RELEASE: &str = "aso";

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
