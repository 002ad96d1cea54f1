//! The whole server in-process over real TLS: HTTP/1.1 and h2, readiness, certificate
//! rotation under load (Kubernetes' `..data` symlink swap and plain file replacement),
//! refusal of a bad certificate, policy reload, and draining on shutdown.
//!
//! Nothing here asserts on elapsed time: waits are loops on an observable condition,
//! with a generous upper bound that only turns a hang into a failure.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use harness::eventually;
use http::StatusCode;
use serde_json::json;
use support::{TestCerts, TlsClient, bytes, fixture, get, leaf_der, response_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use webhook::Server;

/// Upper bound of any wait; reaching it is a failure, not a timing assertion.
const GIVE_UP: Duration = Duration::from_secs(60);

fn metric(server: &Server, line_prefix: &str) -> u64 {
    let text = server.state().metrics.encode().unwrap();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn serves_http1_and_h2_and_is_ready() {
    let certs = TestCerts::new();
    let server = webhook::start(&certs.config(None)).await.unwrap();
    assert_eq!(
        get(server.ops_addr(), "/readyz").await,
        (StatusCode::OK, "ready".to_owned())
    );
    assert_eq!(get(server.ops_addr(), "/healthz").await.0, StatusCode::OK);

    let client = certs.client();
    for h2 in [false, true] {
        let reply = client
            .review(server.tls_addr(), "/mutate", h2)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.version,
            if h2 {
                http::Version::HTTP_2
            } else {
                http::Version::HTTP_11
            }
        );
        assert_eq!(reply.peer_cert, leaf_der(&certs.cert_path));
        assert_eq!(response_of(&reply.body)["allowed"], true);
    }
    let (status, metrics) = get(server.ops_addr(), "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        metrics.contains("appservice_webhook_certificate_expiry_timestamp_seconds "),
        "{metrics}"
    );
    server.shutdown().await.unwrap();
}

/// Lays out a directory like the kubelet does for a mounted Secret: the files are
/// symlinks through `..data`, which points at a timestamped directory.
fn write_generation(dir: &Path, generation: &str, cert: &certs::CertKey) {
    let target = dir.join(generation);
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("tls.crt"), &cert.cert_pem).unwrap();
    std::fs::write(target.join("tls.key"), &cert.key_pem).unwrap();
    // Atomic swap: a new symlink renamed over `..data`.
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(generation, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    seen_new: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `workers` clients sending reviews back to back, each on a new TLS connection,
/// alternating HTTP/1.1 and h2, counting requests that saw `new_cert`.
fn start_load(
    client: TlsClient,
    addr: std::net::SocketAddr,
    workers: usize,
    new_cert: Arc<std::sync::Mutex<Vec<u8>>>,
) -> Load {
    let load = Load {
        stop: Arc::new(AtomicBool::new(false)),
        ok: Arc::new(AtomicUsize::new(0)),
        failures: Arc::new(std::sync::Mutex::new(Vec::new())),
        seen_new: Arc::new(AtomicUsize::new(0)),
        tasks: Vec::new(),
    };
    let body = bytes(&fixture("create-minimal.json"));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let (client, body, new_cert) = (client.clone(), body.clone(), new_cert.clone());
        let (stop, ok, failures, seen_new) = (
            load.stop.clone(),
            load.ok.clone(),
            load.failures.clone(),
            load.seen_new.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let path = if i % 3 == 0 { "/validate" } else { "/mutate" };
                match client.post(addr, path, body.clone(), i % 2 == 0).await {
                    Ok(reply)
                        if reply.status == StatusCode::OK
                            && response_of(&reply.body)["allowed"] == true =>
                    {
                        ok.fetch_add(1, Ordering::SeqCst);
                        if reply.peer_cert
                            == *new_cert.lock().unwrap_or_else(PoisonError::into_inner)
                        {
                            seen_new.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Ok(reply) => failures
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(format!("status {} {:?}", reply.status, reply.body)),
                    Err(e) => failures
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(e),
                }
            }
        }));
    }
    Load { tasks, ..load }
}

