//! The registry side of verification: the few calls of the distribution API it needs,
//! over reqwest, each read bounded before it is held ([`super::bounds`]). A tag is
//! resolved to its manifest digest (one `HEAD`; a bounded, hashed, never buffered `GET`
//! when the registry sends no digest header); the cosign signature layers of a digest are
//! the manifest of the `sha256-<hex>.sig` tag, then each layer's blob. Authentication is
//! the registry's: HTTP basic, or a bearer token from the realm its `401` names (the
//! token answer bounded too). Every call has a timeout and its outcome is counted
//! (`registry_requests`, `registry_request_duration_seconds`).
//!
//! Errors are classified once, here ([`RegistryError`]): what is missing, what the
//! registry refuses, what is larger than its bound or not what the protocol says, and
//! what may heal by itself (unreachable, slow, 5xx), which is the only class retried with
//! backoff and the only one a recorded digest stands in for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, WWW_AUTHENTICATE};
use reqwest::{Method, Response, StatusCode, Url};
use sha2::{Digest as _, Sha256};

use super::bounds::{self, Bound, MAX_MESSAGE};
use super::cosign::{MAX_LAYERS, MAX_PAYLOAD_BYTES, SIGNATURE_ANNOTATION, SignatureLayer};
use crate::metrics::{ImageMetrics, RegistryOperation, RegistryOutcome};

/// Why the registry did not answer what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// No such repository, tag or manifest.
    #[error("not found in the registry: {0}")]
    NotFound(String),
    /// The registry refused the credentials (401/403).
    #[error("the registry refused access: {0}")]
    Denied(String),
    /// Unreachable, too slow, or failing (5xx): may heal by itself.
    #[error("the registry is unavailable: {0}")]
    Unavailable(String),
    /// It answered something that is not what the protocol says.
    #[error("the registry answered something invalid: {0}")]
    Invalid(String),
    /// It answered more than the controller reads of such an answer.
    #[error("{0}")]
    TooLarge(String),
}

impl RegistryError {
    /// Whether retrying later can help without anyone acting.
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Unavailable(_))
    }

    fn outcome(&self) -> RegistryOutcome {
        match self {
            RegistryError::NotFound(_) => RegistryOutcome::NotFound,
            RegistryError::Denied(_) => RegistryOutcome::Denied,
            RegistryError::Unavailable(_) => RegistryOutcome::Unavailable,
            RegistryError::Invalid(_) => RegistryOutcome::Invalid,
            RegistryError::TooLarge(_) => RegistryOutcome::TooLarge,
        }
    }

    fn too_large(bound: &Bound, url: &Url) -> Self {
        RegistryError::TooLarge(cut(format!(
            "the {} at {} is larger than its bound of {}",
            bound.what,
            url_text(url),
            bound.human()
        )))
    }
}

fn cut(s: impl std::fmt::Display) -> String {
    let s = s.to_string();
    if s.chars().count() <= MAX_MESSAGE {
        return s;
    }
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}

/// A URL for a message: without its query (a token realm's may carry anything).
fn url_text(url: &Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    cut(shown)
}

/// A reqwest error with its causes (connection refused, TLS, ...), which its own
/// message leaves out.
fn request_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Classifies an error of sending a request or reading its body.
fn classify_request(e: &reqwest::Error) -> RegistryError {
    if e.is_redirect() {
        return RegistryError::Invalid(cut(format!(
            "{} (at most {} redirects, HTTPS only)",
            request_error(e),
            bounds::MAX_REDIRECTS
        )));
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            let url = e.url().map(url_text).unwrap_or_default();
            return RegistryError::TooLarge(cut(format!(
                "the {} at {url} is larger than its bound of {}",
                bounds::RESPONSE_HEAD.what,
                bounds::RESPONSE_HEAD.human()
            )));
        }
        source = cause.source();
    }
    RegistryError::Unavailable(cut(request_error(e)))
}

/// How the registry wants to be authenticated, as its `401` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// Parses a `WWW-Authenticate` value: `Basic realm="…"` or `Bearer realm="…",
    /// service="…",scope="…"` (quoted or bare values, `\"` escapes). None for any other
    /// scheme or a bearer challenge without a realm.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = auth_params(rest);
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    }
}

