//! A hostile OCI registry: an HTTPS server that speaks just enough of the distribution
//! API to be asked for an image, and answers what no registry should: manifests of
//! hundreds of MiB, a token endpoint that never stops talking, redirect loops, an error
//! body of 256 MiB, a header of 1 MiB, a body that drips one byte a second. What a
//! client gets is chosen by the repository it asks for ([`Scenario::repo`]), so one
//! server holds every scenario and a test names the one it wants in the image reference
//! ([`HostileRegistry::image`]).
//!
//! Bodies of any size are generated while they are sent, from one static buffer of
//! spaces, and never held: serving 256 MiB costs the server no more memory than serving
//! 256 bytes. Each request is recorded with the number of body bytes the server produced
//! for it ([`HostileRequest::body_sent`]), which is what tells a client that stopped
//! reading at its bound from one that read everything and then refused.
//!
//! The ping (`GET /v2/`) answers 401 with a bearer challenge whose realm is
//! `https://<host>/token`, as public registries answer an anonymous client; the token
//! endpoint gives any client a small token, except for the scope of a
//! [`Scenario::HugeToken`] repository. The other scenarios do not check the token.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::{self, BoxStream};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use sha2::{Digest as _, Sha256};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result, io};

const MIB: u64 = 1024 * 1024;
/// The body of a huge manifest, token or error: 256 MiB, the size that made a client
/// which buffers whole bodies grow by 503 MiB.
pub const HUGE_BYTES: u64 = 256 * MIB;
/// The body of a huge signature manifest: 128 MiB.
pub const HUGE_SIGNATURE_BYTES: u64 = 128 * MIB;
/// The value of the header of [`Scenario::HugeHeader`]: 1 MiB.
pub const HUGE_HEADER_BYTES: usize = 1024 * 1024;
/// The redirects of [`Scenario::RedirectChain`] before its real answer.
pub const REDIRECT_CHAIN_HOPS: u32 = 50;
/// The body of [`Scenario::Drip`], sent one byte per [`DRIP_INTERVAL`]: 17 minutes.
pub const DRIP_BYTES: u64 = 1024;
pub const DRIP_INTERVAL: Duration = Duration::from_secs(1);
/// The name of the header of [`Scenario::HugeHeader`].
pub const PADDING_HEADER: &str = "x-hostile-padding";

/// The size of one chunk of a generated body.
const CHUNK: usize = 64 * 1024;
/// What a generated body is made of, between its prefix and its suffix: every chunk is a
/// slice of this buffer, so no body is ever allocated.
static SPACES: [u8; CHUNK] = [b' '; CHUNK];
/// Requests recorded at most; a client in a redirect loop cannot grow the record past it.
pub const MAX_RECORDED: usize = 100_000;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const JSON: &str = "application/json";
const DOCKER_CONTENT_DIGEST: HeaderName = HeaderName::from_static("docker-content-digest");
/// The one well-formed image manifest this registry serves (an empty config and one
/// layer it never serves: no client of a signature check reads an image's layers).
const SMALL_MANIFEST: &str = concat!(
    r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
    r#""config":{"mediaType":"application/vnd.oci.image.config.v1+json","#,
    r#""digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"#,
    r#""layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","#,
    r#""digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0}]}"#
);
const SMALL_TOKEN: &str = r#"{"token":"hostile","access_token":"hostile","expires_in":300}"#;

/// Whether a generated body declares its length (`Content-Length`) or is sent chunked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Length {
    Declared,
    Chunked,
}

impl Length {
    fn as_str(self) -> &'static str {
        match self {
            Length::Declared => "declared",
            Length::Chunked => "chunked",
        }
    }

    fn parse(s: &str) -> Option<Length> {
        match s {
            "declared" => Some(Length::Declared),
            "chunked" => Some(Length::Chunked),
            _ => None,
        }
    }
}

