//! Admission that one client cannot starve, measured on the real binary at its shipped
//! defaults: while hostile clients stall uploads that declare 3 MiB, hold HTTP/2
//! streams open without a body, and flood the port with connections that never start
//! TLS, ordinary reviews from another address (the API server's) are every one
//! answered, each within the API server's 5 s timeout (a correctness bound: past it
//! the API server fails the write). Their latency is reported against an idle run of
//! the same process measured first, as p50 and p99 ratios (printed, not asserted).
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::process::{GIVE_UP, Webhook, connect_from};
use support::{TestCerts, TlsClient, bytes, fixture, response_of};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The API server's webhook timeout (`timeoutSeconds` in the chart).
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(5);
/// Reviews timed in each run.
const REVIEWS: usize = 300;
/// Attack connections of each kind.
const STALLED_UPLOADS: usize = 32;
const H2_CONNECTIONS: usize = 4;
const FLOOD_CONNECTIONS: usize = 400;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// An HTTP/2 connection to the webhook, as the API server holds one.
async fn h2(client: &TlsClient, addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let tls = client
        .connect(addr, true)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One review over `sender`; its latency, or why it failed.
async fn review(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    body: &Bytes,
) -> Result<Duration, String> {
    let started = Instant::now();
    sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let request = http::Request::post(format!("https://{addr}/validate"))
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&answer)));
    }
    if response_of(&answer)["allowed"] != true {
        return Err(format!("denied: {}", String::from_utf8_lossy(&answer)));
    }
    Ok(started.elapsed())
}

/// Latencies of ordinary reviews, as the API server sends them: over one HTTP/2
/// connection, and every fourth over a new connection (which must get through the
/// accept loop, the connection cap and the TLS handshake). Runs at least `REVIEWS`
/// reviews and for at least `at_least`. Every failure is collected.
async fn timed_reviews(
    client: &TlsClient,
    addr: SocketAddr,
    at_least: Duration,
) -> (Vec<Duration>, Vec<String>) {
    let body = Bytes::from(bytes(&fixture("create-minimal.json")));
    let mut kept = h2(client, addr).await.unwrap();
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while i < REVIEWS || started.elapsed() < at_least {
        let outcome = if i % 4 == 0 {
            let started = Instant::now();
            let mut fresh = tokio::time::timeout(API_SERVER_TIMEOUT, h2(client, addr))
                .await
                .map_err(|_| "no new connection within the timeout".to_owned())
                .and_then(|connected| connected);
            match &mut fresh {
                Ok(fresh) => review(fresh, addr, &body).await.map(|_| started.elapsed()),
                Err(error) => Err(error.clone()),
            }
        } else {
            review(&mut kept, addr, &body).await
        };
        match outcome {
            Ok(latency) if latency <= API_SERVER_TIMEOUT => latencies.push(latency),
            Ok(latency) => failures.push(format!(
                "review {i} took {latency:?}, past the API server's timeout"
            )),
            Err(error) => {
                failures.push(format!("review {i}: {error}"));
                // The API server would open a new connection.
                match h2(client, addr).await {
                    Ok(sender) => kept = sender,
                    Err(error) => failures.push(format!("reconnecting: {error}")),
                }
            }
        }
        i += 1;
    }
    (latencies, failures)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Stalled uploads from `source`: each declares 3 MiB, sends 64 KiB and stalls; when
/// the webhook cuts it off, the attacker opens the next one.
async fn stall_uploads(certs: Arc<TestCerts>, addr: SocketAddr, stop: Arc<AtomicBool>) {
    let client = certs.client().connecting_from(ip("127.0.0.2"));
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut stream) = client.connect(addr, false).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut head = format!(
            "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            3 * 1024 * 1024
        )
        .into_bytes();
        head.extend(std::iter::repeat_n(b' ', 64 * 1024));
        if stream.write_all(&head).await.is_err() || stream.flush().await.is_err() {
            continue;
        }
        // Held until the webhook answers (408) and closes.
        let mut buf = [0u8; 1024];
        loop {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// A request body that never sends a byte.
fn pending_body() -> http_body_util::StreamBody<
    futures::stream::Pending<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
> {
    http_body_util::StreamBody::new(futures::stream::pending())
}

/// An HTTP/2 connection from `source` holding as many streams open as the webhook
/// allows, each declaring 3 MiB and sending nothing; each stream cut off is opened again.
async fn hold_streams(certs: Arc<TestCerts>, addr: SocketAddr, stop: Arc<AtomicBool>) {
    let client = certs.client().connecting_from(ip("127.0.0.3"));
    while !stop.load(Ordering::SeqCst) {
        let Ok(tls) = client.connect(addr, true).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok((sender, connection)) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
        else {
            continue;
        };
        let connection = tokio::spawn(connection);
        let mut streams = JoinSet::new();
        // More than the webhook's 64 concurrent streams: the rest queue in the client.
        for _ in 0..100 {
            let mut sender = sender.clone();
            let stop = stop.clone();
            streams.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if sender.ready().await.is_err() {
                        return;
                    }
                    let request = http::Request::post(format!("https://{addr}/validate"))
                        .header("content-length", (3 * 1024 * 1024).to_string())
                        .body(pending_body())
                        .unwrap();
                    if sender.send_request(request).await.is_err() {
                        return;
                    }
                }
            });
        }
        while streams.join_next().await.is_some() {}
        connection.abort();
    }
}

