//! A real OCI registry for image tests: the CNCF distribution registry built from its Go
//! module, behind a TCP proxy the harness owns, with `crane` to push images and `cosign`
//! to sign them and to give the reference verdict on a signature.
//!
//! The registry serves TLS (a fresh CA per [`Registry`], certificate for `127.0.0.1` and
//! `localhost`), stores on the filesystem of a temporary directory, logs every request,
//! and optionally requires basic auth (htpasswd, bcrypt). Clients use [`Registry::host`],
//! the proxy's address: [`Registry::stop`] makes it an outage (the port refuses, open
//! connections drop), [`Registry::start_again`] ends it on the same port with the same
//! images, and [`Registry::set_delay`] makes it slow. [`Registry::requests`] reads what the
//! registry served from its access log.
//!
//! cosign never leaves the machine: it signs with a local key, uploads nothing to a
//! transparency log, gets an empty `TUF_ROOT` and `HOME`, and a proxy that does not
//! exist for every host but the loopback registry, so an attempt to reach Sigstore's
//! public services fails at once instead of going out. (cosign v2.6.5 does try: sign and
//! verify fetch `https://tuf-repo-cdn.sigstore.dev/<n>.root.json`, fail at the dead
//! proxy on 127.0.0.1:9, warn "Could not fetch trusted_root.json" and go on with the
//! key; strace sees no connection to any address but 127.0.0.1.)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use rand::distr::{Alphanumeric, SampleString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result, io};
use crate::poll::{Failure, eventually};
use crate::process::{Component, Spec, free_port, tail};

const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The bound on one crane or cosign run (a push of a tiny image takes well under a second).
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound on one request of [`Registry::get`].
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const DIR_PREFIX: &str = "appservice-registry-";
/// Where cosign's and crane's traffic to anything but the loopback registry goes: a port
/// nothing listens on (Go never proxies loopback addresses).
const NOWHERE_PROXY: &str = "http://127.0.0.1:9";
/// The manifest types [`Registry::get`] accepts: without them the registry answers 404
/// for an OCI manifest, as it does for a client that could not read it.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";
/// The password of every [`KeyPair`]'s private key: throw-away keys of one test run.
const KEY_PASSWORD: &str = "appservice-tests";

/// How to start a [`Registry`].
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// `Some((user, password))`: every request needs basic auth as that user.
    pub auth: Option<(String, String)>,
    /// Serve from the harness's own background runtime instead of the caller's, so
    /// that the registry outlives the test that started it (the shared real node's: a
    /// test's runtime ends with the test).
    pub detached: bool,
}

/// One request the registry served, from its access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRequest {
    pub method: String,
    /// The request's path, without the query.
    pub path: String,
    pub status: u16,
}

impl RegistryRequest {
    /// Whether this is a request of a manifest (`/v2/<repo>/manifests/<ref>`), by tag or
    /// digest; a cosign signature is the manifest tagged `sha256-<hex>.sig`.
    pub fn is_manifest(&self) -> bool {
        self.path.contains("/manifests/")
    }

    /// Whether this is a request of a cosign signature manifest.
    pub fn is_signature(&self) -> bool {
        self.is_manifest() && self.path.ends_with(".sig")
    }
}