/// What the registry answers for one repository. Any tag of it is the image's tag;
/// `sha256-<hex>.sig` is its cosign signature tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// `unsigned`, the control: a small image manifest with its `Docker-Content-Digest`,
    /// and no signature (404). A client that reads this registry at all finds the image
    /// unsigned.
    Unsigned,
    /// `huge-manifest/<length>`: `HEAD` of the tag answers 200 without
    /// `Docker-Content-Digest` (and, declared, with a `Content-Length` of
    /// [`HUGE_BYTES`]), so the client must `GET` the manifest to digest it; the `GET`
    /// streams [`HUGE_BYTES`] of JSON (`{"schemaVersion":2,"x":"` then spaces).
    HugeManifest(Length),
    /// `huge-signature/<length>`: the tag is the small manifest with its digest; the
    /// signature manifest (`HEAD` and `GET`, without digest) is [`HUGE_SIGNATURE_BYTES`]
    /// of JSON.
    HugeSignature(Length),
    /// `huge-token/<length>`: every request of the repository answers 401 with a bearer
    /// challenge for its scope; the token endpoint answers that scope with
    /// [`HUGE_BYTES`] of JSON (`{"token":"` then spaces).
    HugeToken(Length),
    /// `redirect-loop`: every manifest request answers 307 to its own URL.
    RedirectLoop,
    /// `redirect-chain`: a manifest request answers 307 to the same path with
    /// `?hop=<n+1>`, [`REDIRECT_CHAIN_HOPS`] times, then as [`Scenario::Unsigned`] does.
    RedirectChain,
    /// `huge-error/<status>/<length>`: `HEAD` of the tag answers 200 without digest;
    /// its `GET` answers `status` with an error body of [`HUGE_BYTES`]
    /// (`{"errors":[{"code":"MANIFEST_UNKNOWN" (404) or "UNKNOWN","message":"` then
    /// spaces).
    HugeError(u16, Length),
    /// `huge-header`: the tag is the small manifest with its digest and a
    /// [`PADDING_HEADER`] of [`HUGE_HEADER_BYTES`].
    HugeHeader,
    /// `drip`: `HEAD` of the tag answers 200 without digest; its `GET` declares
    /// [`DRIP_BYTES`] and sends one byte per [`DRIP_INTERVAL`].
    Drip,
}

impl Scenario {
    /// Every scenario this registry serves (the error scenario with 404 and 500).
    pub const ALL: [Scenario; 13] = [
        Scenario::Unsigned,
        Scenario::HugeManifest(Length::Declared),
        Scenario::HugeManifest(Length::Chunked),
        Scenario::HugeSignature(Length::Declared),
        Scenario::HugeSignature(Length::Chunked),
        Scenario::HugeToken(Length::Declared),
        Scenario::HugeToken(Length::Chunked),
        Scenario::RedirectLoop,
        Scenario::RedirectChain,
        Scenario::HugeError(404, Length::Declared),
        Scenario::HugeError(500, Length::Chunked),
        Scenario::HugeHeader,
        Scenario::Drip,
    ];

    /// The repository that selects this scenario.
    pub fn repo(self) -> String {
        match self {
            Scenario::Unsigned => "unsigned".to_owned(),
            Scenario::HugeManifest(l) => format!("huge-manifest/{}", l.as_str()),
            Scenario::HugeSignature(l) => format!("huge-signature/{}", l.as_str()),
            Scenario::HugeToken(l) => format!("huge-token/{}", l.as_str()),
            Scenario::RedirectLoop => "redirect-loop".to_owned(),
            Scenario::RedirectChain => "redirect-chain".to_owned(),
            Scenario::HugeError(status, l) => format!("huge-error/{status}/{}", l.as_str()),
            Scenario::HugeHeader => "huge-header".to_owned(),
            Scenario::Drip => "drip".to_owned(),
        }
    }

    /// The scenario a repository selects; `None` for any other repository (404).
    pub fn from_repo(repo: &str) -> Option<Scenario> {
        let parts: Vec<&str> = repo.split('/').collect();
        match parts.as_slice() {
            ["unsigned"] => Some(Scenario::Unsigned),
            ["huge-manifest", l] => Length::parse(l).map(Scenario::HugeManifest),
            ["huge-signature", l] => Length::parse(l).map(Scenario::HugeSignature),
            ["huge-token", l] => Length::parse(l).map(Scenario::HugeToken),
            ["redirect-loop"] => Some(Scenario::RedirectLoop),
            ["redirect-chain"] => Some(Scenario::RedirectChain),
            ["huge-error", status, l] => {
                let status = status
                    .parse::<u16>()
                    .ok()
                    .filter(|s| (400..600).contains(s))?;
                Length::parse(l).map(|l| Scenario::HugeError(status, l))
            }
            ["huge-header"] => Some(Scenario::HugeHeader),
            ["drip"] => Some(Scenario::Drip),
            _ => None,
        }
    }
}

/// One request the registry answered, with what it sent so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostileRequest {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: Option<String>,
    /// The repository the request was about: from its path, or, for the token
    /// endpoint, from the scope asked for.
    pub repo: Option<String>,
    pub status: u16,
    /// The length of the body the answer has (0 for `HEAD` and empty answers).
    pub body_length: u64,
    /// The body bytes produced for the connection so far: never less than what the
    /// client received. The server produces a chunk when the connection can take it,
    /// so this exceeds what reached the client by at most what sits in hyper's write
    /// buffer (16 chunks of 64 KiB), rustls' buffer (64 KiB), and the kernel's socket
    /// buffers of both ends.
    pub body_sent: u64,
    /// Whether the server is done with the body: all sent, or the connection gone.
    /// Once it is, [`HostileRequest::body_sent`] no longer changes.
    pub body_ended: bool,
}