/// Connections from `source` that never start TLS, opened as fast as they are taken:
/// the webhook keeps its share per peer and closes the rest.
async fn flood(addr: SocketAddr, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>) {
    let mut held = std::collections::VecDeque::new();
    while !stop.load(Ordering::SeqCst) {
        match connect_from(ip("127.0.0.4"), addr).await {
            Ok(stream) => {
                opened.fetch_add(1, Ordering::SeqCst);
                held.push_back(stream);
                if held.len() > FLOOD_CONNECTIONS {
                    held.pop_front();
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        // About a thousand a second: a flood, without running out of local ports.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn ordinary_reviews_keep_their_latency_while_hostile_clients_attack() {
    let certs = Arc::new(TestCerts::new());
    let webhook = Webhook::start(&certs, &[]).await;
    let addr = webhook.tls;
    let api_server = certs.client().connecting_from(ip("127.0.0.1"));

    // Warm up, then the idle baseline.
    let _ = timed_reviews(&api_server, addr, Duration::ZERO).await;
    let (mut idle, failures) = timed_reviews(&api_server, addr, Duration::ZERO).await;
    assert!(failures.is_empty(), "idle: {failures:#?}");
    idle.sort();

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let mut attackers = JoinSet::new();
    for _ in 0..STALLED_UPLOADS {
        attackers.spawn(stall_uploads(certs.clone(), addr, stop.clone()));
    }
    for _ in 0..H2_CONNECTIONS {
        attackers.spawn(hold_streams(certs.clone(), addr, stop.clone()));
    }
    attackers.spawn(flood(addr, stop.clone(), opened.clone()));
    // Under attack once the stalled uploads and held streams are being received.
    let in_flight = harness::eventually("the attack in flight", GIVE_UP, || async {
        let in_flight = webhook
            .metric("appservice_webhook_admission_in_flight ")
            .await;
        (in_flight >= (STALLED_UPLOADS + H2_CONNECTIONS * 32) as f64).then_some(in_flight)
    })
    .await
    .unwrap();
    // Long enough for several rounds of cut-off uploads (the body deadline is 2 s).
    let (mut attacked, failures) = timed_reviews(&api_server, addr, Duration::from_secs(8)).await;
    let open = webhook.metric("appservice_webhook_tls_connections ").await;
    let refused = webhook
        .metric("appservice_webhook_tls_connections_refused_per_peer_total ")
        .await;
    let timed_out = webhook
        .metric(r#"appservice_webhook_http_responses_total{path="/validate",code="408"}"#)
        .await;
    stop.store(true, Ordering::SeqCst);
    attackers.abort_all();
    while attackers.join_next().await.is_some() {}
    attacked.sort();

    println!(
        "under attack: {in_flight} requests in flight, {open} connections open, {} flood connections opened, {refused} refused per peer, {timed_out} stalled requests cut off (408)",
        opened.load(Ordering::SeqCst)
    );
    let (idle_p50, idle_p99) = (percentile(&idle, 0.5), percentile(&idle, 0.99));
    let (p50, p99) = (percentile(&attacked, 0.5), percentile(&attacked, 0.99));
    println!(
        "idle: {} reviews, p50 {idle_p50:?}, p99 {idle_p99:?}; under attack: {} reviews, p50 {p50:?}, p99 {p99:?}, max {:?}",
        idle.len(),
        attacked.len(),
        attacked.last().copied().unwrap_or_default()
    );
    println!(
        "latency under attack / idle: p50 {:.2}x, p99 {:.2}x",
        p50.as_secs_f64() / idle_p50.as_secs_f64(),
        p99.as_secs_f64() / idle_p99.as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} reviews failed under attack: {failures:#?}",
        failures.len(),
        failures.len() + attacked.len()
    );
    assert!(refused > 0.0, "the flood never reached its per-peer share");
    assert!(timed_out > 0.0, "no stalled request was cut off");
    webhook.terminate().await;
}