impl Load {
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load_drops_nothing() {
    let certs = TestCerts::new();
    // A kubelet-style Secret volume.
    let volume = certs.dir.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    let first = certs.ca.serving_cert(&["127.0.0.1"]).unwrap();
    write_generation(&volume, "..2026_11_29_17_00_00.000000001", &first);
    std::os::unix::fs::symlink("..data/tls.crt", volume.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", volume.join("tls.key")).unwrap();
    let mut config = certs.config(None);
    config.tls_cert = volume.join("tls.crt");
    config.tls_key = volume.join("tls.key");
    let server = webhook::start(&config).await.unwrap();
    let addr = server.tls_addr();
    assert_eq!(
        leaf_der(&config.tls_cert),
        leaf_der(&volume.join("..2026_11_29_17_00_00.000000001/tls.crt"))
    );

    let expected = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = start_load(certs.client(), addr, 4, expected.clone());
    let ok = load.ok.clone();
    let seen_new = load.seen_new.clone();
    eventually("requests with the first certificate", GIVE_UP, || {
        let ok = ok.clone();
        async move { ok.load(Ordering::SeqCst) >= 200 }
    })
    .await
    .unwrap();

    // Rotation 1: the symlink swap.
    let second = certs.ca.serving_cert(&["127.0.0.1"]).unwrap();
    *expected.lock().unwrap_or_else(PoisonError::into_inner) = pem_leaf(&second.cert_pem);
    write_generation(&volume, "..2026_11_29_18_00_00.000000002", &second);
    eventually("the swapped certificate to be served", GIVE_UP, || {
        let seen = seen_new.clone();
        async move { seen.load(Ordering::SeqCst) >= 100 }
    })
    .await
    .unwrap();

    // Rotation 2: another swap while the load goes on, then keep going.
    let third = certs.ca.serving_cert(&["127.0.0.1"]).unwrap();
    seen_new.store(0, Ordering::SeqCst);
    *expected.lock().unwrap_or_else(PoisonError::into_inner) = pem_leaf(&third.cert_pem);
    write_generation(&volume, "..2026_11_29_19_00_00.000000003", &third);
    eventually("the third certificate to be served", GIVE_UP, || {
        let seen = seen_new.clone();
        async move { seen.load(Ordering::SeqCst) >= 100 }
    })
    .await
    .unwrap();

    let (ok, failures) = load.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(5)]
    );
    eprintln!("rotation under load: {ok} requests, 0 failed, 2 rotations");
    // Every request from now on sees the third certificate.
    let reply = certs
        .client()
        .review(addr, "/validate", false)
        .await
        .unwrap();
    assert_eq!(reply.peer_cert, pem_leaf(&third.cert_pem));
    assert_eq!(
        metric(
            &server,
            "appservice_webhook_certificate_reloads_total{result=\"success\"}"
        ),
        2
    );
    server.shutdown().await.unwrap();
}

