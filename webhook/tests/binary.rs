//! The `appservice-webhook` binary end to end: configuration from environment variables,
//! JSON logs, readiness, an admission over TLS, and a clean exit on SIGTERM.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::Stdio;

use http::StatusCode;
use serde_json::Value;
use support::{TestCerts, bytes, fixture, get, response_of};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Reads JSON log lines until one has `message`; returns it.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    message: &str,
    seen: &mut Vec<Value>,
) -> Value {
    while let Some(line) = lines.next_line().await.unwrap() {
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        seen.push(value.clone());
        if value["message"] == message {
            return value;
        }
    }
    panic!("the webhook exited before logging {message:?}; logged: {seen:#?}");
}

#[tokio::test]
async fn runs_from_environment_logs_json_and_stops_on_sigterm() {
    let certs = TestCerts::new();
    let policies = certs.dir.path().join("policies.yaml");
    std::fs::write(
        &policies,
        "policies:\n  - {name: always, expression: 'true', message: never shown}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_appservice-webhook"))
        .env_clear()
        .env("RUST_LOG", "info")
        .env("WEBHOOK_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_OPS_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_TLS_CERT", &certs.cert_path)
        .env("WEBHOOK_TLS_KEY", &certs.key_path)
        .env("WEBHOOK_POLICIES", &policies)
        .env("WEBHOOK_SHUTDOWN_TIMEOUT", "5s")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let loaded = wait_for_line(&mut lines, "policies loaded", &mut seen).await;
    assert_eq!(loaded["policies"], 1);
    let serving = wait_for_line(&mut lines, "webhook serving", &mut seen).await;
    let tls: SocketAddr = serving["tls_addr"].as_str().unwrap().parse().unwrap();
    let ops: SocketAddr = serving["ops_addr"].as_str().unwrap().parse().unwrap();

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
    let logged = wait_for_line(&mut lines, "admission denied", &mut seen).await;
    assert_eq!(logged["uid"], review["request"]["uid"]);
    assert_eq!(logged["namespace"], "dev");
    assert_eq!(logged["name"], "Bad_Name");
    assert_eq!(logged["operation"], "CREATE");
    assert_eq!(logged["decision"], "denied");
    assert_eq!(logged["level"], "INFO");

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    wait_for_line(&mut lines, "shutdown requested; draining", &mut seen).await;
    wait_for_line(&mut lines, "webhook stopped", &mut seen).await;
    let status = child.wait().await.unwrap();
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
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("webhook failed") && stderr.contains("tls.key"),
        "{stderr}"
    );
}