/// A running registry and the proxy in front of it; both are stopped when dropped.
pub struct Registry {
    // Dropped first: the proxy, then the registry, then its files.
    proxy: Proxy,
    component: Component,
    root: PathBuf,
    _dir: tempfile::TempDir,
    ca_pem: String,
    auth: Option<(String, String)>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host())
            .field("root", &self.root)
            .field("auth", &self.auth.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts the registry and its proxy; returns once `GET /v2/` answers through the
    /// proxy over TLS.
    pub async fn start(opts: RegistryOptions) -> Result<Registry> {
        let registry_bin = tool("registry")?;
        crate::process::prune_old_dirs(DIR_PREFIX);
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io("creating the registry's temporary directory"))?;
        let root = dir.path().to_path_buf();
        for sub in ["storage", "logs", "docker", "home", "tuf"] {
            let path = root.join(sub);
            std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
        }

        let ca = certs::Ca::new("appservice-tests registry CA")?;
        let serving = ca.serving_cert(&["127.0.0.1", "localhost", "::1"])?;
        let (cert, key) = (root.join("tls.crt"), root.join("tls.key"));
        serving.write(&cert, &key)?;
        let ca_file = root.join("ca.crt");
        std::fs::write(&ca_file, ca.cert_pem()).map_err(io("writing the registry CA"))?;

        let htpasswd = match &opts.auth {
            Some((user, password)) => {
                let hash = bcrypt::hash(password, bcrypt::DEFAULT_COST)
                    .map_err(|e| Error::Registry(format!("hashing the password: {e}")))?;
                let path = root.join("htpasswd");
                std::fs::write(&path, format!("{user}:{hash}\n"))
                    .map_err(io("writing the htpasswd file"))?;
                Some(path)
            }
            None => None,
        };

        // The registry's own port is private; another process may take it between
        // choosing and binding, so a start that fails on that is retried on another.
        let log_dir = root.join("logs");
        let mut last = None;
        for _ in 0..3 {
            let port = free_port()?;
            let config = root.join("config.yml");
            let secret = Alphanumeric.sample_string(&mut rand::rng(), 32);
            std::fs::write(
                &config,
                config_yaml(&root, port, &secret, &cert, &key, htpasswd.as_deref()),
            )
            .map_err(io("writing the registry configuration"))?;
            let mut component = Component::spawn(Spec {
                name: "registry",
                // The registry exports OpenTelemetry traces to localhost:4318 by default.
                program: Path::new("env"),
                args: vec![
                    "OTEL_TRACES_EXPORTER=none".to_owned(),
                    "OTEL_SDK_DISABLED=true".to_owned(),
                    registry_bin.display().to_string(),
                    "serve".to_owned(),
                    config.display().to_string(),
                ],
                log_dir: &log_dir,
                remove_after_exit: None,
            })?;
            let proxy = Proxy::start(port, opts.detached)?;
            let host = format!("127.0.0.1:{}", proxy.port);
            match wait_ready(&mut component, &host, ca.cert_pem(), &log_dir).await {
                Ok(()) => {
                    return Ok(Registry {
                        proxy,
                        component,
                        root,
                        _dir: dir,
                        ca_pem: ca.cert_pem().to_owned(),
                        auth: opts.auth,
                    });
                }
                Err(e) if crate::process::lost_the_port(&tail(component.log(), 20)) => {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Registry("the registry did not start".to_owned())))
    }

    /// The address clients use: `127.0.0.1:<port>` of the proxy (the certificate is valid
    /// for it), the same across [`Registry::stop`] and [`Registry::start_again`].
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.proxy.port)
    }

    /// An outage: the proxy closes its port (connections are refused) and drops the
    /// connections it holds. Returns once both are done.
    pub async fn stop(&mut self) {
        self.proxy.stop().await;
    }

    /// Ends an outage: the proxy accepts again on the same port, in front of the same
    /// registry and storage. A no-op while it runs.
    pub fn start_again(&mut self) -> Result<()> {
        self.proxy.start_again()
    }

    /// A slow registry: from now on each new connection's bytes are forwarded only after
    /// `delay` (`Duration::ZERO` ends it). Connections already open are not affected.
    pub fn set_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.proxy.delay_ms.store(millis, Ordering::Relaxed);
    }

    /// PEM of the CA that signed the registry's certificate: what a client must trust.
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// The same CA as a file.
    pub fn ca_file(&self) -> PathBuf {
        self.root.join("ca.crt")
    }

    /// The registry's log (its own messages and the access log).
    pub fn log_file(&self) -> &Path {
        self.component.log()
    }

    /// Every request the registry has served so far, in order, from its access log. A
    /// request appears once its response was written.
    pub fn requests(&self) -> Result<Vec<RegistryRequest>> {
        let log = std::fs::read(self.log_file())
            .map_err(io(format!("reading {}", self.log_file().display())))?;
        Ok(String::from_utf8_lossy(&log)
            .lines()
            .filter_map(parse_access_log_line)
            .collect())
    }

    /// `GET path` through the proxy over TLS (trusting [`Registry::ca_pem`]), with basic
    /// auth when `auth` is set; returns the response's status. An error means no response
    /// (refused, dropped, or no answer within 30 s).
    pub async fn get(&self, path: &str, auth: Option<(&str, &str)>) -> Result<u16> {
        https_get(&self.host(), &self.ca_pem, path, auth)
            .await
            .map_err(|e| Error::Registry(format!("GET {path} of {}: {e}", self.host())))
    }

    /// Pushes a one-layer image (OCI media types) as `<host>/<repo>:<tag>` with crane and
    /// returns its digest (`sha256:...`). The layer holds one file whose content is `distinct`: the same
    /// `distinct` gives the same digest, another gives another.
    pub async fn push_image(&self, repo: &str, tag: &str, distinct: &str) -> Result<String> {
        let layer = self.root.join(format!("layer-{}.tar", unique()));
        std::fs::write(
            &layer,
            tar_with_one_file("distinct.txt", distinct.as_bytes()),
        )
        .map_err(io(format!("writing {}", layer.display())))?;
        let reference = format!("{}/{repo}:{tag}", self.host());
        let pushed = self.append(&layer, &reference).await;
        let _ = std::fs::remove_file(&layer);
        pushed?;
        self.digest(&reference).await
    }

    /// Pushes `reference`: an image with no base and the one layer in the tar file
    /// `layer` (`crane append --oci-empty-base`).
    pub async fn append(&self, layer: &Path, reference: &str) -> Result<()> {
        let layer = layer.display().to_string();
        self.crane(&[
            "append",
            "--oci-empty-base",
            "--new_layer",
            &layer,
            "--new_tag",
            reference,
        ])
        .await
        .map(drop)
    }

    /// The manifest digest (`sha256:…`) of `reference` in this registry.
    pub async fn digest(&self, reference: &str) -> Result<String> {
        let digest = self.crane(&["digest", reference]).await?;
        let digest = digest.trim().to_owned();
        if digest.starts_with("sha256:") {
            Ok(digest)
        } else {
            Err(Error::Registry(format!(
                "crane digest {reference} printed {digest:?}, not a sha256 digest"
            )))
        }
    }

    /// Signs `reference` (`<host>/<repo>@sha256:...`) with `key`'s private key: cosign
    /// pushes the signature to this registry and nothing anywhere else.
    pub async fn sign(&self, key: &KeyPair, reference: &str) -> Result<()> {
        let key_path = key.private_key_path().display().to_string();
        let args = [
            "sign",
            "--key",
            &key_path,
            "--tlog-upload=false",
            "--yes",
            reference,
        ];
        let out = self.cosign(&args).await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(tool_failed("cosign", &args, &out))
        }
    }

    /// cosign's verdict on `reference` with `key`'s public key and no transparency log:
    /// `true` when it verifies, `false` when cosign finds no signature or none that this
    /// key made. Any other failure of cosign is an error.
    pub async fn cosign_verify(&self, key: &KeyPair, reference: &str) -> Result<bool> {
        let key_path = key.public_key_path().display().to_string();
        let args = [
            "verify",
            "--key",
            &key_path,
            "--insecure-ignore-tlog=true",
            reference,
        ];
        let out = self.cosign(&args).await?;
        if out.status.success() {
            return Ok(true);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("no matching signatures") || stderr.contains("no signatures found") {
            Ok(false)
        } else {
            Err(tool_failed("cosign", &args, &out))
        }
    }

    /// Runs crane against this registry and returns its stdout; a failure is an error.
    pub async fn crane(&self, args: &[&str]) -> Result<String> {
        self.login().await?;
        let out = self.run_tool("crane", args).await?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(tool_failed("crane", args, &out))
        }
    }

    async fn cosign(&self, args: &[&str]) -> Result<std::process::Output> {
        self.login().await?;
        self.run_tool("cosign", args).await
    }

    /// Stores the credentials in this registry's `DOCKER_CONFIG` (crane and cosign read
    /// it), once.
    async fn login(&self) -> Result<()> {
        let Some((user, password)) = &self.auth else {
            return Ok(());
        };
        if self.root.join("docker/config.json").is_file() {
            return Ok(());
        }
        let host = self.host();
        let args = ["auth", "login", &host, "-u", user, "-p", password];
        let out = self.run_tool("crane", &args).await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(tool_failed(
                "crane",
                &["auth", "login", &host, "-u", user],
                &out,
            ))
        }
    }

    /// Runs `name` (crane or cosign) with the environment of this registry's clients: the
    /// CA, the credentials, empty home and TUF directories, no way out but to loopback.
    async fn run_tool(&self, name: &str, args: &[&str]) -> Result<std::process::Output> {
        let program = tool(name)?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.root.join("home"))
            .env("DOCKER_CONFIG", self.root.join("docker"))
            .env("SSL_CERT_FILE", self.ca_file())
            .env("HTTPS_PROXY", NOWHERE_PROXY)
            .env("HTTP_PROXY", NOWHERE_PROXY)
            .env("NO_PROXY", "")
            .env("TUF_ROOT", self.root.join("tuf"))
            .env("SIGSTORE_NO_CACHE", "true")
            .env("COSIGN_PASSWORD", KEY_PASSWORD)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let what = format!("{name} {}", args.first().copied().unwrap_or_default());
        match tokio::time::timeout(TOOL_TIMEOUT, cmd.output()).await {
            Ok(out) => out.map_err(io(format!("running {}", program.display()))),
            Err(_) => Err(Error::Registry(format!(
                "{what} did not finish within {TOOL_TIMEOUT:?}"
            ))),
        }
    }
}