impl HostileRequest {
    /// Whether the client was sent the whole body.
    pub fn body_complete(&self) -> bool {
        self.body_sent >= self.body_length
    }

    /// The scenario the request was about.
    pub fn scenario(&self) -> Option<Scenario> {
        self.repo.as_deref().and_then(Scenario::from_repo)
    }

    /// Whether this is a request of a manifest, by tag or digest.
    pub fn is_manifest(&self) -> bool {
        self.path.contains("/manifests/")
    }

    /// Whether this is a request of a cosign signature manifest.
    pub fn is_signature(&self) -> bool {
        self.is_manifest() && self.path.ends_with(".sig")
    }
}

/// A running hostile registry on `127.0.0.1:<port>`; stopped (its port closed and every
/// connection dropped) when dropped.
pub struct HostileRegistry {
    host: String,
    ca_pem: String,
    dir: tempfile::TempDir,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for HostileRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostileRegistry")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl HostileRegistry {
    /// Listens on a free port of 127.0.0.1 with a certificate of a fresh CA (valid for
    /// `127.0.0.1`, `localhost` and `::1`) and serves every [`Scenario`]. Must be called
    /// in the runtime that will serve it.
    pub async fn start() -> Result<HostileRegistry> {
        let ca = certs::Ca::new("appservice-tests hostile registry CA")?;
        let serving = ca.serving_cert(&["127.0.0.1", "localhost", "::1"])?;
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&serving)?));
        let dir = tempfile::Builder::new()
            .prefix("appservice-hostile-registry-")
            .tempdir()
            .map_err(io("creating the hostile registry's directory"))?;
        std::fs::write(dir.path().join("ca.crt"), ca.cert_pem())
            .map_err(io("writing the hostile registry's CA"))?;

        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(io("binding the hostile registry"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the hostile registry's address"))?;
        let host = addr.to_string();
        let state = Arc::new(State::new(host.clone())?);
        let accept = tokio::spawn(accept_loop(listener, tls, Arc::clone(&state)));
        Ok(HostileRegistry {
            host,
            ca_pem: ca.cert_pem().to_owned(),
            dir,
            state,
            accept,
        })
    }

    /// `127.0.0.1:<port>`: the registry host of its image references.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `<host>/<scenario's repo>:v1`.
    pub fn image(&self, scenario: Scenario) -> String {
        self.image_tagged(scenario, "v1")
    }

    /// `<host>/<scenario's repo>:<tag>`: every tag of a scenario's repository answers
    /// the same, so distinct tags make distinct references to the same hostility.
    pub fn image_tagged(&self, scenario: Scenario, tag: &str) -> String {
        format!("{}/{}:{tag}", self.host, scenario.repo())
    }

    /// PEM of the CA of the registry's certificate: what a client must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The same CA as a file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The digest of the small manifest the registry serves for the tags of
    /// [`Scenario::Unsigned`], [`Scenario::HugeSignature`], [`Scenario::HugeHeader`] and
    /// the end of [`Scenario::RedirectChain`].
    pub fn small_manifest_digest(&self) -> &str {
        &self.state.small_digest
    }

    /// Every request answered so far (at most [`MAX_RECORDED`]), in the order they came,
    /// with the body bytes sent for each until now.
    pub fn requests(&self) -> Vec<HostileRequest> {
        self.state
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|r| r.snapshot())
            .collect()
    }

    /// The requests about `scenario`'s repository (its token requests included).
    pub fn requests_of(&self, scenario: Scenario) -> Vec<HostileRequest> {
        let repo = scenario.repo();
        self.requests()
            .into_iter()
            .filter(|r| r.repo.as_deref() == Some(repo.as_str()))
            .collect()
    }
}

