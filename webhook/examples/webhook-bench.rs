//! Load benchmark of the webhook over TLS keep-alive, against bare rustls + hyper servers
//! in the same run: one answering a constant response (the ceiling of TLS + HTTP here),
//! one that parses the AdmissionReview into generic JSON and echoes its uid, and one
//! that parses it into a typed struct holding only the uid (the "parse and echo"
//! ceilings a webhook is compared with).
//!
//! ```text
//! cargo run --release -p appservice-webhook --example webhook-bench -- --concurrency 1,8,32 --duration 3s --policies 0,3,10
//! ```
//!
//! Everything runs on 127.0.0.1 in this process: the servers and the load generator share
//! the machine's cores, the same way for every target, so the ratio is the meaningful
//! number. Each level is bounded by `--duration` and `--max-requests`. After each
//! level's maximum, every target is run again paced at half its maximum rate, and that
//! run's p50/p99 are reported (latency at a sustainable load, not at saturation).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

// The same allocator as the binary.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A realistic UPDATE review (object and oldObject with managed fields and the
/// last-applied annotation).
const REVIEW: &str = include_str!("../tests/fixtures/update-realistic.json");
/// The policies of `examples/policies/no-latest-in-production.yaml`.
const EXAMPLE_POLICIES: &str = include_str!("../../examples/policies/no-latest-in-production.yaml");
/// More policies of the kinds admins write, for the 10-policy runs.
const MORE_POLICIES: [(&str, &str); 7] = [
    (
        "allowed-registry",
        "object.spec.image.startsWith('registry.example.com/')",
    ),
    (
        "no-aws-env",
        "!has(object.spec.env) || object.spec.env.all(e, !e.name.startsWith('AWS_'))",
    ),
    (
        "team-label",
        "has(object.metadata.labels) && 'team' in object.metadata.labels",
    ),
    (
        "memory-limit",
        "!has(object.spec.resources) || !has(object.spec.resources.limits) || !('memory' in object.spec.resources.limits) || quantity(object.spec.resources.limits.memory).compareTo(quantity('4Gi')) <= 0",
    ),
    (
        "port-range",
        "!has(object.spec.port) || object.spec.port >= 1024",
    ),
    ("name-length", "size(object.metadata.name) <= 40"),
    (
        "replicas-cap",
        "!has(object.spec.replicas) || object.spec.replicas <= 50",
    ),
];

/// A policy file with `n` policies: the example's three first, then the others.
fn policies_yaml(n: usize) -> String {
    let mut yaml = String::from(EXAMPLE_POLICIES);
    let example =
        webhook::policy::PolicySet::from_yaml(std::path::Path::new("example"), EXAMPLE_POLICIES)
            .expect("the example policies compile")
            .len();
    if n < example {
        // Keep only the first n of the example.
        let mut set = Vec::new();
        let file: serde_json::Value = serde_saphyr::from_str(EXAMPLE_POLICIES).unwrap();
        for policy in file["policies"].as_array().unwrap().iter().take(n) {
            set.push(policy.clone());
        }
        return serde_json::to_string(&serde_json::json!({ "policies": set })).unwrap();
    }
    for (name, expression) in MORE_POLICIES.iter().take(n - example) {
        yaml.push_str(&format!(
            "\n  - name: {name}\n    expression: {expression:?}\n    message: {name}\n"
        ));
    }
    yaml
}

#[derive(Parser, Debug)]
#[command(about = "TLS keep-alive load against /validate and /mutate, and a bare TLS ceiling")]
struct Args {
    /// Concurrent keep-alive connections, one level per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Measured time per target and level.
    #[arg(long, default_value = "3s", value_parser = webhook::config::parse_duration)]
    duration: Duration,
    /// Unmeasured time per target and level before measuring.
    #[arg(long, default_value = "500ms", value_parser = webhook::config::parse_duration)]
    warmup: Duration,
    /// Upper bound of requests per target and level.
    #[arg(long, default_value_t = 500_000)]
    max_requests: usize,
    /// Worker threads of the runtime (servers and load generator share it).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also log every admission as JSON (to a sink), as in production at level info.
    #[arg(long)]
    with_logs: bool,
    /// Numbers of CEL policies to run the webhook with, one server per value (3 is
    /// `examples/policies/no-latest-in-production.yaml`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    policies: Vec<usize>,
    /// Rounds over all targets; each target's best round is reported (the machine's
    /// other load then weighs less on one target than another).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Skip the runs paced at half the maximum rate.
    #[arg(long)]
    no_paced: bool,
    /// Use one HTTP/2 connection with `concurrency` concurrent streams (how the API
    /// server calls webhooks) instead of `concurrency` HTTP/1.1 keep-alive connections.
    #[arg(long)]
    http2: bool,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(args));
}

