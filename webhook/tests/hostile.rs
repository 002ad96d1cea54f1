//! The real `appservice-webhook` binary under hostile input, over real TLS: large and
//! many-valued bodies, deep nesting, long strings, slow headers, idle floods, rapid
//! HTTP/2 resets, a full connection cap, and empty or torn policy files. Memory is read
//! from the process (`/proc/<pid>/status`: VmHWM after resetting it through
//! `clear_refs`, and VmRSS), never estimated.
//!
//! Nothing asserts on speed. Timeouts are configured small (1 s) and a connection is
//! only required to be closed within a generous bound.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use harness::Binary;
use harness::binary::{ServingWebhook, start_webhook, webhook_command};
use http::StatusCode;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use support::{TestCerts, bytes, fixture, get, response_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Upper bound of any wait; reaching it is a failure, not a timing assertion.
const GIVE_UP: Duration = Duration::from_secs(60);

/// A running webhook binary and what it logged.
struct Webhook {
    child: Child,
    pid: u32,
    tls: SocketAddr,
    ops: SocketAddr,
    logs: mpsc::UnboundedReceiver<Value>,
}

impl Webhook {
    /// Starts the binary with the test certificates and `env`; waits until it serves.
    async fn start(certs: &TestCerts, env: &[(&str, &str)]) -> Webhook {
        let mut command = webhook_command(
            env!("CARGO_BIN_EXE_appservice-webhook"),
            &certs.cert_path,
            &certs.key_path,
        );
        command
            .env("WEBHOOK_SHUTDOWN_DELAY", "0s")
            .env("WEBHOOK_RELOAD_INTERVAL", "100ms")
            .envs(env.iter().copied());
        let ServingWebhook {
            binary: Binary { child, pid, logs },
            tls,
            ops,
        } = start_webhook(command, GIVE_UP).await.unwrap();
        Webhook {
            child,
            pid,
            tls,
            ops,
            logs,
        }
    }

    /// A field of `/proc/<pid>/status`, in bytes.
    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field} missing from /proc/{}/status", self.pid));
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    fn rss(&self) -> u64 {
        self.status_bytes("VmRSS:")
    }

    /// Resets VmHWM to the current RSS (`echo 5 > /proc/<pid>/clear_refs`).
    fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").unwrap();
    }

    fn peak(&self) -> u64 {
        self.status_bytes("VmHWM:")
    }

    /// Waits for a log line with `message`.
    async fn logged(&mut self, message: &str) -> Value {
        tokio::time::timeout(GIVE_UP, async {
            while let Some(line) = self.logs.recv().await {
                if line["message"] == message {
                    return line;
                }
            }
            panic!("the webhook exited before logging {message:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {message:?} logged"))
    }

    async fn metric(&self, prefix: &str) -> f64 {
        let (_, text) = get(self.ops, "/metrics").await;
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix} missing from the metrics"))
    }

    async fn terminate(mut self) {
        harness::process::signal(self.pid, "TERM").unwrap();
        let status = tokio::time::timeout(GIVE_UP, self.child.wait())
            .await
            .expect("the webhook did not stop")
            .unwrap();
        assert!(status.success(), "exit status {status}");
    }
}

/// A review of the realistic fixture with `object.spec` (and `oldObject.spec` on UPDATE)
/// extended by `extend`.
fn review_with(operation: &str, extend: impl Fn(&mut Value)) -> Vec<u8> {
    let mut review = fixture("create-minimal.json");
    review["request"]["operation"] = json!(operation);
    extend(&mut review["request"]["object"]);
    if operation == "UPDATE" {
        review["request"]["oldObject"] = review["request"]["object"].clone();
    }
    bytes(&review)
}

/// Sends `body` to `path` and returns the status and, for 200, the review's response.
async fn send(
    certs: &TestCerts,
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let reply = certs.client().post(addr, path, body, false).await.unwrap();
    let response = if reply.status == StatusCode::OK {
        response_of(&reply.body)
    } else {
        Value::String(String::from_utf8_lossy(&reply.body).into_owned())
    };
    (reply.status, response)
}

