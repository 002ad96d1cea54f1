//! The `appservice-webhook` binary end to end: configuration from environment variables,
//! JSON logs, readiness, an admission over TLS, and a clean exit on SIGTERM.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use harness::binary::webhook_command;
use harness::{Binary, logged_addr};
use http::StatusCode;
use support::{TestCerts, bytes, fixture, get, response_of};
use tokio::process::Command;

/// Upper bound of any wait; reaching it is a failure, not a timing assertion.
const GIVE_UP: Duration = Duration::from_secs(60);

#[tokio::test]
async fn runs_from_environment_logs_json_and_stops_on_sigterm() {
    let certs = TestCerts::new();
    let policies = certs.dir.path().join("policies.yaml");
    std::fs::write(
        &policies,
        "policies:\n  - {name: always, expression: 'true', message: never shown}\n",
    )
    .unwrap();
    let mut command = webhook_command(
        env!("CARGO_BIN_EXE_appservice-webhook"),
        &certs.cert_path,
        &certs.key_path,
    );
    command
        .env("WEBHOOK_POLICIES", &policies)
        .env("WEBHOOK_SHUTDOWN_TIMEOUT", "5s");
    let mut webhook = Binary::spawn(command).unwrap();
    let loaded = webhook
        .wait_message("policies loaded", GIVE_UP)
        .await
        .unwrap();
    assert_eq!(loaded["policies"], 1);
    let serving = webhook
        .wait_message("webhook serving", GIVE_UP)
        .await
        .unwrap();
    let tls = logged_addr(&serving, "tls_addr").unwrap();
    let ops = logged_addr(&serving, "ops_addr").unwrap();

    assert_eq!(get(ops, "/readyz").await.0, StatusCode::OK);
    let review = fixture("create-invalid.json");
    let reply = certs
        .client()
        .post(tls, "/validate", bytes(&review), false)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(response_of(&reply.body)["allowed"], false);

    // One line per review, with what is needed to find it.
    let logged = webhook
        .wait_message("admission denied", GIVE_UP)
        .await
        .unwrap();
    assert_eq!(logged["uid"], review["request"]["uid"]);
    assert_eq!(logged["namespace"], "dev");
    assert_eq!(logged["name"], "Bad_Name");
    assert_eq!(logged["operation"], "CREATE");
    assert_eq!(logged["decision"], "denied");
    assert_eq!(logged["level"], "INFO");

    harness::process::signal(webhook.pid, "TERM").unwrap();
    for message in ["shutdown requested; draining", "webhook stopped"] {
        webhook.wait_message(message, GIVE_UP).await.unwrap();
    }
    let status = webhook.child.wait().await.unwrap();
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn refuses_to_start_without_a_usable_certificate() {
    let certs = TestCerts::new();
    std::fs::write(&certs.key_path, "not a key").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_appservice-webhook"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ops-listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .arg("--tls-cert")
        .arg(&certs.cert_path)
        .arg("--tls-key")
        .arg(&certs.key_path)
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    let (ok, _, stderr) = harness::process::outcome(&output);
    assert!(!ok);
    assert!(
        stderr.contains("webhook failed") && stderr.contains("tls.key"),
        "{stderr}"
    );
}