struct Target {
    name: String,
    addr: SocketAddr,
    path: &'static str,
}

struct Measurement {
    /// CPU time of this whole process (servers and load generator) per request, in µs:
    /// unlike req/s, barely moved by other processes on the machine.
    cpu_us: f64,
    requests: usize,
    errors: usize,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

impl Measurement {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile(&self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let index = ((self.latencies_us.len() as f64 - 1.0) * q).round() as usize;
        f64::from(self.latencies_us[index]) / 1000.0
    }
}

async fn run(args: Args) {
    webhook::tls::install_crypto_provider();
    if args.with_logs {
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_writer(std::io::sink)
            .init();
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::Ca::new("webhook-bench CA").unwrap();
    let serving = ca.serving_cert(&["127.0.0.1"]).unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    serving.write(&cert_path, &key_path).unwrap();

    // One webhook per policy count (0 is always there, for /mutate).
    let mut counts = args.policies.clone();
    if !counts.contains(&0) {
        counts.insert(0, 0);
    }
    let mut servers = Vec::new();
    for &n in &counts {
        let policies = (n > 0).then(|| {
            let path = dir.path().join(format!("policies-{n}.yaml"));
            std::fs::write(&path, policies_yaml(n)).unwrap();
            path
        });
        let server = webhook::start(&webhook::Config::local(
            cert_path.clone(),
            key_path.clone(),
            policies,
        ))
        .await
        .unwrap();
        assert_eq!(server.state().policies.current().len(), n);
        servers.push((n, server));
    }
    let constant = bare_server(&serving, Bare::Constant).await;
    let generic = bare_server(&serving, Bare::ParseGeneric).await;
    let typed = bare_server(&serving, Bare::ParseTyped).await;

    // Sanity: every target answers the review as expected before measuring.
    let client = connector(ca.cert_pem(), args.http2);
    let body = Bytes::from_static(REVIEW.as_bytes());
    let mut targets = vec![
        Target {
            name: "bare constant".into(),
            addr: constant,
            path: "/",
        },
        Target {
            name: "bare parse+echo (JSON)".into(),
            addr: generic,
            path: "/",
        },
        Target {
            name: "bare parse+echo (typed)".into(),
            addr: typed,
            path: "/",
        },
    ];
    for (n, server) in &servers {
        targets.push(Target {
            name: format!("/validate, {n} policies"),
            addr: server.tls_addr(),
            path: "/validate",
        });
        if *n == 0 {
            targets.push(Target {
                name: "/mutate".into(),
                addr: server.tls_addr(),
                path: "/mutate",
            });
        }
    }
    for target in &targets {
        let mut conn = if args.http2 {
            Conn::open_h2(&client, target.addr).await
        } else {
            Conn::open(&client, target.addr).await
        };
        let (status, reply) = conn.post(target.path, body.clone()).await.unwrap();
        let text = String::from_utf8_lossy(&reply);
        assert!(
            status == StatusCode::OK
                && text.contains("\"allowed\":true")
                && text.contains("9d3c2f0e-4b1a-4c8e-9f7d-1a2b3c4d5e6f"),
            "{}: {status} {text}",
            target.name
        );
    }

    println!(
        "{}; UPDATE review body {} bytes; {} worker threads shared by servers and load; {:?} per level (+{:?} warm-up), at most {} requests, best of {} rounds",
        if args.http2 {
            "HTTP/2, one connection, one stream per concurrent request"
        } else {
            "HTTP/1.1 keep-alive, one connection per concurrent request"
        },
        REVIEW.len(),
        args.threads,
        args.duration,
        args.warmup,
        args.max_requests,
        args.rounds
    );
    println!(
        "{:<26} {:>5} {:>9} {:>8} {:>8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9}",
        "target",
        "conc",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "vs const",
        "vs JSON",
        "vs typed",
        "½rate p50",
        "½rate p99",
        "cpu µs/req"
    );
    for &concurrency in &args.concurrency {
        // Best round per target, targets interleaved within a round.
        let mut best: Vec<Option<Measurement>> = targets.iter().map(|_| None).collect();
        for _ in 0..args.rounds.max(1) {
            for (i, target) in targets.iter().enumerate() {
                let m = measure(&client, target, concurrency, &args, body.clone(), None).await;
                if best[i].as_ref().is_none_or(|b| m.rps() > b.rps()) {
                    best[i] = Some(m);
                }
            }
        }
        let best: Vec<Measurement> = best.into_iter().flatten().collect();
        let ceilings: Vec<f64> = best.iter().take(3).map(Measurement::rps).collect();
        for (target, m) in targets.iter().zip(&best) {
            let ratio = |i: usize| format!("{:.0}%", 100.0 * m.rps() / ceilings[i]);
            let paced = if args.no_paced {
                ("-".to_owned(), "-".to_owned())
            } else {
                let half = measure(
                    &client,
                    target,
                    concurrency,
                    &args,
                    body.clone(),
                    Some(m.rps() / 2.0),
                )
                .await;
                (
                    format!("{:.3}", half.quantile(0.50)),
                    format!("{:.3}", half.quantile(0.99)),
                )
            };
            println!(
                "{:<26} {:>5} {:>9.0} {:>8.3} {:>8.3} {:>8.3} {:>6} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9.1}",
                target.name,
                concurrency,
                m.rps(),
                m.quantile(0.50),
                m.quantile(0.99),
                m.quantile(0.999),
                m.errors,
                ratio(0),
                ratio(1),
                ratio(2),
                paced.0,
                paced.1,
                m.cpu_us
            );
        }
    }
    for (_, server) in servers {
        server.shutdown().await.unwrap();
    }
}

/// Sends requests for `args.duration` on `concurrency` connections (or h2 streams):
/// back to back, or, with `rate`, paced at that many requests per second in total.
async fn measure(
    client: &TlsConnector,
    target: &Target,
    concurrency: usize,
    args: &Args,
    body: Bytes,
    rate: Option<f64>,
) -> Measurement {
    let mut conns = Vec::new();
    if args.http2 {
        let shared = Conn::open_h2(client, target.addr).await;
        for _ in 0..concurrency {
            conns.push(shared.stream());
        }
    } else {
        for _ in 0..concurrency {
            conns.push(Conn::open(client, target.addr).await);
        }
    }
    let budget = Arc::new(AtomicUsize::new(args.max_requests));
    let mut cpu_at_measure: Option<f64> = None;
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let stop_at = measure_from + args.duration;
    // Each connection sends one request per `interval`, offset so they interleave.
    let interval = rate.map(|r| Duration::from_secs_f64(concurrency as f64 / r.max(1.0)));
    let mut tasks = Vec::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        let (body, budget, path) = (body.clone(), budget.clone(), target.path);
        let mut next = interval.map(|iv| start + iv.mul_f64(i as f64 / concurrency as f64));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0usize;
            loop {
                if let (Some(at), Some(iv)) = (next, interval) {
                    tokio::time::sleep_until(at.into()).await;
                    next = Some(at + iv);
                }
                let sent = Instant::now();
                if sent >= stop_at {
                    break;
                }
                let measured = sent >= measure_from;
                if measured
                    && budget
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_err()
                {
                    break;
                }
                let ok = matches!(conn.post(path, body.clone()).await, Ok((StatusCode::OK, _)));
                if measured {
                    if ok {
                        latencies
                            .push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                    } else {
                        errors += 1;
                    }
                }
                if !ok {
                    break;
                }
            }
            (latencies, errors)
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    cpu_at_measure = cpu_at_measure.or_else(|| webhook::process::sample().cpu_seconds);
    tokio::time::sleep_until(stop_at.into()).await;
    let cpu_at_stop = webhook::process::sample().cpu_seconds;
    let mut latencies_us = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.unwrap();
        latencies_us.extend(l);
        errors += e;
    }
    let elapsed = Instant::now()
        .min(stop_at)
        .saturating_duration_since(measure_from);
    latencies_us.sort_unstable();
    let cpu_us = match (cpu_at_measure, cpu_at_stop) {
        (Some(a), Some(b)) if !latencies_us.is_empty() => (b - a) * 1e6 / latencies_us.len() as f64,
        _ => f64::NAN,
    };
    Measurement {
        cpu_us,
        requests: latencies_us.len(),
        errors,
        elapsed: elapsed.max(Duration::from_millis(1)),
        latencies_us,
    }
}

fn connector(ca_pem: &str, http2: bool) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![if http2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    TlsConnector::from(Arc::new(config))
}

/// One HTTP/1.1 keep-alive connection over TLS.
struct Conn {
    sender: Sender,
    host: String,
}

/// HTTP/1.1 (one request at a time per connection) or h2 (a stream per request; clones
/// share one connection, as the API server multiplexes its webhook calls).
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    async fn open(connector: &TlsConnector, addr: SocketAddr) -> Conn {
        let tls = tls_connect(connector, addr).await;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn {
            sender: Sender::H1(sender),
            host: addr.to_string(),
        }
    }