/// Bodies of about 2.5 MiB, each a different shape, with the answer each must get.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>, StatusCode, Option<bool>)> {
    const SIZE: usize = 2_500_000;
    let long_values = review_with("UPDATE", |o| {
        // 100 env values of 12 KiB: a valid object, carried twice (object, oldObject).
        let env: Vec<Value> = (0..100)
            .map(|i| json!({"name": format!("V{i}"), "value": "x".repeat(12 * 1024)}))
            .collect();
        o["spec"]["env"] = json!(env);
    });
    let many_env = review_with("CREATE", |o| {
        let env: Vec<Value> = (0..SIZE / 20)
            .map(|i| json!({"name": format!("V{i}")}))
            .collect();
        o["spec"]["env"] = json!(env);
    });
    let many_numbers = review_with("CREATE", |o| {
        o["spec"]["future"] = json!(vec![0; SIZE / 2]);
    });
    let many_annotations = review_with("CREATE", |o| {
        let annotations: serde_json::Map<String, Value> = (0..SIZE / 16)
            .map(|i| (format!("a{i}"), json!("")))
            .collect();
        o["metadata"]["annotations"] = Value::Object(annotations);
    });
    let long_string = review_with("CREATE", |o| {
        o["metadata"]["annotations"]["note"] = json!("y".repeat(SIZE));
    });
    let deep = {
        let review = String::from_utf8(review_with("CREATE", |o| {
            o["spec"]["future"] = json!("DEEP");
        }))
        .unwrap();
        let depth = SIZE / 2;
        review.replace(
            "\"DEEP\"",
            &format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
        )
    };
    vec![
        ("long values", long_values, StatusCode::OK, Some(true)),
        ("many env entries", many_env, StatusCode::OK, Some(false)),
        ("many numbers", many_numbers, StatusCode::OK, None),
        ("many annotations", many_annotations, StatusCode::OK, None),
        ("a long string", long_string, StatusCode::OK, None),
        ("deep nesting", deep.into_bytes(), StatusCode::OK, None),
    ]
}

/// Peak memory of one review stays within 4x its body, for every shape, with and
/// without policies (which need a generic copy of the object).
#[tokio::test]
async fn memory_per_review_stays_within_four_times_its_body() {
    let certs = TestCerts::new();
    let policies = certs.write_policies("policies:\n  - {name: has-image, expression: \"object.spec.image != ''\", message: needs an image}\n");
    let bodies = hostile_bodies();
    for (shape, body, _, _) in &bodies {
        assert!(
            body.len() < 3 * 1024 * 1024,
            "{shape}: {} B is over the body limit",
            body.len()
        );
    }
    // A fresh process per case: memory freed by one case and kept by the allocator
    // must not hide the next case's peak.
    let path = policies.to_string_lossy().into_owned();
    for with_policies in [false, true] {
        let mut env = vec![];
        if with_policies {
            env.push(("WEBHOOK_POLICIES", path.as_str()));
        }
        for (shape, body, status, allowed) in &bodies {
            for endpoint in ["/mutate", "/validate"] {
                let webhook = Webhook::start(&certs, &env).await;
                // Warm up: TLS, the runtime's threads, first allocations.
                for warm in ["/mutate", "/validate"] {
                    let (status, _) = send(
                        &certs,
                        webhook.tls,
                        warm,
                        bytes(&fixture("create-minimal.json")),
                    )
                    .await;
                    assert_eq!(status, StatusCode::OK);
                }
                let before = webhook.rss();
                webhook.reset_peak();
                let (got, response) = send(&certs, webhook.tls, endpoint, body.clone()).await;
                let extra = webhook.peak().saturating_sub(before);
                let size = body.len() as u64;
                println!(
                    "policies={with_policies} {endpoint} {shape}: body {size} B, peak extra {extra} B ({:.2}x)",
                    extra as f64 / size as f64
                );
                assert_eq!(got, *status, "{shape} {endpoint}: {response}");
                if let Some(allowed) = allowed {
                    assert_eq!(
                        response["allowed"], *allowed,
                        "{shape} {endpoint}: {response}"
                    );
                }
                assert!(
                    extra <= 4 * size,
                    "{shape} {endpoint} (policies: {with_policies}): peak extra memory {extra} B > 4x the body ({size} B)"
                );
                webhook.terminate().await;
            }
        }
    }
}

