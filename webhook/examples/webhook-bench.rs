//! Load benchmark of the webhook over TLS keep-alive, against a bare rustls + hyper server
//! answering a constant response in the same run (the ceiling of this machine).
//!
//! ```text
//! cargo run --release -p appservice-webhook --example webhook-bench -- --concurrency 1,8,32 --duration 3s
//! ```
//!
//! Everything runs on 127.0.0.1 in this process: the servers and the load generator share
//! the machine's cores, the same way for every target, so the ratio is the meaningful
//! number. Each level is bounded by `--duration` and `--max-requests`.
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

const REVIEW: &str = include_str!("../tests/fixtures/create-minimal.json");
const POLICIES: &str = r#"
policies:
  - name: allowed-registry
    expression: "object.spec.image.startsWith('registry.example.com/')"
    message: "images must come from registry.example.com"
  - name: production-replicas
    expression: "request.namespace != 'production' || !has(object.spec.replicas) || object.spec.replicas >= 2"
    message: "production needs at least 2 replicas"
"#;

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
    /// Run the webhook without CEL policies (the default loads two).
    #[arg(long)]
    no_policies: bool,
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
    name: &'static str,
    addr: SocketAddr,
    path: &'static str,
}

struct Measurement {
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
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, POLICIES).unwrap();

    let policies = (!args.no_policies).then_some(policies);
    let server = webhook::start(&webhook::Config::local(cert_path, key_path, policies))
        .await
        .unwrap();
    let bare = bare_server(&serving).await;

    // Sanity: both endpoints answer the review as expected before measuring.
    let client = connector(ca.cert_pem(), args.http2);
    let body = Bytes::from_static(REVIEW.as_bytes());
    for (path, needle) in [
        ("/validate", "\"allowed\":true"),
        ("/mutate", "\"patchType\":\"JSONPatch\""),
    ] {
        let mut conn = if args.http2 {
            Conn::open_h2(&client, server.tls_addr()).await
        } else {
            Conn::open(&client, server.tls_addr()).await
        };
        let (status, reply) = conn.post(path, body.clone()).await.unwrap();
        let text = String::from_utf8_lossy(&reply);
        assert!(
            status == StatusCode::OK && text.contains(needle),
            "{path}: {status} {text}"
        );
    }

    let targets = [
        Target {
            name: "bare rustls+hyper",
            addr: bare,
            path: "/",
        },
        Target {
            name: "webhook /validate",
            addr: server.tls_addr(),
            path: "/validate",
        },
        Target {
            name: "webhook /mutate",
            addr: server.tls_addr(),
            path: "/mutate",
        },
    ];
    println!(
        "{}; review body {} bytes; {} CEL policies; {} worker threads shared by servers and load; {:?} per level (+{:?} warm-up), at most {} requests",
        if args.http2 {
            "HTTP/2, one connection, one stream per concurrent request"
        } else {
            "HTTP/1.1 keep-alive, one connection per concurrent request"
        },
        REVIEW.len(),
        server.state().policies.current().len(),
        args.threads,
        args.duration,
        args.warmup,
        args.max_requests
    );
    println!(
        "{:<20} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "target", "conc", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "errors", "vs bare"
    );
    for &concurrency in &args.concurrency {
        let mut ceiling = None;
        for target in &targets {
            let m = measure(&client, target, concurrency, &args, body.clone()).await;
            let ratio = match ceiling {
                None => {
                    ceiling = Some(m.rps());
                    "100%".to_owned()
                }
                Some(bare) => format!("{:.0}%", 100.0 * m.rps() / bare),
            };
            println!(
                "{:<20} {:>5} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>7} {:>9}",
                target.name,
                concurrency,
                m.rps(),
                m.quantile(0.50),
                m.quantile(0.99),
                m.quantile(0.999),
                m.errors,
                ratio
            );
        }
    }
    server.shutdown().await.unwrap();
}

async fn measure(
    client: &TlsConnector,
    target: &Target,
    concurrency: usize,
    args: &Args,
    body: Bytes,
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
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let stop_at = measure_from + args.duration;
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (body, budget, path) = (body.clone(), budget.clone(), target.path);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0usize;
            loop {
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
    Measurement {
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

/// rustls + hyper answering every request with a constant AdmissionReview, after reading
/// the body like the webhook does: the ceiling for TLS + HTTP on this machine.
async fn bare_server(serving: &certs::CertKey) -> SocketAddr {
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
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let _ = request.into_body().collect().await?;
                    Ok::<_, hyper::Error>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(ANSWER)))
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