    async fn open_h2(connector: &TlsConnector, addr: SocketAddr) -> Conn {
        let tls = tls_connect(connector, addr).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        Conn {
            sender: Sender::H2(sender),
            host: addr.to_string(),
        }
    }

    /// Another concurrent stream on the same h2 connection.
    fn stream(&self) -> Conn {
        let sender = match &self.sender {
            Sender::H2(sender) => Sender::H2(sender.clone()),
            Sender::H1(_) => unreachable!("HTTP/1.1 connections carry one request at a time"),
        };
        Conn {
            sender,
            host: self.host.clone(),
        }
    }

    async fn post(&mut self, path: &str, body: Bytes) -> Result<(StatusCode, Bytes), hyper::Error> {
        let request = Request::post(path)
            .header("host", &self.host)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let response = match &mut self.sender {
            Sender::H1(sender) => sender.send_request(request).await?,
            Sender::H2(sender) => sender.send_request(request).await?,
        };
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

async fn tls_connect(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .unwrap()
}

/// What a bare server does with a request.
#[derive(Clone, Copy)]
enum Bare {
    /// Reads the body and answers a constant AdmissionReview.
    Constant,
    /// Parses the body into generic JSON and echoes `request.uid`.
    ParseGeneric,
    /// Parses the body into a struct holding only `request.uid` (the rest is checked
    /// for syntax and skipped) and echoes it.
    ParseTyped,
}

#[derive(serde::Deserialize)]
struct UidOnly<'a> {
    #[serde(borrow)]
    request: UidRequest<'a>,
}

#[derive(serde::Deserialize)]
struct UidRequest<'a> {
    #[serde(borrow)]
    uid: std::borrow::Cow<'a, str>,
}