/// `k="v", k2=v2` → pairs, in order.
fn auth_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return out;
        }
        if chars.next() != Some('=') {
            continue;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(escaped) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key.trim().to_owned(), value.trim().to_owned()));
    }
}

/// Credentials for one registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic(String, String),
}

impl Auth {
    /// Who asks, for the token cache: credentials never appear in a key in clear.
    fn who(&self) -> String {
        match self {
            Auth::Anonymous => "anonymous".to_owned(),
            Auth::Basic(user, password) => {
                format!("basic:{user}:{:x}", Sha256::digest(password.as_bytes()))
            }
        }
    }
}

/// Credentials per registry host, as a `kubernetes.io/dockerconfigjson` Secret holds
/// them.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    by_host: HashMap<String, (String, String)>,
}

impl Credentials {
    /// Parses a `.dockerconfigjson` (`{"auths": {"host": {"username", "password"} |
    /// {"auth": base64("user:password")}}}`). A malformed file is an error saying where.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct File {
            #[serde(default)]
            auths: HashMap<String, Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            username: Option<String>,
            password: Option<String>,
            auth: Option<String>,
        }
        use base64::Engine as _;
        let file: File = serde_json::from_slice(json)
            .map_err(|e| format!("not a .dockerconfigjson: {}", cut(e)))?;
        let mut by_host = HashMap::new();
        for (host, entry) in file.auths {
            let pair = match (entry.username, entry.password, entry.auth) {
                (Some(u), Some(p), _) => (u, p),
                (_, _, Some(auth)) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|e| format!("auths[{host:?}].auth is not base64: {e}"))?;
                    let text = String::from_utf8(decoded)
                        .map_err(|_| format!("auths[{host:?}].auth is not UTF-8"))?;
                    let (u, p) = text
                        .split_once(':')
                        .ok_or_else(|| format!("auths[{host:?}].auth is not user:password"))?;
                    (u.to_owned(), p.to_owned())
                }
                _ => return Err(format!("auths[{host:?}] has no username/password nor auth")),
            };
            by_host.insert(normalize_host(&host), pair);
        }
        Ok(Credentials { by_host })
    }

    /// The credentials for `host`, matched as the kubelet matches them: the host with
    /// its port, any scheme and path of the key ignored.
    pub fn for_host(&self, host: &str) -> Auth {
        match self.by_host.get(&normalize_host(host)) {
            Some((u, p)) => Auth::Basic(u.clone(), p.clone()),
            None => Auth::Anonymous,
        }
    }
}

/// `https://Registry.example.com:5000/v2/` → `registry.example.com:5000`; Docker Hub's
/// legacy key names Docker Hub.
fn normalize_host(key: &str) -> String {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    spelled(key.split('/').next().unwrap_or_default())
}

/// A registry host as requests and credentials name it: in lower case, Docker Hub's
/// aliases as `docker.io` (the kubelet's rule for pull secrets; loopback spellings are
/// not aliased here, unlike `common::image::normalize_host` for policies).
fn spelled(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | DOCKER_HUB_API => common::image::DOCKER_HUB.to_owned(),
        _ => host,
    }
}

/// An image reference as the registry client asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The registry as the reference names it, in lower case (`docker.io` for Docker
    /// Hub): what credentials are matched by.
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// Docker Hub's API host.
const DOCKER_HUB_API: &str = "registry-1.docker.io";

impl Target {
    /// `image` parsed by the reference grammar the kubelet uses (Docker Hub normalized as
    /// it does: `nginx` is `docker.io/library/nginx`).
    pub fn parse(image: &str) -> Result<Target, RegistryError> {
        let parsed = common::image::parse(image)
            .map_err(|e| RegistryError::Invalid(format!("{}: {e}", cut(image))))?;
        // The host as written (in lower case): requests go to it, and a certificate names
        // it; policies match the normalized spelling, not this one.
        let (registry, repository) = common::image::split_name(parsed.name, spelled);
        Ok(Target {
            registry,
            repository,
            tag: parsed.tag.map(str::to_owned),
            digest: parsed.digest.map(str::to_owned),
        })
    }

    /// The registry host credentials are matched by.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The tag (`latest` when the reference names neither a tag nor a digest).
    pub fn tag(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }

    /// `registry/repository:tag`: the key a tag's digest is cached under.
    pub fn whole(&self) -> String {
        format!("{}/{}:{}", self.registry, self.repository, self.tag())
    }

    /// The host requests go to.
    fn endpoint(&self) -> &str {
        if self.registry == common::image::DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    fn url(&self, kind: &str, reference: &str) -> Result<Url, RegistryError> {
        let text = format!(
            "https://{}/v2/{}/{kind}/{reference}",
            self.endpoint(),
            self.repository
        );
        Url::parse(&text).map_err(|e| RegistryError::Invalid(cut(format!("{text}: {e}"))))
    }
}

/// The manifest types asked for: both image and index types, OCI and Docker's.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";
/// What a cosign signature manifest is.
const SIGNATURE_MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";
const DIGEST_HEADER: &str = "docker-content-digest";

/// How a request authenticated last time at a registry, per credentials and scope.
#[derive(Clone, Debug)]
enum Grant {
    Basic,
    Bearer { token: String, until: Instant },
}

/// A token with no `expires_in` is used this long (the distribution spec's default).
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// The registry client, shared by every pass: one HTTP client (its connection pool), the
/// grants of the registries it spoke to, and the bound on requests at once.
pub struct Registry {
    http: reqwest::Client,
    timeout: Duration,
    metrics: Arc<ImageMetrics>,
    grants: std::sync::Mutex<HashMap<String, Grant>>,
    permits: tokio::sync::Semaphore,
}

impl Registry {
    /// `ca_pem`: CA certificates trusted besides the system's.
    pub fn new(
        ca_pem: Option<&[u8]>,
        timeout: Duration,
        metrics: Arc<ImageMetrics>,
    ) -> Result<Self, String> {
        let roots = match ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("the registry CA is not PEM certificates: {e}"))?,
            None => Vec::new(),
        };
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            if attempt.previous().len() > bounds::MAX_REDIRECTS {
                attempt.error(format!("more than {} redirects", bounds::MAX_REDIRECTS))
            } else if attempt.url().scheme() != "https" {
                attempt.error("a redirect away from HTTPS")
            } else {
                attempt.follow()
            }
        });
        let http = reqwest::Client::builder()
            .tls_certs_merge(roots)
            .connect_timeout(timeout)
            .read_timeout(timeout)
            .redirect(redirects)
            .pool_max_idle_per_host(4)
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(concat!("appservice-operator/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("building the registry client: {}", request_error(&e)))?;
        Ok(Registry {
            http,
            timeout,
            metrics,
            grants: std::sync::Mutex::new(HashMap::new()),
            permits: tokio::sync::Semaphore::new(bounds::MAX_CONCURRENT_REQUESTS),
        })
    }

    /// Runs one registry operation under the timeout (once its turn came), counting its
    /// outcome.
    async fn call<T>(
        &self,
        operation: RegistryOperation,
        f: impl Future<Output = Result<T, RegistryError>>,
    ) -> Result<T, RegistryError> {
        // Waiting for a turn is not the registry's time: it is not under the timeout.
        let _permit = self.permits.acquire().await;
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(RegistryError::Unavailable(format!(
                "no answer within {}s (--registry-timeout)",
                self.timeout.as_secs_f64()
            ))),
        };
        let outcome = match &result {
            Ok(_) => RegistryOutcome::Ok,
            Err(e) => e.outcome(),
        };
        self.metrics
            .registry_request(operation, outcome, started.elapsed());
        result
    }

    /// The manifest digest `image` (a tag reference) points at now: one `HEAD`, or a
    /// `GET` hashed as it arrives when the registry sends no digest header. For a
    /// multi-platform image this is the index's digest, which is what a signature signs
    /// and what the kubelet pulls by.
    pub async fn resolve(&self, image: &Target, auth: &Auth) -> Result<String, RegistryError> {
        self.call(RegistryOperation::Resolve, async {
            let url = image.url("manifests", image.tag())?;
            let head = self
                .send(image, auth, Method::HEAD, &url, MANIFEST_TYPES)
                .await?;
            let head = success(head).await?;
            if let Some(digest) = header_digest(head.headers()) {
                return Ok(digest);
            }
            let got = self
                .send(image, auth, Method::GET, &url, MANIFEST_TYPES)
                .await?;
            let got = success(got).await?;
            let announced = got
                .headers()
                .get(DIGEST_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let digest = hash_bounded(got, &bounds::MANIFEST).await?;
            if let Some(announced) = announced
                && announced != digest
            {
                return Err(RegistryError::Invalid(cut(format!(
                    "the manifest at {} is {digest}, but the registry said {announced}",
                    url_text(&url)
                ))));
            }
            Ok(digest)
        })
        .await
    }

    /// The signature layers of `digest` in `image`'s repository; none when the image
    /// has no signature tag. At most [`MAX_LAYERS`] are fetched; a signature manifest
    /// with more is answered with one more (unfetched) so the check refuses it. A layer
    /// declared larger than [`MAX_PAYLOAD_BYTES`] is not fetched, and no blob is read
    /// past that bound whatever the registry declared.
    pub async fn signatures(
        &self,
        image: &Target,
        digest: &str,
        auth: &Auth,
    ) -> Result<Vec<SignatureLayer>, RegistryError> {
        let tag = super::cosign::signature_tag(digest)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let url = image.url("manifests", &tag)?;
        let manifest = self
            .call(RegistryOperation::SignatureManifest, async {
                let response = self
                    .send(image, auth, Method::GET, &url, SIGNATURE_MANIFEST_TYPES)
                    .await?;
                match success(response).await {
                    Ok(response) => {
                        let body = read_bounded(response, &bounds::SIGNATURE_MANIFEST).await?;
                        Ok(Some(body))
                    }
                    Err(RegistryError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        let Some(body) = manifest else {
            return Ok(Vec::new());
        };
        let manifest: SignatureManifest = serde_json::from_slice(&body).map_err(|e| {
            RegistryError::Invalid(cut(format!(
                "the signature manifest at {} is not a manifest: {e}",
                url_text(&url)
            )))
        })?;
        drop(body);
        if manifest.manifests.is_some() {
            return Err(RegistryError::Invalid(format!(
                "{} is an index, not a signature manifest",
                url_text(&url)
            )));
        }
        let layers = manifest.layers;
        if layers.len() > MAX_LAYERS {
            return Ok((0..=MAX_LAYERS)
                .map(|_| SignatureLayer {
                    media_type: String::new(),
                    signature: None,
                    payload: Vec::new(),
                })
                .collect());
        }
        let mut out = Vec::with_capacity(layers.len());
        for layer in layers {
            let signature = layer.annotations.get(SIGNATURE_ANNOTATION).cloned();
            let payload = if layer.size < 0 || layer.size as u64 > MAX_PAYLOAD_BYTES as u64 {
                // Refused by the check as too large; never fetched.
                vec![0; MAX_PAYLOAD_BYTES + 1]
            } else {
                self.call(
                    RegistryOperation::SignatureBlob,
                    self.blob(image, &layer.digest, auth),
                )
                .await?
            };
            out.push(SignatureLayer {
                media_type: layer.media_type,
                signature,
                payload,
            });
        }
        Ok(out)
    }

    /// A blob, read up to [`MAX_PAYLOAD_BYTES`] + 1 bytes (more is refused by the check
    /// as too large) and checked against its digest.
    async fn blob(
        &self,
        image: &Target,
        digest: &str,
        auth: &Auth,
    ) -> Result<Vec<u8>, RegistryError> {
        // The digest comes from the registry: it is checked before it goes into a URL.
        super::cosign::signature_tag(digest).map_err(|_| {
            RegistryError::Invalid(cut(format!("a layer's digest {digest:?} is not sha256")))
        })?;
        let url = image.url("blobs", digest)?;
        let response = self.send(image, auth, Method::GET, &url, "*/*").await?;
        let mut response = success(response).await?;
        let mut data = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| classify_request(&e))? {
            data.extend_from_slice(&chunk);
            if data.len() > MAX_PAYLOAD_BYTES {
                data.truncate(MAX_PAYLOAD_BYTES + 1);
                return Ok(data);
            }
        }
        let got = format!("sha256:{:x}", Sha256::digest(&data));
        if got != digest {
            return Err(RegistryError::Invalid(format!(
                "blob {} has digest {got}",
                cut(digest)
            )));
        }
        Ok(data)
    }

    /// Sends a request with what the registry asked for last time (a token or basic
    /// credentials); on a `401`, authenticates as its challenge says and sends it once
    /// more. The answer is returned whatever its status.
    async fn send(
        &self,
        image: &Target,
        auth: &Auth,
        method: Method,
        url: &Url,
        accept: &str,
    ) -> Result<Response, RegistryError> {
        let scope = format!("repository:{}:pull", image.repository);
        let key = format!("{}\n{}\n{scope}", image.endpoint(), auth.who());
        let grant = self.grant(&key);
        let response = self
            .request(method.clone(), url, accept, auth, grant.as_ref())
            .await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse);
        drop(response);
        let grant = match challenge {
            Some(Challenge::Basic) => match auth {
                Auth::Basic(..) => Grant::Basic,
                Auth::Anonymous => {
                    return Err(RegistryError::Denied(cut(format!(
                        "{} asks for credentials and none are configured for {}",
                        url_text(url),
                        image.registry
                    ))));
                }
            },
            Some(Challenge::Bearer {
                realm,
                service,
                scope: asked,
            }) => {
                self.token(
                    &realm,
                    service.as_deref(),
                    asked.as_deref().unwrap_or(&scope),
                    auth,
                )
                .await?
            }
            None => {
                return Err(RegistryError::Denied(cut(format!(
                    "{} answered 401 without a challenge this client speaks",
                    url_text(url)
                ))));
            }
        };
        let response = self
            .request(method, url, accept, auth, Some(&grant))
            .await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            self.keep(key, grant);
        }
        Ok(response)
    }

    async fn request(
        &self,
        method: Method,
        url: &Url,
        accept: &str,
        auth: &Auth,
        grant: Option<&Grant>,
    ) -> Result<Response, RegistryError> {
        let mut request = self
            .http
            .request(method, url.clone())
            .header(ACCEPT, accept);
        match (grant, auth) {
            (Some(Grant::Bearer { token, .. }), _) => {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            (Some(Grant::Basic), Auth::Basic(user, password)) => {
                request = request.basic_auth(user, Some(password));
            }
            _ => {}
        }
        request.send().await.map_err(|e| classify_request(&e))
    }

    /// A bearer token from `realm`, with basic credentials when there are some.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        auth: &Auth,
    ) -> Result<Grant, RegistryError> {
        let mut url = Url::parse(realm).map_err(|e| {
            RegistryError::Invalid(cut(format!("the token realm {realm:?} is not a URL: {e}")))
        })?;
        if url.scheme() != "https" {
            return Err(RegistryError::Invalid(cut(format!(
                "the token realm {} is not HTTPS",
                url_text(&url)
            ))));
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", scope);
        }
        let mut request = self.http.get(url.clone());
        if let Auth::Basic(user, password) = auth {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(|e| classify_request(&e))?;
        let response = match success(response).await {
            Ok(r) => r,
            Err(RegistryError::NotFound(m)) => return Err(RegistryError::Invalid(m)),
            Err(e) => return Err(e),
        };
        let body = read_bounded(response, &bounds::TOKEN).await?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
            expires_in: Option<u64>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            RegistryError::Invalid(cut(format!(
                "the token answer of {} is not JSON: {e}",
                url_text(&url)
            )))
        })?;
        let token = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                RegistryError::Invalid(cut(format!(
                    "the token answer of {} has no token",
                    url_text(&url)
                )))
            })?;
        // A little early: a token is not used in its last seconds.
        let lifetime = answer
            .expires_in
            .map(|s| Duration::from_secs(s.saturating_sub(5)))
            .unwrap_or(DEFAULT_TOKEN_LIFETIME);
        Ok(Grant::Bearer {
            token,
            until: Instant::now() + lifetime,
        })
    }

    fn grant(&self, key: &str) -> Option<Grant> {
        let grants = self
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match grants.get(key) {
            Some(Grant::Bearer { until, .. }) if *until <= Instant::now() => None,
            other => other.cloned(),
        }
    }

    fn keep(&self, key: String, grant: Grant) {
        let mut grants = self
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if grants.len() >= bounds::MAX_TOKENS && !grants.contains_key(&key) {
            grants.clear();
        }
        grants.insert(key, grant);
    }
}