/// The server's TLS configuration: the serving certificate, HTTP/1.1 only.
fn server_config(serving: &certs::CertKey) -> Result<rustls::ServerConfig> {
    let config = |e: String| Error::Config(format!("the hostile registry's TLS: {e}"));
    let chain = rustls_pemfile::certs(&mut serving.cert_pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| config(e.to_string()))?;
    let key = rustls_pemfile::private_key(&mut serving.key_pem.as_bytes())
        .map_err(|e| config(e.to_string()))?
        .ok_or_else(|| config("no private key".to_owned()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| config(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| config(e.to_string()))?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(server)
}

/// Accepts until aborted; the connections are aborted with it (they live in its set).
async fn accept_loop(listener: TcpListener, tls: tokio_rustls::TlsAcceptor, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let (tls, state) = (tls.clone(), Arc::clone(&state));
                connections.spawn(async move {
                    let Ok(stream) = tls.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |request| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, Infallible>(state.respond(&request)) }
                    });
                    // A client that goes away mid-body ends the connection with an error:
                    // that is what the hostile registry is for.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A body generated while it is sent: `prefix`, spaces, `suffix`, `length` bytes in all.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Content {
    prefix: Bytes,
    length: u64,
    suffix: Bytes,
}

impl Content {
    fn new(prefix: &'static str, length: u64, suffix: &'static str) -> Content {
        Content {
            prefix: Bytes::from_static(prefix.as_bytes()),
            length,
            suffix: Bytes::from_static(suffix.as_bytes()),
        }
    }

    fn filler(&self) -> u64 {
        self.length
            .saturating_sub(self.prefix.len() as u64 + self.suffix.len() as u64)
    }

    /// The body in chunks of at most [`CHUNK`] bytes.
    fn chunks(self) -> BoxStream<'static, Bytes> {
        let fill = stream::unfold(self.filler(), |left| async move {
            let n = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
            (left > 0).then(|| (Bytes::from_static(&SPACES[..n]), left - n as u64))
        });
        stream::iter([self.prefix])
            .chain(fill)
            .chain(stream::iter([self.suffix]))
            .boxed()
    }

    /// The body one byte per `interval`, each byte after its wait.
    fn drip(self, interval: Duration) -> BoxStream<'static, Bytes> {
        let length = self.length;
        stream::unfold((self, 0u64), move |(content, at)| async move {
            if at >= length {
                return None;
            }
            tokio::time::sleep(interval).await;
            let byte = content.byte_at(at);
            Some((Bytes::copy_from_slice(&[byte]), (content, at + 1)))
        })
        .boxed()
    }

    fn byte_at(&self, at: u64) -> u8 {
        let prefix = self.prefix.len() as u64;
        let suffix_from = prefix + self.filler();
        if at < prefix {
            self.prefix[at as usize]
        } else if at < suffix_from {
            b' '
        } else {
            self.suffix
                .get(usize::try_from(at - suffix_from).unwrap_or(usize::MAX))
                .copied()
                .unwrap_or(b' ')
        }
    }
}

/// What a request is answered with, decided without IO.
#[derive(Debug)]
struct Answer {
    /// The repository the request was about.
    repo: Option<String>,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Planned,
}

#[derive(Debug, PartialEq, Eq)]
enum Planned {
    Empty,
    Fixed(Bytes),
    /// Generated while sent; `Content-Length` when declared, chunked otherwise.
    Generated {
        content: Content,
        length: Length,
        drip: bool,
    },
}

impl Planned {
    fn len(&self) -> u64 {
        match self {
            Planned::Empty => 0,
            Planned::Fixed(b) => b.len() as u64,
            Planned::Generated { content, .. } => content.length,
        }
    }

    /// The `Content-Length` the answer declares, for `GET` and `HEAD` alike.
    fn declared(&self) -> Option<u64> {
        match self {
            Planned::Empty => None,
            Planned::Fixed(b) => Some(b.len() as u64),
            Planned::Generated {
                content,
                length: Length::Declared,
                ..
            } => Some(content.length),
            Planned::Generated {
                length: Length::Chunked,
                ..
            } => None,
        }
    }
}

/// One manifest reference of a request.
#[derive(Debug, PartialEq, Eq)]
enum Reference<'a> {
    Tag,
    Digest(&'a str),
    Signature,
}

impl<'a> Reference<'a> {
    fn parse(reference: &'a str) -> Reference<'a> {
        if reference.starts_with("sha256:") {
            Reference::Digest(reference)
        } else if reference.starts_with("sha256-") && reference.ends_with(".sig") {
            Reference::Signature
        } else {
            Reference::Tag
        }
    }
}

/// What every connection shares: the host (for absolute URLs), the small manifest, the
/// padding header, and the record of requests.
struct State {
    host: String,
    small_digest: String,
    padding: HeaderValue,
    records: Mutex<Vec<Arc<Record>>>,
}

struct Record {
    method: String,
    path: String,
    query: Option<String>,
    repo: Option<String>,
    status: u16,
    body_length: u64,
    sent: AtomicU64,
    ended: AtomicBool,
}

/// Marks its record's body ended when the body is dropped: after its last chunk, or
/// when hyper drops it because the connection ended.
struct Ended(Arc<Record>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Relaxed);
    }
}

impl Record {
    fn snapshot(&self) -> HostileRequest {
        HostileRequest {
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            repo: self.repo.clone(),
            status: self.status,
            body_length: self.body_length,
            body_sent: self.sent.load(Ordering::Relaxed),
            body_ended: self.ended.load(Ordering::Relaxed),
        }
    }
}

impl State {
    fn new(host: String) -> Result<State> {
        let padding = HeaderValue::from_maybe_shared(Bytes::from(vec![b'a'; HUGE_HEADER_BYTES]))
            .map_err(|e| Error::Config(format!("the padding header: {e}")))?;
        Ok(State {
            host,
            small_digest: format!("sha256:{:x}", Sha256::digest(SMALL_MANIFEST.as_bytes())),
            padding,
            records: Mutex::new(Vec::new()),
        })
    }

