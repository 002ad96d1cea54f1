//! The registry side of verification, over `oci-client`: a tag resolved to its manifest
//! digest (one `HEAD`), and the cosign signature layers of a digest (the manifest of the
//! `sha256-<hex>.sig` tag, then each layer's blob, bounded). Every call has a timeout and
//! its outcome is counted (`registry_requests`, `registry_request_duration_seconds`).
//!
//! Errors are classified once, here ([`RegistryError`]): what is missing, what the
//! registry refuses, and what may heal by itself (unreachable, slow, 5xx), which is the
//! only class retried with backoff and the only one a recorded digest stands in for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};

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
        }
    }
}

/// Messages of a registry are cut to this many characters: they end up in a condition.
const MAX_MESSAGE: usize = 300;

fn cut(s: impl std::fmt::Display) -> String {
    let s = s.to_string();
    if s.chars().count() <= MAX_MESSAGE {
        return s;
    }
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}

/// Classifies an error of `oci-client`.
pub fn classify(e: OciDistributionError) -> RegistryError {
    use OciDistributionError as E;
    match e {
        E::ImageManifestNotFoundError(m) => RegistryError::NotFound(cut(m)),
        E::AuthenticationFailure(m) => RegistryError::Denied(cut(m)),
        E::UnauthorizedError { url } => RegistryError::Denied(cut(url)),
        E::RegistryError { envelope, url } => {
            let codes: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}", e.code))
                .collect();
            let text = cut(format!("{url}: {}", codes.join(", ")));
            let unknown = codes.iter().any(|c| {
                matches!(
                    c.as_str(),
                    "ManifestUnknown"
                        | "NameUnknown"
                        | "BlobUnknown"
                        | "ManifestBlobUnknown"
                        | "NotFound"
                )
            });
            let denied = codes
                .iter()
                .any(|c| matches!(c.as_str(), "Denied" | "Unauthorized"));
            if unknown {
                RegistryError::NotFound(text)
            } else if denied {
                RegistryError::Denied(text)
            } else if codes.iter().any(|c| c == "Toomanyrequests") {
                RegistryError::Unavailable(text)
            } else {
                RegistryError::Invalid(text)
            }
        }
        E::ServerError { code, url, .. } => match code {
            404 => RegistryError::NotFound(cut(url)),
            401 | 403 => RegistryError::Denied(cut(format!("HTTP {code} from {url}"))),
            408 | 429 | 500..=599 => {
                RegistryError::Unavailable(cut(format!("HTTP {code} from {url}")))
            }
            _ => RegistryError::Invalid(cut(format!("HTTP {code} from {url}"))),
        },
        E::RequestError(e) => RegistryError::Unavailable(cut(request_error(&e))),
        E::IoError(e) => RegistryError::Unavailable(cut(e)),
        other => RegistryError::Invalid(cut(other)),
    }
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
    pub fn for_host(&self, host: &str) -> RegistryAuth {
        match self.by_host.get(&normalize_host(host)) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
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
    let host = key
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => common::image::DOCKER_HUB.to_owned(),
        _ => host,
    }
}

/// The clients of the registries, shared by every pass: one per registry host and
/// credentials. oci-client keeps the credentials (and the tokens they got) of the first
/// call to a registry for the life of a client, so a Secret created or rotated later
/// would never be used by the same client.
pub struct Registry {
    ca_pem: Option<Vec<u8>>,
    timeout: Duration,
    metrics: Arc<ImageMetrics>,
    clients: std::sync::Mutex<HashMap<String, Client>>,
}

/// Clients kept at most (registries × credential versions); the map starts again past it.
const MAX_CLIENTS: usize = 64;