/// What is read of a signature manifest: its layers, and whether it is an index.
#[derive(serde::Deserialize)]
struct SignatureManifest {
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// A valid `Docker-Content-Digest` (sha256, lower-case hex), if the answer has one.
fn header_digest(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(DIGEST_HEADER)?.to_str().ok()?;
    super::cosign::signature_tag(value).ok()?;
    Some(value.to_owned())
}

/// The response when its status is a success; else the error its status (and the
/// distribution error codes of the first [`bounds::ERROR_BODY`] bytes of its body) says.
async fn success(response: Response) -> Result<Response, RegistryError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let url = url_text(response.url());
    let codes = error_codes(response).await;
    let text = if codes.is_empty() {
        format!("HTTP {} from {url}", status.as_u16())
    } else {
        format!("HTTP {} from {url}: {}", status.as_u16(), codes.join(", "))
    };
    let text = cut(text);
    let has = |names: &[&str]| codes.iter().any(|c| names.contains(&c.as_str()));
    Err(match status.as_u16() {
        404 => RegistryError::NotFound(text),
        401 | 403 => RegistryError::Denied(text),
        408 | 429 | 500..=599 => RegistryError::Unavailable(text),
        _ if has(&[
            "MANIFEST_UNKNOWN",
            "NAME_UNKNOWN",
            "BLOB_UNKNOWN",
            "MANIFEST_BLOB_UNKNOWN",
        ]) =>
        {
            RegistryError::NotFound(text)
        }
        _ if has(&["DENIED", "UNAUTHORIZED"]) => RegistryError::Denied(text),
        _ if has(&["TOOMANYREQUESTS"]) => RegistryError::Unavailable(text),
        _ => RegistryError::Invalid(text),
    })
}