/// A cosign key pair made by `cosign generate-key-pair` for one test run.
pub struct KeyPair {
    dir: tempfile::TempDir,
    public_pem: String,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("public_pem", &self.public_pem)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// Generates a new key pair (ECDSA P-256, cosign's default) in a temporary directory.
    pub async fn generate() -> Result<KeyPair> {
        let program = tool("cosign")?;
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io("creating a directory for a cosign key pair"))?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.arg("generate-key-pair")
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("HTTPS_PROXY", NOWHERE_PROXY)
            .env("HTTP_PROXY", NOWHERE_PROXY)
            .env("COSIGN_PASSWORD", KEY_PASSWORD)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(TOOL_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                Error::Registry(format!(
                    "cosign generate-key-pair did not finish within {TOOL_TIMEOUT:?}"
                ))
            })?
            .map_err(io(format!("running {}", program.display())))?;
        if !out.status.success() {
            return Err(tool_failed("cosign", &["generate-key-pair"], &out));
        }
        let public = dir.path().join("cosign.pub");
        let public_pem = std::fs::read_to_string(&public)
            .map_err(io(format!("reading {}", public.display())))?;
        Ok(KeyPair { dir, public_pem })
    }

    /// The public key, PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// The public key's file.
    pub fn public_key_path(&self) -> PathBuf {
        self.dir.path().join("cosign.pub")
    }

    /// The encrypted private key's file (cosign's format).
    pub fn private_key_path(&self) -> PathBuf {
        self.dir.path().join("cosign.key")
    }
}

