//! `appservice-migrate-storage`, the binary the chart's hook Job runs, against a real
//! API server: it refuses a CRD that does not store `v1beta1` (exit 1, nothing written),
//! and with the current CRD rewrites every AppService and reports `storedVersions`.
//! The migration itself (twice, while the controller runs, checked in etcd) is
//! `e2e/tests/upgrade.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use common::AppService;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Runs the binary with the control plane's kubeconfig: (exit success, stdout, stderr).
async fn migrate(cp: &harness::ControlPlane) -> (bool, String, String) {
    let output = cp
        .command(env!("CARGO_BIN_EXE_appservice-migrate-storage"))
        .output()
        .await
        .unwrap();
    harness::process::outcome(&output)
}

#[tokio::test]
async fn the_binary_refuses_an_old_crd_and_migrates_with_the_new_one() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cp = harness::ControlPlane::start(harness::Options::plain())
        .await
        .unwrap();
    let _logs = cp.log_guard();
    let ns = cp.namespace().await.unwrap();

    // The previous release's CRD: refused, and its storedVersions stay as they are.
    let old = harness::load_crd(
        &harness::assets::workspace_root()
            .join("e2e/fixtures/upgrade/appservices-v1alpha1-crd.yaml"),
    )
    .unwrap();
    cp.replace_crd(&old).await.unwrap();
    let (ok, _, stderr) = migrate(&cp).await;
    assert!(!ok, "the migration ran against a v1alpha1-only CRD");
    assert!(
        stderr.contains("stores Some(\"v1alpha1\"), not v1beta1"),
        "{stderr}"
    );

    // The current CRD (v1beta1 stored, which the harness installs): two AppServices
    // rewritten, storedVersions reported.
    cp.replace_crd(&harness::load_crd(&harness::appservice_crd_path()).unwrap())
        .await
        .unwrap();
    let apps: Api<AppService> = Api::namespaced(cp.client(), ns.name());
    for name in ["one", "two"] {
        let app: AppService = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
            "metadata": {"name": name},
            "spec": {"image": "registry.example.com/app:v1"}
        }))
        .unwrap();
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let (ok, stdout, stderr) = migrate(&cp).await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("rewrote 2 AppServices")
            && stdout.contains("storedVersions: [\"v1beta1\"]"),
        "{stdout}"
    );
    ns.cleanup().await.unwrap();
}