/// The distribution error codes of an error body, from at most [`bounds::ERROR_BODY`]
/// bytes of it (the rest is never read).
async fn error_codes(mut response: Response) -> Vec<String> {
    let mut body = Vec::new();
    while body.len() < bounds::ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = bounds::ERROR_BODY - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(default)]
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
    }
    serde_json::from_slice::<Envelope>(&body)
        .map(|e| {
            e.errors
                .into_iter()
                .take(8)
                .map(|entry| cut(entry.code.to_ascii_uppercase()))
                .collect()
        })
        .unwrap_or_default()
}

/// Hands each chunk of the body to `sink`, refusing the body when it declares or grows
/// past `bound`: the one loop every bounded read goes through.
async fn each_chunk(
    mut response: Response,
    bound: &Bound,
    mut sink: impl FnMut(&[u8]),
) -> Result<(), RegistryError> {
    let url = response.url().clone();
    if response
        .content_length()
        .is_some_and(|n| n > bound.bytes as u64)
    {
        return Err(RegistryError::too_large(bound, &url));
    }
    let mut read = 0usize;
    while let Some(chunk) = response.chunk().await.map_err(|e| classify_request(&e))? {
        read += chunk.len();
        if read > bound.bytes {
            return Err(RegistryError::too_large(bound, &url));
        }
        sink(&chunk);
    }
    Ok(())
}