impl Registry {
    /// `ca_pem`: CA certificates trusted besides the system's.
    pub fn new(ca_pem: Option<&[u8]>, timeout: Duration, metrics: Arc<ImageMetrics>) -> Self {
        Registry {
            ca_pem: ca_pem.map(<[u8]>::to_vec),
            timeout,
            metrics,
            clients: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The client for `image`'s registry with `auth`.
    fn client(&self, image: &Reference, auth: &RegistryAuth) -> Client {
        let who = match auth {
            RegistryAuth::Anonymous => "anonymous".to_owned(),
            RegistryAuth::Basic(user, password) => {
                format!("basic:{user}:{:x}", Sha256::digest(password.as_bytes()))
            }
            RegistryAuth::Bearer(token) => format!("bearer:{:x}", Sha256::digest(token.as_bytes())),
        };
        let key = format!("{}\n{who}", image.resolve_registry());
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(&key) {
            return client.clone();
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let config = ClientConfig {
            protocol: ClientProtocol::Https,
            extra_root_certificates: self
                .ca_pem
                .as_ref()
                .map(|pem| {
                    vec![Certificate {
                        encoding: CertificateEncoding::Pem,
                        data: pem.clone(),
                    }]
                })
                .unwrap_or_default(),
            connect_timeout: Some(self.timeout),
            read_timeout: Some(self.timeout),
            ..ClientConfig::default()
        };
        let client = Client::new(config);
        clients.insert(key, client.clone());
        client
    }

    /// Runs one registry operation under the timeout, counting its outcome.
    async fn call<T>(
        &self,
        operation: RegistryOperation,
        f: impl Future<Output = Result<T, RegistryError>>,
    ) -> Result<T, RegistryError> {
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

    /// The manifest digest `image` (a tag reference) points at now: one `HEAD`. For a
    /// multi-platform image this is the index's digest, which is what a signature signs
    /// and what the kubelet pulls by.
    pub async fn resolve(
        &self,
        image: &Reference,
        auth: &RegistryAuth,
    ) -> Result<String, RegistryError> {
        self.call(RegistryOperation::Resolve, async {
            let digest = self
                .client(image, auth)
                .fetch_manifest_digest(image, auth)
                .await
                .map_err(classify)?;
            super::cosign::signature_tag(&digest)
                .map_err(|e| RegistryError::Invalid(e.to_string()))?;
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
        image: &Reference,
        digest: &str,
        auth: &RegistryAuth,
    ) -> Result<Vec<SignatureLayer>, RegistryError> {
        let tag = super::cosign::signature_tag(digest)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let sig = Reference::with_tag(
            image.registry().to_owned(),
            image.repository().to_owned(),
            tag,
        );
        let manifest = self
            .call(RegistryOperation::SignatureManifest, async {
                match self.client(&sig, auth).pull_manifest(&sig, auth).await {
                    Ok((manifest, _)) => Ok(Some(manifest)),
                    Err(e) => match classify(e) {
                        RegistryError::NotFound(_) => Ok(None),
                        other => Err(other),
                    },
                }
            })
            .await?;
        let layers = match manifest {
            None => return Ok(Vec::new()),
            Some(OciManifest::Image(m)) => m.layers,
            Some(OciManifest::ImageIndex(_)) => {
                return Err(RegistryError::Invalid(format!(
                    "{} is an index, not a signature manifest",
                    sig.whole()
                )));
            }
        };
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
            let signature = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                .cloned();
            let payload = if layer.size < 0 || layer.size as usize > MAX_PAYLOAD_BYTES {
                // Refused by the check as too large; never fetched.
                vec![0; MAX_PAYLOAD_BYTES + 1]
            } else {
                self.call(
                    RegistryOperation::SignatureBlob,
                    self.blob(&sig, &layer, auth),
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

    /// A blob, read up to [`MAX_PAYLOAD_BYTES`] + 1 bytes and checked against its digest.
    async fn blob(
        &self,
        image: &Reference,
        layer: &oci_client::manifest::OciDescriptor,
        auth: &RegistryAuth,
    ) -> Result<Vec<u8>, RegistryError> {
        let mut stream = self
            .client(image, auth)
            .pull_blob_stream(image, layer)
            .await
            .map_err(classify)?
            .stream;
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| RegistryError::Unavailable(cut(e)))?;
            data.extend_from_slice(&chunk);
            if data.len() > MAX_PAYLOAD_BYTES {
                data.truncate(MAX_PAYLOAD_BYTES + 1);
                return Ok(data);
            }
        }
        let got = format!("sha256:{:x}", Sha256::digest(&data));
        if got != layer.digest {
            return Err(RegistryError::Invalid(format!(
                "blob {} has digest {got}",
                cut(&layer.digest)
            )));
        }
        Ok(data)
    }
}

/// `image` parsed for the registry client (Docker Hub normalized as the kubelet does).
pub fn reference(image: &str) -> Result<Reference, RegistryError> {
    image
        .parse::<Reference>()
        .map_err(|e| RegistryError::Invalid(format!("{}: {e}", cut(image))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_match_by_host_in_every_spelling() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let json = format!(
            r#"{{"auths":{{"https://Registry.Example.com:5000/v2/":{{"auth":"{auth}"}},"index.docker.io":{{"username":"hub","password":"pw"}}}}}}"#
        );
        let c = Credentials::parse(json.as_bytes()).expect("valid");
        assert!(matches!(
            c.for_host("registry.example.com:5000"),
            RegistryAuth::Basic(u, p) if u == "robot" && p == "s3cret"
        ));
        assert!(matches!(c.for_host("docker.io"), RegistryAuth::Basic(u, _) if u == "hub"));
        assert!(matches!(
            c.for_host("registry.example.com"),
            RegistryAuth::Anonymous
        ));
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
    fn errors_are_classified_by_what_can_help() {
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "https://r.io/v2/a/manifests/1".into(),
            message: String::new(),
        };
        assert!(matches!(classify(server(404)), RegistryError::NotFound(_)));
        assert!(matches!(classify(server(403)), RegistryError::Denied(_)));
        assert!(classify(server(503)).is_transient());
        assert!(classify(server(429)).is_transient());
        assert!(matches!(classify(server(418)), RegistryError::Invalid(_)));
        assert!(matches!(
            classify(OciDistributionError::UnauthorizedError { url: "u".into() }),
            RegistryError::Denied(_)
        ));
        assert!(
            classify(OciDistributionError::IoError(std::io::Error::other(
                "reset"
            )))
            .is_transient()
        );
        let long = classify(OciDistributionError::ImageManifestNotFoundError(
            "x".repeat(5000),
        ));
        assert!(long.to_string().len() < 2 * MAX_MESSAGE);
    }
}
