//! Operating the `appservice-webhook` binary: profiles on demand (off by default, then
//! CPU and heap profiles that `go tool pprof` can read, one at a time) and an admission
//! review exported as a span to an OTLP receiver, its trace id in the JSON log line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use harness::OtlpReceiver;
use harness::binary::{ServingWebhook, start_webhook, webhook_command};
use http::StatusCode;
use support::{TestCerts, bytes, fixture, get, get_bytes};

/// Upper bound of any wait; reaching it is a failure, not a timing assertion.
const GIVE_UP: Duration = Duration::from_secs(30);

/// Starts the webhook binary with the test certificates and `env`; returns once it serves.
async fn start(certs: &TestCerts, env: &[(&str, &str)]) -> ServingWebhook {
    let mut command = webhook_command(
        env!("CARGO_BIN_EXE_appservice-webhook"),
        &certs.cert_path,
        &certs.key_path,
    );
    command
        .env("WEBHOOK_SHUTDOWN_TIMEOUT", "1s")
        .env("WEBHOOK_SHUTDOWN_DELAY", "0s")
        .envs(env.iter().copied());
    start_webhook(command, GIVE_UP).await.unwrap()
}

#[tokio::test]
async fn profiles_are_off_by_default() {
    let certs = TestCerts::new();
    let webhook = start(&certs, &[]).await;
    for path in ["/debug/pprof/heap", "/debug/pprof/profile?seconds=1"] {
        assert_eq!(
            get(webhook.ops, path).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert_eq!(get(webhook.ops, "/metrics").await.0, StatusCode::OK);
}

#[tokio::test]
async fn cpu_and_heap_profiles_on_demand() {
    let certs = TestCerts::new();
    // Only the flag: the binary restarts itself with jemalloc's sampling configured.
    let webhook = start(&certs, &[("WEBHOOK_PROFILING", "true")]).await;
    let (tls, ops) = (webhook.tls, webhook.ops);
    let _child = webhook.binary.drain_logs();

    // Work to sample while the CPU profile runs: reviews over TLS.
    let client = certs.client();
    let review = bytes(&fixture("create-minimal.json"));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let load = tokio::spawn(async move {
        let mut answered = 0;
        while !*stopped.borrow() {
            if client
                .post(tls, "/validate", review.clone(), false)
                .await
                .is_ok()
            {
                answered += 1;
            }
        }
        answered
    });
    // One profile at a time: whichever of a CPU profile (2 s) and a heap profile starts
    // second is refused while the first runs. Heap profiles are asked for until one is
    // refused during the CPU profile; a CPU profile that lost the race to a heap profile
    // was refused for the same reason, and is asked for again.
    let mut refusals = Vec::new();
    let mut cpu_answer = None;
    for _ in 0..5 {
        let cpu =
            tokio::spawn(async move { get_bytes(ops, "/debug/pprof/profile?seconds=2").await });
        let heap_refused = loop {
            // A pause between polls lets the CPU profile's request in.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (status, _) = get(ops, "/debug/pprof/heap").await;
            if status == StatusCode::CONFLICT {
                break true;
            }
            assert_eq!(
                status,
                StatusCode::OK,
                "a heap profile while nothing else ran"
            );
            if cpu.is_finished() {
                break false;
            }
        };
        let (status, body) = cpu.await.unwrap();
        if heap_refused {
            cpu_answer = Some((status, body));
            break;
        }
        // The CPU profile ended before any heap profile was refused: it can only have
        // been refused itself, by the heap profile that was running when it came.
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "{}",
            String::from_utf8_lossy(&body)
        );
        refusals.push(status);
    }
    let (status, body) = cpu_answer.unwrap_or_else(|| {
        panic!("no heap profile refused during a CPU profile; CPU profiles refused: {refusals:?}")
    });
    let _ = stop.send(true);
    let answered = load.await.unwrap();
    eprintln!("answered {answered} reviews while profiling");
    assert!(answered > 0);
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let profile = harness::pprof::check_cpu(&body).unwrap();
    // Samples are not asserted: a short profile sometimes has none (see telemetry's
    // profiling tests).
    eprintln!("CPU profile: {} samples", profile.samples);

    let (status, body) = get_bytes(ops, "/debug/pprof/heap").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    // Symbolized in the process: readable without the binary.
    harness::pprof::check_heap(&body, "webhook").unwrap();

    // Bounded.
    let (status, _) = get(ops, "/debug/pprof/profile?seconds=3600").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_admission_review_is_a_span_with_its_trace_id_in_the_log() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let certs = TestCerts::new();
    let endpoint = receiver.endpoint();
    let mut webhook = start(
        &certs,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let review = fixture("create-invalid.json");
    let reply = certs
        .client()
        .post(webhook.tls, "/validate", bytes(&review), false)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let logged = webhook
        .binary
        .wait_message("admission denied", GIVE_UP)
        .await
        .unwrap();
    let trace_id = logged["trace_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no trace_id in {logged}"))
        .to_owned();

    let span = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans
                .iter()
                .find(|s| s.name == "admission" && s.trace_id == trace_id)
                .cloned()
        })
        .await
        .unwrap_or_else(|| panic!("no admission span; received {:#?}", receiver.spans()));
    assert_eq!(span.service, "appservice-webhook");
    assert_eq!(span.attribute("endpoint"), Some("validate"));
    assert_eq!(
        span.attribute("uid"),
        review["request"]["uid"].as_str(),
        "{span:?}"
    );
    assert!(span.parent_span_id.is_empty(), "a review is a trace's root");
}