fn echo(uid: &str) -> Bytes {
    let answer = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true, "status": {"metadata": {}, "code": 0, "message": "", "reason": ""}}
    });
    Bytes::from(serde_json::to_vec(&answer).unwrap())
}

/// rustls + hyper answering every request after reading its body like the webhook does:
/// the ceilings for TLS + HTTP (+ JSON parsing) on this machine.
async fn bare_server(serving: &certs::CertKey, mode: Bare) -> SocketAddr {
    let chain = CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    static ANSWER: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"9d3c2f0e-4b1a-4c8e-9f7d-1a2b3c4d5e6f","allowed":true,"status":{"metadata":{},"code":0,"message":"","reason":""}}}"#;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |request: Request<Incoming>| async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let answer = match mode {
                            Bare::Constant => Bytes::from_static(ANSWER),
                            Bare::ParseGeneric => {
                                let review: serde_json::Value =
                                    serde_json::from_slice(&body).unwrap_or_default();
                                echo(review["request"]["uid"].as_str().unwrap_or_default())
                            }
                            Bare::ParseTyped => {
                                match serde_json::from_slice::<UidOnly<'_>>(&body) {
                                    Ok(review) => echo(&review.request.uid),
                                    Err(_) => echo(""),
                                }
                            }
                        };
                        Ok::<_, hyper::Error>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(answer))
                                .unwrap(),
                        )
                    });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}