fn pem_leaf(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_files_and_a_bad_pair() {
    let certs = TestCerts::new();
    let server = webhook::start(&certs.config(None)).await.unwrap();
    let addr = server.tls_addr();
    let client = certs.client();
    let original = leaf_der(&certs.cert_path);

    // A broken certificate file: refused, the old one stays, and a metric says so.
    std::fs::write(
        &certs.cert_path,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    eventually("the refusal to be counted", GIVE_UP, || async {
        metric(
            &server,
            "appservice_webhook_certificate_reloads_total{result=\"failure\"}",
        ) >= 1
    })
    .await
    .unwrap();
    let reply = client.review(addr, "/validate", false).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.peer_cert, original);
    assert_eq!(get(server.ops_addr(), "/readyz").await.0, StatusCode::OK);

    // A good pair written with rename (how most tools replace files).
    let next = certs.ca.serving_cert(&["127.0.0.1"]).unwrap();
    let tmp_key = certs.dir.path().join("tls.key.tmp");
    let tmp_cert = certs.dir.path().join("tls.crt.tmp");
    std::fs::write(&tmp_key, &next.key_pem).unwrap();
    std::fs::write(&tmp_cert, &next.cert_pem).unwrap();
    std::fs::rename(&tmp_key, &certs.key_path).unwrap();
    std::fs::rename(&tmp_cert, &certs.cert_path).unwrap();
    let expected = pem_leaf(&next.cert_pem);
    eventually("the replaced certificate to be served", GIVE_UP, || {
        let (client, expected) = (client.clone(), expected.clone());
        async move {
            let reply = client.review(addr, "/validate", true).await.unwrap();
            assert_eq!(reply.status, StatusCode::OK);
            reply.peer_cert == expected
        }
    })
    .await
    .unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn policies_reload_and_a_broken_file_keeps_the_old_set() {
    let certs = TestCerts::new();
    let policies = certs.write_policies("policies: []\n");
    let server = webhook::start(&certs.config(Some(policies.clone())))
        .await
        .unwrap();
    let (addr, client) = (server.tls_addr(), certs.client());
    let mut review = fixture("create-minimal.json");
    review["request"]["object"]["spec"]["replicas"] = json!(1);
    let allowed = |client: TlsClient, body: Vec<u8>| async move {
        let reply = client.post(addr, "/validate", body, false).await.unwrap();
        response_of(&reply.body)["allowed"] == true
    };
    assert!(allowed(client.clone(), bytes(&review)).await);

    std::fs::write(
        &policies,
        "policies:\n  - name: production-replicas\n    expression: \"request.namespace != 'production' || object.spec.replicas >= 2\"\n    message: production needs 2 replicas\n",
    )
    .unwrap();
    eventually("the new policy to deny", GIVE_UP, || {
        let reply = allowed(client.clone(), bytes(&review));
        async move { !reply.await }
    })
    .await
    .unwrap();

    std::fs::write(
        &policies,
        "policies:\n  - {name: broken, expression: 'object.spec.replicas >', message: x}\n",
    )
    .unwrap();
    eventually("the broken file to be refused", GIVE_UP, || async {
        metric(
            &server,
            "appservice_webhook_policy_reloads_total{result=\"failure\"}",
        ) >= 1
    })
    .await
    .unwrap();
    assert!(
        !allowed(client.clone(), bytes(&review)).await,
        "the previous policy stays active"
    );
    assert_eq!(metric(&server, "appservice_webhook_policies "), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_a_request_in_flight() {
    let certs = TestCerts::new();
    let server = webhook::start(&certs.config(None)).await.unwrap();
    let (addr, ops) = (server.tls_addr(), server.ops_addr());
    let client = certs.client();

    // Start a request and stop halfway through its body.
    let body = bytes(&fixture("create-minimal.json"));
    let (first, rest) = body.split_at(body.len() / 2);
    let mut stream = client.raw(addr).await.unwrap();
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first).await.unwrap();
    stream.flush().await.unwrap();
    // Shut down only once the server is inside the request (headers read, body pending).
    eventually("the request to be in flight", GIVE_UP, || async {
        metric(&server, "appservice_webhook_admission_in_flight ") == 1
    })
    .await
    .unwrap();

    let shutdown = tokio::spawn(server.shutdown());
    eventually("readiness to turn off", GIVE_UP, || async {
        get(ops, "/readyz").await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await
    .unwrap();
    // New connections are refused once the listener is closed.
    eventually("the listener to close", GIVE_UP, || {
        let client = client.clone();
        async move { client.raw(addr).await.is_err() }
    })
    .await
    .unwrap();

    // The request in flight still completes.
    stream.write_all(rest).await.unwrap();
    stream.flush().await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    let body_start = text.find("\r\n\r\n").unwrap() + 4;
    let review: serde_json::Value = serde_json::from_str(&text[body_start..]).unwrap();
    assert_eq!(review["response"]["allowed"], true);

    shutdown.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_stalled_upload_times_out_with_408() {
    let certs = TestCerts::new();
    let mut config = certs.config(None);
    config.request_timeout = Duration::from_millis(300);
    let server = webhook::start(&config).await.unwrap();
    let mut stream = certs.client().raw(server.tls_addr()).await.unwrap();
    let head = format!(
        "POST /validate HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"apiVersion\"",
        server.tls_addr()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    // The rest of the body never comes; the server answers on its own.
    let mut response = vec![0u8; 64];
    let n = stream.read(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(
        metric(&server, "appservice_webhook_admission_in_flight "),
        0
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn tls_1_2_and_1_3_only() {
    use rustls::pki_types::ServerName;
    let certs = TestCerts::new();
    let server = webhook::start(&certs.config(None)).await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            certs.ca.cert_der().to_vec(),
        ))
        .unwrap();
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config = rustls::ClientConfig::builder_with_protocol_versions(&[version])
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(server.tls_addr())
            .await
            .unwrap();
        let tls = connector
            .connect(ServerName::IpAddress(server.tls_addr().ip().into()), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.protocol_version(), Some(version.version));
    }
    server.shutdown().await.unwrap();
}

/// With `--client-ca`, `/mutate` and `/validate` answer only a client that presented a
/// certificate of that CA (the API server's, from its AdmissionConfiguration
/// kubeconfig), over HTTP/1.1 and h2; without one they answer 403 and `/convert` (which
/// the API server calls without a certificate) still converts; a certificate of another
/// CA fails the handshake, counted.
#[tokio::test]
async fn a_client_ca_admits_only_its_clients_to_admission() {
    let certs = TestCerts::new();
    let api_server_ca = certs::Ca::new("api-server-client-ca").unwrap();
    let ca_path = certs.dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, api_server_ca.cert_pem()).unwrap();
    let mut config = certs.config(None);
    config.client_ca = Some(ca_path);
    let server = webhook::start(&config).await.unwrap();
    let addr = server.tls_addr();
    let server_ca = certs.ca.cert_pem();
    let conversion = bytes(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "c-1", "desiredAPIVersion": "platform.example.com/v1beta1", "objects": [
            {"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
             "metadata": {"name": "a", "namespace": "shop"}, "spec": {"image": "nginx:1.27"}}
        ]}
    }));

    let api_server = api_server_ca
        .client_cert("kube-apiserver", &[] as &[&str])
        .unwrap();
    let trusted =
        TlsClient::with_identity(server_ca, Some((&api_server.cert_pem, &api_server.key_pem)));
    let anonymous = TlsClient::new(server_ca);
    for h2 in [false, true] {
        for path in ["/mutate", "/validate"] {
            let reply = trusted.review(addr, path, h2).await.unwrap();
            assert_eq!(reply.status, StatusCode::OK, "{path} h2: {h2}");
            assert_eq!(response_of(&reply.body)["allowed"], true);
            let reply = anonymous.review(addr, path, h2).await.unwrap();
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path} h2: {h2}");
            assert_eq!(
                String::from_utf8_lossy(&reply.body),
                "a client certificate signed by the webhook's --client-ca is required"
            );
        }
        let reply = anonymous
            .post(addr, "/convert", conversion.clone(), h2)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "/convert h2: {h2}");
    }

    let other_ca = certs::Ca::new("someone-else").unwrap();
    let stranger = other_ca.client_cert("tenant", &[] as &[&str]).unwrap();
    let stranger =
        TlsClient::with_identity(server_ca, Some((&stranger.cert_pem, &stranger.key_pem)));
    for h2 in [false, true] {
        let result = stranger.review(addr, "/validate", h2).await;
        assert!(
            result.is_err(),
            "another CA's client (h2: {h2}) was answered"
        );
    }
    assert!(
        metric(
            &server,
            r#"appservice_webhook_tls_handshake_failures_total{reason="error"}"#
        ) >= 2
    );
    server.shutdown().await.unwrap();
}

/// A `--client-ca` that holds no certificate stops the start with a message naming it.
#[tokio::test]
async fn an_empty_client_ca_is_refused_at_start() {
    let certs = TestCerts::new();
    let ca_path = certs.dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, "not a certificate\n").unwrap();
    let mut config = certs.config(None);
    config.client_ca = Some(ca_path.clone());
    let error = webhook::start(&config).await.unwrap_err().to_string();
    assert!(
        error.contains(&ca_path.display().to_string()) && error.contains("no PEM certificate"),
        "{error}"
    );
}