/// 30,000 env entries are refused with the limit named, by both endpoints, before the
/// entries are decoded (the mutating webhook sees objects before the CRD's maxItems).
#[tokio::test]
async fn oversized_lists_are_denied_naming_the_limit() {
    let certs = TestCerts::new();
    let webhook = Webhook::start(&certs, &[]).await;
    let body = review_with("CREATE", |o| {
        let env: Vec<Value> = (0..30_000)
            .map(|i| json!({"name": format!("V{i}"), "value": "1"}))
            .collect();
        o["spec"]["env"] = json!(env);
    });
    for path in ["/mutate", "/validate"] {
        let (status, response) = send(&certs, webhook.tls, path, body.clone()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 422);
        assert_eq!(
            response["status"]["message"],
            "spec.env: Too many: 30000: must have at most 128 items"
        );
    }
    webhook.terminate().await;
}

/// Many large reviews at once: the in-flight budget holds them back (queueing, not an
/// out-of-memory kill), every one is answered, and the memory is returned afterwards.
#[tokio::test]
async fn a_burst_is_bounded_and_its_memory_returned() {
    let certs = TestCerts::new();
    // A budget of two maximal bodies: the burst of 16 queues.
    let budget = (2 * 3 * 1024 * 1024).to_string();
    let webhook = Webhook::start(&certs, &[("WEBHOOK_MAX_IN_FLIGHT_BYTES", budget.as_str())]).await;
    let body = review_with("UPDATE", |o| {
        let env: Vec<Value> = (0..100)
            .map(|i| json!({"name": format!("V{i}"), "value": "x".repeat(12 * 1024)}))
            .collect();
        o["spec"]["env"] = json!(env);
    });
    let size = body.len() as u64;
    for path in ["/mutate", "/validate"] {
        let (status, _) = send(&certs, webhook.tls, path, body.clone()).await;
        assert_eq!(status, StatusCode::OK);
    }
    let settled = webhook.rss();
    webhook.reset_peak();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (client, addr, body) = (certs.client(), webhook.tls, body.clone());
        let path = if i % 2 == 0 { "/mutate" } else { "/validate" };
        tasks.push(tokio::spawn(async move {
            client.post(addr, path, body, false).await.unwrap().status
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    let peak = webhook.peak();
    // The budget admits two bodies at once; each costs at most 4x while decoded, and
    // the other 14 wait with their bodies unread (in the kernel's socket buffers).
    let bound = settled + 2 * 5 * size + 16 * 1024 * 1024;
    println!("burst of 16 x {size} B: settled {settled} B, peak {peak} B, bound {bound} B");
    assert!(peak <= bound, "peak {peak} B over {bound} B");
    // Returned afterwards: back within a few bodies of where it was.
    let rss = harness::eventually(
        &format!("memory returned after the burst ({settled} B before)"),
        GIVE_UP,
        || async {
            let rss = webhook.rss();
            (rss <= settled + 3 * size).then_some(rss)
        },
    )
    .await
    .unwrap();
    println!("after the burst: {rss} B");
    webhook.terminate().await;
}

/// Opens a TLS connection, sends `prefix`, and returns how long until the server closed
/// it (bounded by [`GIVE_UP`]).
async fn closed_after(certs: &TestCerts, addr: SocketAddr, prefix: &[u8]) -> Duration {
    let mut stream = certs.client().raw(addr).await.unwrap();
    stream.write_all(prefix).await.unwrap();
    stream.flush().await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(GIVE_UP, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("connection still open after {GIVE_UP:?}"),
        }
    }
}

/// Slow headers, idle keep-alive connections and silent TCP connections are closed by
/// their timeouts; the failed handshakes are counted.
#[tokio::test]
async fn slow_and_idle_connections_are_closed_by_their_timeouts() {
    let certs = TestCerts::new();
    let webhook = Webhook::start(
        &certs,
        &[
            ("WEBHOOK_HEADER_READ_TIMEOUT", "1s"),
            ("WEBHOOK_IDLE_TIMEOUT", "1s"),
            ("WEBHOOK_TLS_HANDSHAKE_TIMEOUT", "1s"),
        ],
    )
    .await;
    // Half-sent headers, then nothing: closed at the header timeout.
    let waited = closed_after(
        &certs,
        webhook.tls,
        b"POST /validate HTTP/1.1\r\nHost: x\r\n",
    )
    .await;
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    // Headers dribbled at one byte per 200 ms still hit the same deadline.
    let mut slow = certs.client().raw(webhook.tls).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut closed = false;
    for byte in b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        .iter()
        .cycle()
    {
        if slow.write_all(&[*byte]).await.is_err() || slow.flush().await.is_err() {
            closed = true;
            break;
        }
        if started.elapsed() > GIVE_UP {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        closed,
        "a connection sending headers at 5 bytes/s was kept open"
    );
    // An idle keep-alive connection after a complete request.
    let request = bytes(&fixture("create-minimal.json"));
    let mut head = format!(
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        request.len()
    )
    .into_bytes();
    head.extend_from_slice(&request);
    let waited = closed_after(&certs, webhook.tls, &head).await;
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    // Idle h2 connection (no stream ever opened).
    let tcp = TcpStream::connect(webhook.tls).await.unwrap();
    let mut tls = h2_connector(&certs)
        .connect(server_name(webhook.tls), tcp)
        .await
        .unwrap();
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(GIVE_UP, async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "an idle h2 connection was kept open");
    // A TCP connection that never starts TLS: the handshake timeout, counted.
    let mut silent = TcpStream::connect(webhook.tls).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(GIVE_UP, silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    let mut garbage = TcpStream::connect(webhook.tls).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let _ = tokio::time::timeout(GIVE_UP, garbage.read(&mut buf)).await;
    assert!(
        webhook
            .metric(r#"appservice_webhook_tls_handshake_failures_total{reason="timeout"}"#)
            .await
            >= 1.0
    );
    assert!(
        webhook
            .metric(r#"appservice_webhook_tls_handshake_failures_total{reason="error"}"#)
            .await
            >= 1.0
    );
    webhook.terminate().await;
}

fn h2_connector(certs: &TestCerts) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(certs.ca.cert_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

fn server_name(addr: SocketAddr) -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::IpAddress(addr.ip().into())
}

/// With the connection cap reached by idle clients, the operations port still answers,
/// and a review gets through as soon as a slot is free.
#[tokio::test]
async fn the_ops_port_answers_when_the_connection_cap_is_reached() {
    let certs = TestCerts::new();
    let webhook = Webhook::start(
        &certs,
        &[
            ("WEBHOOK_MAX_CONNECTIONS", "20"),
            ("WEBHOOK_TLS_HANDSHAKE_TIMEOUT", "30s"),
            ("WEBHOOK_HEADER_READ_TIMEOUT", "30s"),
        ],
    )
    .await;
    // 200 silent TCP connections: 20 take every slot, the rest wait in the backlog.
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(webhook.tls).await.unwrap());
    }
    let open = tokio::time::timeout(GIVE_UP, async {
        loop {
            let open = webhook.metric("appservice_webhook_tls_connections ").await;
            if open >= 20.0 {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(open, 20.0, "the cap was exceeded");
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _) = get(webhook.ops, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    // A review waits for a slot; freeing the flood lets it through.
    let client = certs.client();
    let addr = webhook.tls;
    let review = tokio::spawn(async move { client.review(addr, "/validate", false).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !review.is_finished(),
        "a review got past a full connection cap"
    );
    drop(flood);
    let reply = tokio::time::timeout(GIVE_UP, review)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    webhook.terminate().await;
}

/// Rapid HTTP/2 resets (open a stream, cancel it at once, thousands of times) leave no
/// work behind: in-flight requests drop back to zero, memory does not grow, and the
/// operations port and new connections are served throughout.
#[tokio::test]
async fn rapid_h2_resets_leave_no_work_behind() {
    let certs = TestCerts::new();
    let webhook = Webhook::start(&certs, &[]).await;
    let before = webhook.rss();
    let tcp = TcpStream::connect(webhook.tls).await.unwrap();
    let tls = h2_connector(&certs)
        .connect(server_name(webhook.tls), tcp)
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let body = Bytes::from(bytes(&fixture("create-minimal.json")));
    let mut sent = 0;
    for i in 0..20_000 {
        if sender.ready().await.is_err() {
            // The server closed the connection: also a fine answer to a flood.
            break;
        }
        let request = http::Request::post(format!("https://{}/validate", webhook.tls))
            .body(Full::new(body.clone()))
            .unwrap();
        // Polled once (so the stream opens), then dropped: the stream is reset.
        let mut response = Box::pin(sender.send_request(request));
        let _ = futures_poll_once(response.as_mut()).await;
        drop(response);
        sent += 1;
        if i % 2_000 == 0 {
            assert_eq!(get(webhook.ops, "/healthz").await.0, StatusCode::OK);
        }
    }
    assert!(sent > 0);
    // The server still serves new connections.
    let reply = certs
        .client()
        .review(webhook.tls, "/validate", true)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    tokio::time::timeout(GIVE_UP, async {
        while webhook
            .metric("appservice_webhook_admission_in_flight ")
            .await
            != 0.0
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("cancelled requests stayed in flight");
    let grown = webhook.rss().saturating_sub(before);
    println!("{sent} reset streams; resident memory grew by {grown} B");
    assert!(grown < 32 * 1024 * 1024, "memory grew by {grown} B");
    webhook.terminate().await;
}

/// Polls a future once.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// After SIGTERM the webhook is not ready but keeps answering for the shutdown delay;
/// a connection with half-sent headers does not hold the shutdown for the drain timeout.
#[tokio::test]
async fn sigterm_keeps_serving_while_not_ready_then_stops_without_waiting_for_slow_headers() {
    let certs = TestCerts::new();
    let mut webhook = Webhook::start(
        &certs,
        &[
            ("WEBHOOK_SHUTDOWN_DELAY", "2s"),
            ("WEBHOOK_SHUTDOWN_TIMEOUT", "120s"),
            ("WEBHOOK_HEADER_READ_TIMEOUT", "1s"),
        ],
    )
    .await;
    let mut half = certs.client().raw(webhook.tls).await.unwrap();
    half.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    half.flush().await.unwrap();
    harness::process::signal(webhook.pid, "TERM").unwrap();
    webhook.logged("shutdown requested; draining").await;
    let (status, reason) = get(webhook.ops, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reason, "shutting down");
    let (status, response) = send(
        &certs,
        webhook.tls,
        "/validate",
        bytes(&fixture("create-minimal.json")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "refused during the shutdown delay");
    assert_eq!(response["allowed"], true);
    let started = tokio::time::Instant::now();
    let exit = tokio::time::timeout(GIVE_UP, webhook.child.wait())
        .await
        .expect("shutdown waited for half-sent headers")
        .unwrap();
    assert!(exit.success(), "{exit}");
    // Far below the 120 s drain timeout.
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Emptying or tearing the policy file keeps the policies: `:latest` in production stays
/// denied, and the refusal is logged and counted. `policies: []` clears them.
#[tokio::test]
async fn empty_or_torn_policy_files_keep_the_policies() {
    let certs = TestCerts::new();
    let policies = certs.dir.path().join("policies.yaml");
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/policies/no-latest-in-production.yaml");
    std::fs::copy(&example, &policies).unwrap();
    let path = policies.to_string_lossy().into_owned();
    let mut webhook = Webhook::start(&certs, &[("WEBHOOK_POLICIES", path.as_str())]).await;
    let latest_in_production = || {
        let mut review = fixture("create-minimal.json");
        review["request"]["namespace"] = json!("production");
        review["request"]["object"]["metadata"]["namespace"] = json!("production");
        review["request"]["object"]["spec"]["image"] = json!("registry.example.com/app:latest");
        review["request"]["object"]["spec"]["replicas"] = json!(3);
        bytes(&review)
    };
    let (_, response) = send(&certs, webhook.tls, "/validate", latest_in_production()).await;
    assert_eq!(response["allowed"], false, "{response}");
    let full = std::fs::read_to_string(&example).unwrap();
    let torn = &full[..full.len() / 2];
    for content in ["", "\n  \n", torn] {
        std::fs::write(&policies, content).unwrap();
        let refused = webhook
            .logged("policy file refused; the previous policies stay active")
            .await;
        assert!(refused["active"].as_u64().unwrap() >= 1, "{refused}");
        let (_, response) = send(&certs, webhook.tls, "/validate", latest_in_production()).await;
        assert_eq!(
            response["allowed"], false,
            "{content:?} disabled the policies: {response}"
        );
    }
    assert!(
        webhook
            .metric(r#"appservice_webhook_policy_reloads_total{result="failure"}"#)
            .await
            >= 3.0
    );
    std::fs::write(&policies, "policies: []\n").unwrap();
    let reloaded = webhook.logged("policies reloaded").await;
    assert_eq!(reloaded["policies"], 0);
    let (_, response) = send(&certs, webhook.tls, "/validate", latest_in_production()).await;
    assert_eq!(response["allowed"], true, "{response}");
    webhook.terminate().await;
}

/// 404, 405, 408 and 413 answers are counted by path and code.
#[tokio::test]
async fn error_answers_are_counted() {
    let certs = TestCerts::new();
    let webhook = Webhook::start(
        &certs,
        &[
            ("WEBHOOK_REQUEST_TIMEOUT", "1s"),
            ("WEBHOOK_MAX_BODY_BYTES", "100000"),
        ],
    )
    .await;
    let client = certs.client();
    assert_eq!(
        client
            .post(webhook.tls, "/nothing", vec![], false)
            .await
            .unwrap()
            .status,
        StatusCode::NOT_FOUND
    );
    for (request, status, why) in [
        (
            &b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"[..],
            "413",
            "a declared size over the limit, before the body is read",
        ),
        (
            b"GET /validate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "405",
            "GET of an admission path",
        ),
        (
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{",
            "408",
            "a body promised but never sent, at the request timeout",
        ),
    ] {
        let mut stream = client.raw(webhook.tls).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut reply = vec![0u8; 1024];
        let n = tokio::time::timeout(GIVE_UP, stream.read(&mut reply))
            .await
            .unwrap()
            .unwrap();
        let reply = String::from_utf8_lossy(&reply[..n]);
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status}")),
            "{why}: {reply}"
        );
    }
    for (series, at_least) in [
        (
            r#"appservice_webhook_http_responses_total{path="other",code="404"}"#,
            1.0,
        ),
        (
            r#"appservice_webhook_http_responses_total{path="/validate",code="413"}"#,
            1.0,
        ),
        (
            r#"appservice_webhook_http_responses_total{path="/validate",code="405"}"#,
            1.0,
        ),
        (
            r#"appservice_webhook_http_responses_total{path="/mutate",code="408"}"#,
            1.0,
        ),
    ] {
        assert!(webhook.metric(series).await >= at_least, "{series}");
    }
    // The latency of the 408 (a second of body wait) is in a bucket past 1 s.
    assert!(
        webhook
            .metric(r#"appservice_webhook_admission_duration_seconds_bucket{le="0.5",endpoint="mutate"}"#)
            .await
            < webhook
                .metric(r#"appservice_webhook_admission_duration_seconds_count{endpoint="mutate"}"#)
                .await
    );
    webhook.terminate().await;
}

/// A policy made expensive (a regular expression compiled for each of 20,000 list
/// elements) is cut off at its time budget and denies, while the operations port and
/// other reviews keep being answered; a policy whose worst case is over the cost limit
/// (nested comprehensions over lists of unknown size) is refused at load.
#[tokio::test]
async fn expensive_policies_are_refused_at_load_or_cut_off() {
    let certs = TestCerts::new();
    let policies = certs.write_policies("policies:\n  - name: nested\n    expression: \"object.metadata.managedFields.all(a, object.metadata.managedFields.all(b, object.metadata.managedFields.all(c, a != c)))\"\n    message: m\n");
    let output = Command::new(env!("CARGO_BIN_EXE_appservice-webhook"))
        .env_clear()
        .env("WEBHOOK_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_OPS_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_TLS_CERT", &certs.cert_path)
        .env("WEBHOOK_TLS_KEY", &certs.key_path)
        .env("WEBHOOK_POLICIES", &policies)
        .env("WEBHOOK_LOG_FORMAT", "text")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"nested\"") && stderr.contains("exceeds the limit"),
        "{stderr}"
    );

    std::fs::write(
        &policies,
        "policies:\n  - name: slow\n    expression: \"lists.range(20000).all(i, !string(i).matches('^(a|b|c|d)+x$'))\"\n    message: m\n",
    )
    .unwrap();
    let path = policies.to_string_lossy().into_owned();
    let webhook = Webhook::start(
        &certs,
        &[
            ("WEBHOOK_POLICIES", path.as_str()),
            ("WEBHOOK_POLICY_TIMEOUT", "1ms"),
        ],
    )
    .await;
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let (client, addr) = (certs.client(), webhook.tls);
            tokio::spawn(async move { client.review(addr, "/validate", false).await.unwrap() })
        })
        .collect();
    // Meanwhile: probes and a /mutate review.
    assert_eq!(get(webhook.ops, "/healthz").await.0, StatusCode::OK);
    let (status, response) = send(
        &certs,
        webhook.tls,
        "/mutate",
        bytes(&fixture("create-minimal.json")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["allowed"], true);
    for reply in slow {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        let response = response_of(&reply.body);
        assert_eq!(response["allowed"], false);
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("time budget"), "{message}");
    }
    webhook.terminate().await;
}