    /// Answers one request and records it; the body counts what it sends.
    fn respond(&self, request: &Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().map(str::to_owned);
        let answer = self.answer(&method, &path, query.as_deref());
        let head = method == Method::HEAD;
        let record = Arc::new(Record {
            method: method.to_string(),
            path,
            query,
            repo: answer.repo.clone(),
            status: answer.status.as_u16(),
            body_length: if head { 0 } else { answer.body.len() },
            sent: AtomicU64::new(0),
            ended: AtomicBool::new(true),
        });
        {
            let mut records = self
                .records
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if records.len() < MAX_RECORDED {
                records.push(Arc::clone(&record));
            }
        }

        let mut response = Response::new(Empty::new().boxed_unsync());
        *response.status_mut() = answer.status;
        let headers = response.headers_mut();
        for (name, value) in answer.headers {
            headers.append(name, value);
        }
        if let Some(length) = answer.body.declared() {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        }
        if head {
            return response;
        }
        *response.body_mut() = match answer.body {
            Planned::Empty => Empty::new().boxed_unsync(),
            Planned::Fixed(bytes) => {
                record.sent.store(bytes.len() as u64, Ordering::Relaxed);
                Full::new(bytes).boxed_unsync()
            }
            Planned::Generated { content, drip, .. } => {
                let chunks = if drip {
                    content.drip(DRIP_INTERVAL)
                } else {
                    content.chunks()
                };
                record.ended.store(false, Ordering::Relaxed);
                let ended = Ended(record);
                StreamBody::new(chunks.map(move |chunk| {
                    ended
                        .0
                        .sent
                        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    Ok::<_, Infallible>(Frame::data(chunk))
                }))
                .boxed_unsync()
            }
        };
        response
    }

    /// What `method path?query` is answered with.
    fn answer(&self, method: &Method, path: &str, query: Option<&str>) -> Answer {
        if path == "/v2/" || path == "/v2" {
            return self.challenge(None);
        }
        if path == "/token" {
            return self.token(query);
        }
        let Some(rest) = path.strip_prefix("/v2/") else {
            return not_found(None, "NOT_FOUND");
        };
        if let Some((repo, reference)) = rest.rsplit_once("/manifests/") {
            return match Scenario::from_repo(repo) {
                Some(scenario) => self.manifest(scenario, method, repo, reference, path, query),
                None => not_found(Some(repo), "NAME_UNKNOWN"),
            };
        }
        let repo = rest
            .rsplit_once("/blobs/")
            .or_else(|| rest.rsplit_once("/tags/"))
            .map(|(repo, _)| repo);
        match repo.and_then(|r| Scenario::from_repo(r).map(|s| (r, s))) {
            Some((repo, Scenario::HugeToken(_))) => self.challenge(Some(repo)),
            Some((repo, _)) => not_found(Some(repo), "BLOB_UNKNOWN"),
            None => not_found(repo, "NAME_UNKNOWN"),
        }
    }