/// The body, refused when it declares or grows past `bound`.
async fn read_bounded(response: Response, bound: &Bound) -> Result<Vec<u8>, RegistryError> {
    let mut body = Vec::new();
    each_chunk(response, bound, |chunk| body.extend_from_slice(chunk)).await?;
    Ok(body)
}

/// `sha256:<hex>` of the body, hashed as it arrives (never held), refused when it
/// declares or grows past `bound`.
async fn hash_bounded(response: Response, bound: &Bound) -> Result<String, RegistryError> {
    let mut hasher = Sha256::new();
    each_chunk(response, bound, |chunk| hasher.update(chunk)).await?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_with_the_system_roots_only_builds() {
        // As `main` runs it by default: no --registry-ca-file.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let metrics = Arc::new(ImageMetrics::default());
        assert!(Registry::new(None, Duration::from_secs(10), metrics).is_ok());
    }

    #[test]
    fn credentials_match_by_host_in_every_spelling() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let json = format!(
            r#"{{"auths":{{"https://Registry.Example.com:5000/v2/":{{"auth":"{auth}"}},"index.docker.io":{{"username":"hub","password":"pw"}}}}}}"#
        );
        let c = Credentials::parse(json.as_bytes()).expect("valid");
        assert_eq!(
            c.for_host("registry.example.com:5000"),
            Auth::Basic("robot".into(), "s3cret".into())
        );
        assert!(matches!(c.for_host("docker.io"), Auth::Basic(u, _) if u == "hub"));
        assert_eq!(c.for_host("registry.example.com"), Auth::Anonymous);
    }

    #[test]
    fn malformed_credentials_say_where() {
        for (json, says) in [
            (&b"not json"[..], "not a .dockerconfigjson"),
            (br#"{"auths":{"r.io":{}}}"#, "no username/password"),
            (br#"{"auths":{"r.io":{"auth":"%%%"}}}"#, "not base64"),
            (
                br#"{"auths":{"r.io":{"auth":"bm9jb2xvbg=="}}}"#,
                "user:password",
            ),
        ] {
            let e = Credentials::parse(json).expect_err("malformed");
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn targets_are_what_the_kubelet_pulls() {
        let sha = format!("sha256:{}", "a".repeat(64));
        for (image, registry, endpoint, repository, tag, digest) in [
            (
                "nginx",
                "docker.io",
                DOCKER_HUB_API,
                "library/nginx",
                "latest",
                None,
            ),
            (
                "index.docker.io/bitnami/nginx:1",
                "docker.io",
                DOCKER_HUB_API,
                "bitnami/nginx",
                "1",
                None,
            ),
            (
                "Registry.Example.com:5000/team/app:v1",
                "registry.example.com:5000",
                "registry.example.com:5000",
                "team/app",
                "v1",
                None,
            ),
            (
                "[::1]:5000/app:v2",
                "[::1]:5000",
                "[::1]:5000",
                "app",
                "v2",
                None,
            ),
        ] {
            let t = Target::parse(image).expect(image);
            assert_eq!(
                (
                    t.registry(),
                    t.endpoint(),
                    t.repository(),
                    t.tag(),
                    t.digest()
                ),
                (registry, endpoint, repository, tag, digest),
                "{image}"
            );
        }
        let pinned = Target::parse(&format!("localhost:5000/app:v1@{sha}")).expect("pinned");
        assert_eq!(pinned.digest(), Some(sha.as_str()));
        let url = pinned.url("manifests", "v1").expect("url");
        assert_eq!(url.as_str(), "https://localhost:5000/v2/app/manifests/v1");
        assert!(matches!(
            Target::parse("not a reference"),
            Err(RegistryError::Invalid(_))
        ));
    }

    #[test]
    fn challenges_are_read_as_registries_write_them() {
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/nginx:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"bearer realm=https://r.io/t, scope="a \"b\"""#),
            Some(Challenge::Bearer {
                realm: "https://r.io/t".into(),
                service: None,
                scope: Some(r#"a "b""#.into()),
            })
        );
        assert_eq!(Challenge::parse(r#"Bearer service="x""#), None);
        assert_eq!(Challenge::parse("Negotiate abc"), None);
        assert_eq!(Challenge::parse(""), None);
    }

    #[test]
    fn too_large_names_the_bound_and_hides_the_query() {
        let url = Url::parse("https://r.io/token?secret=1").expect("url");
        let e = RegistryError::too_large(&bounds::TOKEN, &url);
        assert_eq!(
            e.to_string(),
            "the token response at https://r.io/token is larger than its bound of 64 KiB"
        );
        assert!(!e.is_transient());
    }

    #[test]
    fn digest_headers_are_taken_only_when_canonical() {
        let mut headers = HeaderMap::new();
        let good = format!("sha256:{}", "a".repeat(64));
        headers.insert(DIGEST_HEADER, good.parse().expect("header"));
        assert_eq!(header_digest(&headers), Some(good));
        let upper = format!("sha256:{}", "A".repeat(64));
        headers.insert(DIGEST_HEADER, upper.parse().expect("header"));
        assert_eq!(header_digest(&headers), None);
        assert_eq!(header_digest(&HeaderMap::new()), None);
    }
}
