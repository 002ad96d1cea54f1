//! Shared helpers of the webhook's integration tests: fixtures, an in-process state, a
//! TLS test server with a CA, and a real TLS client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod process;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tower::ServiceExt;
use webhook::metrics::Metrics;
use webhook::policy::{PolicySet, PolicyStore};
use webhook::{Config, Limits, State};

pub fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(webhook::tls::install_crypto_provider);
}

pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// State for `Router::oneshot` tests, with the given policies.
pub fn state(policies: Option<&str>) -> Arc<State> {
    let set = match policies {
        Some(yaml) => PolicySet::from_yaml(Path::new("test.yaml"), yaml).unwrap(),
        None => PolicySet::default(),
    };
    Arc::new(State::new(
        PolicyStore::fixed(set),
        Arc::new(Metrics::new()),
        Limits::default(),
    ))
}

/// Sends one request through the router.
pub async fn oneshot(
    router: &Router,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// The `response` of an AdmissionReview body.
pub fn response_of(body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    review["response"].clone()
}

/// The JSON patch of a response, decoded (`[]` when there is none). kube writes the
/// `[]byte` as an array of numbers, which Go's decoder accepts like base64.
pub fn patch_of(response: &Value) -> Value {
    match &response["patch"] {
        Value::Null => Value::Array(vec![]),
        Value::String(b64) => serde_json::from_slice(&base64_decode::decode(b64)).unwrap(),
        Value::Array(numbers) => {
            let raw: Vec<u8> = numbers.iter().map(|n| n.as_u64().unwrap() as u8).collect();
            serde_json::from_slice(&raw).unwrap()
        }
        other => panic!("unexpected patch {other}"),
    }
}

mod base64_decode {
    /// Standard base64 (the API's encoding of `[]byte`), enough for test assertions.
    pub fn decode(input: &str) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = Vec::new();
        let mut buffer = 0u32;
        let mut bits = 0;
        for c in input.bytes().filter(|c| *c != b'=') {
            let value = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
            buffer = (buffer << 6) | value;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((buffer >> bits) as u8);
                buffer &= (1 << bits) - 1;
            }
        }
        out
    }
}

/// A CA and a serving certificate for 127.0.0.1 in a temporary directory.
pub struct TestCerts {
    pub dir: tempfile::TempDir,
    pub ca: certs::Ca,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl TestCerts {
    pub fn new() -> Self {
        install_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = certs::Ca::new("webhook-test-ca").unwrap();
        let cert_path = dir.path().join("tls.crt");
        let key_path = dir.path().join("tls.key");
        ca.serving_cert(&["127.0.0.1", "localhost"])
            .unwrap()
            .write(&cert_path, &key_path)
            .unwrap();
        TestCerts {
            dir,
            ca,
            cert_path,
            key_path,
        }
    }

    pub fn config(&self, policies: Option<PathBuf>) -> Config {
        let mut config = Config::local(self.cert_path.clone(), self.key_path.clone(), policies);
        config.reload_interval = Duration::from_secs(3600);
        config
    }

    pub fn client(&self) -> TlsClient {
        TlsClient::new(self.ca.cert_pem())
    }

    /// Writes `yaml` as the policy file next to the certificates; returns its path.
    pub fn write_policies(&self, yaml: &str) -> PathBuf {
        let path = self.dir.path().join("policies.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

/// A TLS client trusting one CA; one connection per request so every request does a
/// fresh handshake and sees the certificate served right now.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    h2: TlsConnector,
    /// The local address connections come from (default: the kernel's choice).
    source: Option<std::net::IpAddr>,
}

/// What one request saw.
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    /// The leaf certificate the server presented.
    pub peer_cert: Vec<u8>,
    pub version: http::Version,
}

impl TlsClient {
    pub fn new(ca_pem: &str) -> Self {
        Self::with_identity(ca_pem, None)
    }

    /// A client that presents `identity` (certificate and key, PEM) when asked for one.
    pub fn with_identity(ca_pem: &str, identity: Option<(&str, &str)>) -> Self {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile_certs(ca_pem) {
            roots.add(cert).unwrap();
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match identity {
            Some((cert_pem, key_pem)) => builder
                .with_client_auth_cert(
                    rustls_pemfile_certs(cert_pem),
                    PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        // Full handshakes only: a resumed session does not carry the server's certificate
        // again, so `peer_certificates` would report the one from the first handshake.
        config.resumption = rustls::client::Resumption::disabled();
        let mut h1 = config.clone();
        h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut h2 = config;
        h2.alpn_protocols = vec![b"h2".to_vec()];
        TlsClient {
            connector: TlsConnector::from(Arc::new(h1)),
            h2: TlsConnector::from(Arc::new(h2)),
            source: None,
        }
    }

    /// This client, connecting from the local address `source` (another peer).
    pub fn connecting_from(mut self, source: std::net::IpAddr) -> Self {
        self.source = Some(source);
        self
    }

    /// A new TLS connection (ALPN `h2` when `h2`, else `http/1.1`).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        h2: bool,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = match self.source {
            Some(source) => process::connect_from(source, addr).await?,
            None => TcpStream::connect(addr).await?,
        };
        // As the API server's client: without it, Nagle's algorithm and delayed ACKs add
        // ~40 ms to an h2 request whose headers and body go out in separate writes.
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(addr.ip().into());
        let connector = if h2 { &self.h2 } else { &self.connector };
        connector.connect(name, tcp).await
    }

    /// POSTs the review of a minimal AppService (`create-minimal.json`) to `path` over a
    /// new TLS connection (HTTP/2 when `h2`).
    pub async fn review(&self, addr: SocketAddr, path: &str, h2: bool) -> Result<Reply, String> {
        self.post(addr, path, bytes(&fixture("create-minimal.json")), h2)
            .await
    }

    /// POSTs `body` to `path` over a new TLS connection (HTTP/2 when `h2`).
    pub async fn post(
        &self,
        addr: SocketAddr,
        path: &str,
        body: Vec<u8>,
        h2: bool,
    ) -> Result<Reply, String> {
        let stream = self
            .connect(addr, h2)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let peer_cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default();
        let request = Request::builder()
            .method("POST")
            .uri(format!("https://{addr}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = if h2 {
            let (mut sender, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                TokioIo::new(stream),
            )
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(conn);
            sender
                .send_request(request)
                .await
                .map_err(|e| format!("h2 request: {e}"))?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("h1 handshake: {e}"))?;
            tokio::spawn(conn);
            sender
                .send_request(request)
                .await
                .map_err(|e| format!("h1 request: {e}"))?
        };
        let status = response.status();
        let version = response.version();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(Reply {
            status,
            body,
            peer_cert,
            version,
        })
    }

    /// Opens a TLS connection and returns it, for tests that write raw bytes.
    pub async fn raw(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.connect(addr, false).await
    }
}

fn rustls_pemfile_certs(pem: &str) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The DER of the first certificate in a PEM file.
pub fn leaf_der(pem_path: &Path) -> Vec<u8> {
    let pem = std::fs::read_to_string(pem_path).unwrap();
    rustls_pemfile_certs(&pem)[0].as_ref().to_vec()
}

/// Plain HTTP GET against the operations port.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let (status, body) = get_bytes(addr, path).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Plain HTTP GET against the operations port, the body as bytes.
pub async fn get_bytes(addr: SocketAddr, path: &str) -> (StatusCode, Bytes) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::builder()
        .uri(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}