/// Waits until `GET /v2/` answers on `host` over TLS (any status: 401 is an answer), or
/// the registry exits.
async fn wait_ready(
    component: &mut Component,
    host: &str,
    ca_pem: &str,
    log_dir: &Path,
) -> Result<()> {
    let outcome = eventually(
        "the registry to answer GET /v2/ over TLS",
        START_TIMEOUT,
        || {
            let exited = component.exited();
            async move {
                if let Some(status) = exited {
                    return Ok::<_, Failure>(Some(Err(status)));
                }
                https_get(host, ca_pem, "/v2/", None).await?;
                Ok(Some(Ok(())))
            }
        },
    )
    .await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => Err(component.startup_error(format!("exited with {status}"), log_dir)),
        Err(e) => Err(component.startup_error(e.to_string(), log_dir)),
    }
}

/// The path of crane, cosign or the registry, built on first use.
fn tool(name: &str) -> Result<PathBuf> {
    crate::assets::tool(name).map_err(|e| {
        Error::Assets(format!(
            "{e}. {name} is built from its Go module by tests/envtest/assets/build.sh \
             (`cargo xtask assets`; needs Go 1.26+)"
        ))
    })
}

fn tool_failed(name: &str, args: &[&str], out: &std::process::Output) -> Error {
    Error::Registry(format!(
        "`{name} {}` failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    ))
}

/// A name unique in this process, for temporary files.
fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The registry's configuration: filesystem storage under `root`, deletes allowed, TLS,
/// the access log on, no upload purging (a test's data lives seconds), htpasswd auth
/// when `htpasswd` is set.
fn config_yaml(
    root: &Path,
    port: u16,
    secret: &str,
    cert: &Path,
    key: &Path,
    htpasswd: Option<&Path>,
) -> String {
    let auth = htpasswd
        .map(|path| {
            format!(
                "auth:\n  htpasswd:\n    realm: appservice-tests\n    path: {}\n",
                path.display()
            )
        })
        .unwrap_or_default();
    format!(
        "version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: {secret}
  tls:
    certificate: {cert}
    key: {key}
{auth}",
        storage = root.join("storage").display(),
        cert = cert.display(),
        key = key.display(),
    )
}

/// One line of the access log (the Apache combined format), e.g.
/// `127.0.0.1 - - [03/Dec/2026:12:00:00 +0000] "HEAD /v2/a/manifests/v1 HTTP/1.1" 200 0 "" "crane"`;
/// `None` for any other line.
pub fn parse_access_log_line(line: &str) -> Option<RegistryRequest> {
    let (_, rest) = line.split_once("] \"")?;
    let (request, rest) = rest.split_once('"')?;
    let mut parts = request.split(' ');
    let method = parts.next()?;
    let uri = parts.next()?;
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = rest.trim_start().split(' ').next()?.parse().ok()?;
    let path = uri.split_once('?').map_or(uri, |(path, _)| path);
    Some(RegistryRequest {
        method: method.to_owned(),
        path: path.to_owned(),
        status,
    })
}

/// A tar archive with one regular file `name` holding `content`, with fixed mode, owner
/// and time, so that the same content always makes the same layer digest.
pub fn tar_with_one_file(name: &str, content: &[u8]) -> Vec<u8> {
    tar_with_file(name, content, 0o644)
}

/// A tar archive with one regular file `name` holding `content` with permissions `mode`
/// (0o755 for a program), owner root and time zero.
pub fn tar_with_file(name: &str, content: &[u8], mode: u32) -> Vec<u8> {
    tar_of(&[TarEntry::File {
        name,
        content,
        mode,
    }])
}

/// One entry of [`tar_of`].
#[derive(Debug, Clone, Copy)]
pub enum TarEntry<'a> {
    /// A regular file.
    File {
        name: &'a str,
        content: &'a [u8],
        mode: u32,
    },
    /// A directory (`name` without the trailing slash).
    Dir { name: &'a str, mode: u32 },
}

/// A tar archive (ustar) of `entries` in order, owner root and time zero, so that the
/// same entries always make the same layer digest. Names are at most 100 bytes.
pub fn tar_of(entries: &[TarEntry<'_>]) -> Vec<u8> {
    let mut tar = Vec::new();
    for entry in entries {
        let (name, content, mode, kind) = match *entry {
            TarEntry::File {
                name,
                content,
                mode,
            } => (name.to_owned(), content, mode, b'0'),
            TarEntry::Dir { name, mode } => (format!("{name}/"), &[][..], mode, b'5'),
        };
        let mut header = [0u8; 512];
        let put = |header: &mut [u8; 512], at: usize, field: &[u8]| {
            header[at..at + field.len()].copy_from_slice(field);
        };
        let name = name.as_bytes();
        put(&mut header, 0, &name[..name.len().min(100)]);
        put(
            &mut header,
            100,
            format!("{:07o}\0", mode & 0o7777).as_bytes(),
        );
        put(&mut header, 108, b"0000000\0");
        put(&mut header, 116, b"0000000\0");
        put(
            &mut header,
            124,
            format!("{:011o}\0", content.len()).as_bytes(),
        );
        put(&mut header, 136, b"00000000000\0");
        put(&mut header, 148, b"        ");
        header[156] = kind;
        put(&mut header, 257, b"ustar\0");
        put(&mut header, 263, b"00");
        let checksum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        put(&mut header, 148, format!("{checksum:06o}\0 ").as_bytes());
        tar.extend_from_slice(&header);
        tar.extend_from_slice(content);
        tar.resize(tar.len().next_multiple_of(512), 0);
    }
    tar.resize(tar.len() + 1024, 0);
    tar
}

/// The rustls client configuration trusting only `ca_pem`.
pub(crate) fn tls_client(ca_pem: &str) -> std::result::Result<rustls::ClientConfig, Failure> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// `GET path` on `host` (`ip:port`) over TLS, verifying the certificate for that IP;
/// returns the status. One connection per request, bounded by [`REQUEST_TIMEOUT`].
async fn https_get(
    host: &str,
    ca_pem: &str,
    path: &str,
    auth: Option<(&str, &str)>,
) -> std::result::Result<u16, Failure> {
    let request = async {
        let config = tls_client(ca_pem)?;
        let (ip, _) = host.rsplit_once(':').ok_or("host has no port")?;
        let server_name = rustls::pki_types::ServerName::try_from(ip.to_owned())?;
        let tcp = TcpStream::connect(host).await?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await?;
        let authorization = auth
            .map(|(user, password)| {
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                format!("Authorization: Basic {token}\r\n")
            })
            .unwrap_or_default();
        tls.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {MANIFEST_TYPES}\r\n\
                 {authorization}Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        // The status line is all we need; read at most a small response's worth of it.
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
            let n = tls.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let status = head
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| format!("no HTTP status line in {head:?}"))?;
        Ok::<_, Failure>(status)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| format!("no response within {REQUEST_TIMEOUT:?}"))?
}

/// The TCP proxy in front of the registry: accepts on its own port while running and
/// copies bytes both ways, after the configured delay.
struct Proxy {
    port: u16,
    upstream: u16,
    delay_ms: Arc<AtomicU64>,
    running: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    /// The background runtime it serves from ([`RegistryOptions::detached`]), else the
    /// caller's.
    runtime: Option<tokio::runtime::Handle>,
}

/// The harness's background runtime: one thread, for the process's life.
fn background() -> Result<tokio::runtime::Handle> {
    static RUNTIME: std::sync::OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("harness-background")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map(|runtime| runtime.handle().clone())
        .map_err(|e| Error::Registry(format!("starting the background runtime: {e}")))
}

impl Proxy {
    /// Binds a free port and starts accepting.
    fn start(upstream: u16, detached: bool) -> Result<Proxy> {
        let runtime = if detached { Some(background()?) } else { None };
        // A listener is registered with the runtime that binds it.
        let listener = match &runtime {
            Some(runtime) => {
                let _entered = runtime.enter();
                bind(0)?
            }
            None => bind(0)?,
        };
        let port = listener
            .local_addr()
            .map_err(io("reading the proxy's address"))?
            .port();
        let mut proxy = Proxy {
            port,
            upstream,
            delay_ms: Arc::new(AtomicU64::new(0)),
            running: None,
            runtime,
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&mut self, listener: TcpListener) {
        let (stop, stopped) = watch::channel(false);
        let accept = accept_loop(listener, self.upstream, Arc::clone(&self.delay_ms), stopped);
        let accept = match &self.runtime {
            Some(runtime) => runtime.spawn(accept),
            None => tokio::spawn(accept),
        };
        self.running = Some((stop, accept));
    }

    async fn stop(&mut self) {
        if let Some((stop, accept)) = self.running.take() {
            let _ = stop.send(true);
            let _ = accept.await;
        }
    }

    fn start_again(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let listener = match &self.runtime {
            Some(runtime) => {
                let _entered = runtime.enter();
                bind(self.port)?
            }
            None => bind(self.port)?,
        };
        self.serve(listener);
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some((stop, accept)) = self.running.take() {
            let _ = stop.send(true);
            accept.abort();
        }
    }
}

/// A listener on `127.0.0.1:port` (0: any free port), with `SO_REUSEADDR` so that the
/// port can be bound again after an outage while closed connections linger in TIME_WAIT.
fn bind(port: u16) -> Result<TcpListener> {
    let what = format!("binding the registry proxy to 127.0.0.1:{port}");
    let socket = TcpSocket::new_v4().map_err(io(what.clone()))?;
    socket.set_reuseaddr(true).map_err(io(what.clone()))?;
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .map_err(io(what.clone()))?;
    socket.listen(128).map_err(io(what))
}

/// Accepts until told to stop; then closes the listener and drops every connection
/// before returning, so that [`Proxy::stop`] returns into a real outage.
async fn accept_loop(
    listener: TcpListener,
    upstream: u16,
    delay_ms: Arc<AtomicU64>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let delay = Duration::from_millis(delay_ms.load(Ordering::Relaxed));
                connections.spawn(forward(client, upstream, delay));
            }
            // Reap finished connections so that the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

/// One connection: after `delay`, connects to the registry and copies both ways until
/// either side closes.
async fn forward(mut client: TcpStream, upstream: u16, delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn access_log_lines_are_parsed_and_other_lines_skipped() {
        let line = r#"127.0.0.1 - - [03/Dec/2026:12:00:00 +0000] "HEAD /v2/team/app/manifests/v1 HTTP/1.1" 200 0 "" "crane/v0.22.1""#;
        assert_eq!(
            parse_access_log_line(line),
            Some(RegistryRequest {
                method: "HEAD".to_owned(),
                path: "/v2/team/app/manifests/v1".to_owned(),
                status: 200,
            })
        );
        let with_user = r#"127.0.0.1 - alice [03/Dec/2026:12:00:00 +0000] "GET /v2/_catalog?n=10 HTTP/1.1" 401 87 "" "Go-http-client/1.1""#;
        let parsed = parse_access_log_line(with_user).unwrap();
        assert_eq!((parsed.path.as_str(), parsed.status), ("/v2/_catalog", 401));
        let app_log = r#"time="2026-12-03T12:00:00Z" level=info msg="response completed" http.request.method=GET"#;
        assert_eq!(parse_access_log_line(app_log), None);
    }

    #[test]
    fn signature_manifests_are_recognised() {
        let request = |path: &str| RegistryRequest {
            method: "GET".to_owned(),
            path: path.to_owned(),
            status: 200,
        };
        assert!(request("/v2/a/manifests/sha256-abc.sig").is_signature());
        assert!(!request("/v2/a/manifests/v1").is_signature());
        assert!(request("/v2/a/manifests/v1").is_manifest());
        assert!(!request("/v2/a/blobs/sha256:abc").is_manifest());
    }

    #[test]
    fn the_layer_tar_is_deterministic_and_well_formed() {
        let tar = tar_with_one_file("distinct.txt", b"one");
        assert_eq!(tar, tar_with_one_file("distinct.txt", b"one"));
        assert_ne!(tar, tar_with_one_file("distinct.txt", b"two"));
        assert_eq!(tar.len(), 512 * 4);
        assert_eq!(&tar[512..515], b"one");
        // The checksum counts the checksum field as spaces.
        let mut header = tar[..512].to_vec();
        let stored = std::str::from_utf8(&header[148..154]).unwrap().to_owned();
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        assert_eq!(u32::from_str_radix(&stored, 8).unwrap(), sum);
    }
}