    fn manifest(
        &self,
        scenario: Scenario,
        method: &Method,
        repo: &str,
        reference: &str,
        path: &str,
        query: Option<&str>,
    ) -> Answer {
        let reference = Reference::parse(reference);
        let repo_name = Some(repo);
        match scenario {
            Scenario::Unsigned => self.small(repo, &reference),
            Scenario::HugeManifest(length) => match reference {
                Reference::Tag => generated(
                    repo,
                    StatusCode::OK,
                    OCI_MANIFEST,
                    Content::new(r#"{"schemaVersion":2,"x":""#, HUGE_BYTES, r#""}"#),
                    length,
                ),
                _ => not_found(repo_name, "MANIFEST_UNKNOWN"),
            },
            Scenario::HugeSignature(length) => match reference {
                Reference::Signature => generated(
                    repo,
                    StatusCode::OK,
                    OCI_MANIFEST,
                    Content::new(
                        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","x":""#,
                        HUGE_SIGNATURE_BYTES,
                        r#""}"#,
                    ),
                    length,
                ),
                _ => self.small(repo, &reference),
            },
            Scenario::HugeToken(_) => self.challenge(Some(repo)),
            Scenario::RedirectLoop => {
                let target = match query {
                    Some(q) => format!("{path}?{q}"),
                    None => path.to_owned(),
                };
                self.redirect(repo, &target)
            }
            Scenario::RedirectChain => {
                let hop = query
                    .into_iter()
                    .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
                    .find(|(k, _)| k == "hop")
                    .and_then(|(_, v)| v.parse::<u32>().ok())
                    .unwrap_or(0);
                if hop < REDIRECT_CHAIN_HOPS {
                    self.redirect(repo, &format!("{path}?hop={}", hop + 1))
                } else {
                    self.small(repo, &reference)
                }
            }
            Scenario::HugeError(status, length) => match reference {
                // HEAD cannot carry the body: it sends the client on to GET.
                Reference::Tag if method == Method::HEAD => Answer {
                    repo: repo_name.map(str::to_owned),
                    status: StatusCode::OK,
                    headers: vec![content_type(OCI_MANIFEST)],
                    body: Planned::Empty,
                },
                Reference::Tag => {
                    let prefix = if status == 404 {
                        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":""#
                    } else {
                        r#"{"errors":[{"code":"UNKNOWN","message":""#
                    };
                    generated(
                        repo,
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        JSON,
                        Content::new(prefix, HUGE_BYTES, r#""}]}"#),
                        length,
                    )
                }
                _ => not_found(repo_name, "MANIFEST_UNKNOWN"),
            },
            Scenario::HugeHeader => {
                let mut answer = self.small(repo, &reference);
                if answer.status == StatusCode::OK {
                    answer.headers.push((
                        HeaderName::from_static(PADDING_HEADER),
                        self.padding.clone(),
                    ));
                }
                answer
            }
            Scenario::Drip => match reference {
                Reference::Tag => Answer {
                    repo: repo_name.map(str::to_owned),
                    status: StatusCode::OK,
                    headers: vec![content_type(OCI_MANIFEST)],
                    body: Planned::Generated {
                        content: Content::new(r#"{"schemaVersion":2,"x":""#, DRIP_BYTES, r#""}"#),
                        length: Length::Declared,
                        drip: true,
                    },
                },
                _ => not_found(repo_name, "MANIFEST_UNKNOWN"),
            },
        }
    }

    /// The small manifest with its digest, by tag or by that digest; no signature.
    fn small(&self, repo: &str, reference: &Reference<'_>) -> Answer {
        match reference {
            Reference::Tag => {}
            Reference::Digest(d) if *d == self.small_digest => {}
            _ => return not_found(Some(repo), "MANIFEST_UNKNOWN"),
        }
        Answer {
            repo: Some(repo.to_owned()),
            status: StatusCode::OK,
            headers: vec![
                content_type(OCI_MANIFEST),
                (
                    DOCKER_CONTENT_DIGEST,
                    HeaderValue::from_str(&self.small_digest)
                        .unwrap_or_else(|_| HeaderValue::from_static("sha256:")),
                ),
            ],
            body: Planned::Fixed(Bytes::from_static(SMALL_MANIFEST.as_bytes())),
        }
    }

    /// 401 with a bearer challenge for `repo`'s pull scope (none for the ping).
    fn challenge(&self, repo: Option<&str>) -> Answer {
        let scope = repo
            .map(|r| format!(",scope=\"repository:{r}:pull\""))
            .unwrap_or_default();
        let challenge = format!(
            "Bearer realm=\"https://{}/token\",service=\"hostile\"{scope}",
            self.host
        );
        Answer {
            repo: repo.map(str::to_owned),
            status: StatusCode::UNAUTHORIZED,
            headers: vec![
                content_type(JSON),
                (
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_str(&challenge)
                        .unwrap_or_else(|_| HeaderValue::from_static("Bearer")),
                ),
            ],
            body: Planned::Fixed(Bytes::from_static(
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            )),
        }
    }

    /// The token endpoint: a small token, or a huge one for a [`Scenario::HugeToken`]
    /// repository's scope.
    fn token(&self, query: Option<&str>) -> Answer {
        let scopes: Vec<String> = query
            .into_iter()
            .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
            .filter(|(k, _)| k == "scope")
            .flat_map(|(_, v)| {
                v.split(' ')
                    .filter_map(|s| {
                        let s = s.strip_prefix("repository:")?;
                        s.rsplit_once(':').map(|(repo, _)| repo.to_owned())
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let huge = scopes
            .iter()
            .find_map(|repo| match Scenario::from_repo(repo) {
                Some(Scenario::HugeToken(length)) => Some((repo, length)),
                _ => None,
            });
        match huge {
            Some((repo, length)) => generated(
                repo,
                StatusCode::OK,
                JSON,
                Content::new(r#"{"token":""#, HUGE_BYTES, r#""}"#),
                length,
            ),
            None => Answer {
                repo: scopes.into_iter().next(),
                status: StatusCode::OK,
                headers: vec![content_type(JSON)],
                body: Planned::Fixed(Bytes::from_static(SMALL_TOKEN.as_bytes())),
            },
        }
    }

    /// 307 to `target` (a path and query of this registry), as an absolute URL.
    fn redirect(&self, repo: &str, target: &str) -> Answer {
        let location = format!("https://{}{target}", self.host);
        Answer {
            repo: Some(repo.to_owned()),
            status: StatusCode::TEMPORARY_REDIRECT,
            headers: vec![(
                header::LOCATION,
                HeaderValue::from_str(&location).unwrap_or_else(|_| HeaderValue::from_static("/")),
            )],
            body: Planned::Empty,
        }
    }
}

fn content_type(value: &'static str) -> (HeaderName, HeaderValue) {
    (header::CONTENT_TYPE, HeaderValue::from_static(value))
}

fn generated(
    repo: &str,
    status: StatusCode,
    media_type: &'static str,
    content: Content,
    length: Length,
) -> Answer {
    Answer {
        repo: Some(repo.to_owned()),
        status,
        headers: vec![content_type(media_type)],
        body: Planned::Generated {
            content,
            length,
            drip: false,
        },
    }
}

/// 404 with a registry error of `code`.
fn not_found(repo: Option<&str>, code: &'static str) -> Answer {
    Answer {
        repo: repo.map(str::to_owned),
        status: StatusCode::NOT_FOUND,
        headers: vec![content_type(JSON)],
        body: Planned::Fixed(Bytes::from(format!(
            r#"{{"errors":[{{"code":"{code}","message":"not served by the hostile registry"}}]}}"#
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn state() -> State {
        State::new("127.0.0.1:5000".to_owned()).unwrap()
    }

    fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
        answer
            .headers
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    async fn collect(stream: BoxStream<'static, Bytes>) -> Vec<u8> {
        stream
            .fold(Vec::new(), |mut all, chunk| async move {
                all.extend_from_slice(&chunk);
                all
            })
            .await
    }

    #[test]
    fn every_scenario_is_selected_by_its_repository() {
        for scenario in Scenario::ALL {
            assert_eq!(Scenario::from_repo(&scenario.repo()), Some(scenario));
        }
        assert_eq!(Scenario::from_repo("huge-manifest"), None);
        assert_eq!(Scenario::from_repo("huge-error/200/chunked"), None);
        assert_eq!(Scenario::from_repo("team/app"), None);
    }

    #[test]
    fn a_huge_manifest_has_no_digest_and_declares_its_length_or_not() {
        let s = state();
        for (length, declared) in [
            (Length::Declared, Some(HUGE_BYTES)),
            (Length::Chunked, None),
        ] {
            let scenario = Scenario::HugeManifest(length);
            let path = format!("/v2/{}/manifests/v1", scenario.repo());
            let answer = s.answer(&Method::HEAD, &path, None);
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(header(&answer, "docker-content-digest"), None);
            assert_eq!(answer.body.declared(), declared);
            assert_eq!(answer.body.len(), HUGE_BYTES);
            assert_eq!(answer.repo, Some(scenario.repo()));
        }
    }

    #[test]
    fn the_small_manifest_is_served_with_its_own_digest() {
        let s = state();
        let repo = Scenario::HugeSignature(Length::Chunked).repo();
        let answer = s.answer(&Method::GET, &format!("/v2/{repo}/manifests/v1"), None);
        let digest = header(&answer, "docker-content-digest").unwrap().to_owned();
        let Planned::Fixed(body) = &answer.body else {
            panic!("{:?}", answer.body)
        };
        assert_eq!(digest, format!("sha256:{:x}", Sha256::digest(body)));
        serde_json::from_slice::<serde_json::Value>(body).unwrap();
        // By digest too, and its signature tag is the huge one.
        let by_digest = s.answer(
            &Method::GET,
            &format!("/v2/{repo}/manifests/{digest}"),
            None,
        );
        assert_eq!(by_digest.status, StatusCode::OK);
        let sig = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
        let sig = s.answer(&Method::GET, &format!("/v2/{repo}/manifests/{sig}"), None);
        assert_eq!(sig.body.len(), HUGE_SIGNATURE_BYTES);
        assert_eq!(header(&sig, "docker-content-digest"), None);
        // The control has no signature.
        let control = format!("/v2/unsigned/manifests/sha256-{}.sig", "0".repeat(64));
        assert_eq!(
            s.answer(&Method::GET, &control, None).status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn tokens_are_small_except_for_a_huge_token_scope() {
        let s = state();
        let ping = s.answer(&Method::GET, "/v2/", None);
        assert_eq!(ping.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            header(&ping, "www-authenticate"),
            Some(r#"Bearer realm="https://127.0.0.1:5000/token",service="hostile""#)
        );
        let repo = Scenario::HugeToken(Length::Declared).repo();
        let asked = s.answer(&Method::HEAD, &format!("/v2/{repo}/manifests/v1"), None);
        assert_eq!(asked.status, StatusCode::UNAUTHORIZED);
        assert!(
            header(&asked, "www-authenticate")
                .unwrap()
                .ends_with(r#"scope="repository:huge-token/declared:pull""#)
        );
        let query = "scope=repository%3Ahuge-token%2Fdeclared%3Apull&service=hostile";
        let token = s.answer(&Method::GET, "/token", Some(query));
        assert_eq!(token.body.len(), HUGE_BYTES);
        assert_eq!(token.repo, Some(repo));
        let small = s.answer(
            &Method::GET,
            "/token",
            Some("scope=repository:unsigned:pull&service=hostile"),
        );
        assert_eq!(
            small.body,
            Planned::Fixed(Bytes::from_static(SMALL_TOKEN.as_bytes()))
        );
        assert_eq!(small.repo.as_deref(), Some("unsigned"));
    }

    #[test]
    fn redirects_loop_or_end_after_the_chain() {
        let s = state();
        let path = "/v2/redirect-loop/manifests/v1";
        let answer = s.answer(&Method::HEAD, path, None);
        assert_eq!(answer.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(
            header(&answer, "location"),
            Some("https://127.0.0.1:5000/v2/redirect-loop/manifests/v1")
        );
        let path = "/v2/redirect-chain/manifests/v1";
        let first = s.answer(&Method::HEAD, path, None);
        assert_eq!(
            header(&first, "location"),
            Some("https://127.0.0.1:5000/v2/redirect-chain/manifests/v1?hop=1")
        );
        let last = s.answer(&Method::HEAD, path, Some("hop=49"));
        assert!(header(&last, "location").unwrap().ends_with("?hop=50"));
        let end = s.answer(&Method::HEAD, path, Some("hop=50"));
        assert_eq!(end.status, StatusCode::OK);
        assert!(header(&end, "docker-content-digest").is_some());
    }

    #[tokio::test]
    async fn generated_bodies_are_valid_json_of_their_length() {
        let content = Content::new(r#"{"schemaVersion":2,"x":""#, 3 * CHUNK as u64 + 7, r#""}"#);
        let body = collect(content.clone().chunks()).await;
        assert_eq!(body.len() as u64, content.length);
        serde_json::from_slice::<serde_json::Value>(&body).unwrap();
        let all: Vec<u8> = (0..content.length).map(|i| content.byte_at(i)).collect();
        assert_eq!(all, body);
    }

    #[tokio::test]
    async fn a_drip_sends_one_byte_at_a_time() {
        let content = Content::new(r#"{"x":""#, 12, r#""}"#);
        let chunks: Vec<Bytes> = content.drip(Duration::from_millis(1)).collect().await;
        assert_eq!(chunks.len(), 12);
        assert_eq!(chunks.concat(), br#"{"x":"    "}"#);
    }

    /// `method path` over TLS trusting the registry's CA; returns the response head and
    /// at most `at_most` bytes of what follows, then drops the connection.
    async fn ask(
        registry: &HostileRegistry,
        method: &str,
        path: &str,
        at_most: usize,
    ) -> (String, Vec<u8>) {
        let config = crate::registry::tls_client(registry.ca_pem()).unwrap();
        let tcp = tokio::net::TcpStream::connect(registry.host())
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            registry.host()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0; 16 * 1024];
        loop {
            let end = got.windows(4).position(|w| w == b"\r\n\r\n");
            if let Some(end) = end
                && got.len() - end - 4 >= at_most
            {
                break;
            }
            let n = tls.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        let rest = got[end + 4..].to_vec();
        (head, rest)
    }

    #[tokio::test]
    async fn the_server_streams_a_huge_body_and_counts_what_it_sent() {
        let registry = HostileRegistry::start().await.unwrap();
        let chunked = Scenario::HugeManifest(Length::Chunked);
        let (head, body) = ask(
            &registry,
            "GET",
            &format!("/v2/{}/manifests/v1", chunked.repo()),
            1024,
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert!(!head.contains("docker-content-digest"), "{head}");
        // The first chunk's size line, then the manifest's start.
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(r#"{"schemaVersion":2,"x":""#), "{text}");

        let declared = Scenario::HugeManifest(Length::Declared);
        let (head, body) = ask(
            &registry,
            "HEAD",
            &format!("/v2/{}/manifests/v1", declared.repo()),
            0,
        )
        .await;
        assert!(
            head.contains(&format!("content-length: {HUGE_BYTES}")),
            "{head}"
        );
        assert!(body.is_empty());

        // The client went away after a few KiB: the server stopped producing.
        let request = crate::eventually("the body to end", Duration::from_secs(30), || async {
            let requests = registry.requests_of(chunked);
            requests.first().filter(|r| r.body_ended).cloned()
        })
        .await
        .unwrap();
        assert_eq!(registry.requests_of(chunked).len(), 1);
        assert!(!request.body_complete());
        assert!(request.body_sent < 64 * MIB, "{request:?}");
        assert_eq!(registry.requests_of(declared)[0].method, "HEAD");
    }
}
