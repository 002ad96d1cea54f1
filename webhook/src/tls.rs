//! TLS: the serving certificate, read from PEM files and swapped in place when they change,
//! or installed in memory by the runtime CA ([`crate::ca`]).
//!
//! Every handshake asks [`CertStore`] for the current key pair, so a reload affects new
//! connections only and never interrupts one in flight. A changed pair is loaded only if
//! it parses, the key matches the certificate and it has not expired; otherwise the old
//! pair stays, with an error log and a metric.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::version::{TLS12, TLS13};

use crate::metrics::{Metrics, ReloadResult};

/// Why a certificate/key pair was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: invalid PEM: {error}")]
    Pem {
        path: PathBuf,
        error: rustls::pki_types::pem::Error,
    },
    #[error("{path}: the leaf certificate cannot be parsed: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: the certificate expired at {not_after}")]
    Expired { path: PathBuf, not_after: String },
    #[error("the private key does not fit the certificate or cannot be used: {0}")]
    KeyPair(rustls::Error),
    #[error("building the TLS configuration: {0}")]
    Config(rustls::Error),
    #[error("{path}: cannot verify client certificates with these CAs: {reason}")]
    ClientVerifier { path: PathBuf, reason: String },
}

/// How long a reload waits before re-reading a pair that looked torn.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// Installs aws-lc-rs as the process-wide rustls provider. Call once at start; later
/// calls (tests) are harmless no-ops.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
}

/// A loaded key pair and the facts about it we report.
#[derive(Debug)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// `notAfter` of the leaf, as a Unix timestamp.
    pub not_after: i64,
}

/// Reads and checks a certificate chain and key.
pub fn load_pair(cert_path: &Path, key_path: &Path) -> Result<LoadedCert, TlsError> {
    let cert_pem = std::fs::read(cert_path).map_err(|error| TlsError::Read {
        path: cert_path.to_owned(),
        error,
    })?;
    let key_pem = std::fs::read(key_path).map_err(|error| TlsError::Read {
        path: key_path.to_owned(),
        error,
    })?;
    parse_pair(cert_path, &cert_pem, key_path, &key_pem)
}

fn parse_pair(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<LoadedCert, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem {
            path: cert_path.to_owned(),
            error,
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Parse {
        path: cert_path.to_owned(),
        reason: e.to_string(),
    })?;
    let not_after = parsed.validity().not_after;
    if not_after.timestamp() < jiff::Timestamp::now().as_second() {
        return Err(TlsError::Expired {
            path: cert_path.to_owned(),
            not_after: not_after.to_string(),
        });
    }
    let not_after = not_after.timestamp();
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| TlsError::Pem {
        path: key_path.to_owned(),
        error,
    })?;
    let key = CertifiedKey::from_der(chain, key, &provider()).map_err(TlsError::KeyPair)?;
    Ok(LoadedCert {
        key: Arc::new(key),
        not_after,
    })
}

/// The current serving certificate, reloadable from its files (or, without files,
/// installed by the runtime CA; empty until then).
#[derive(Debug)]
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    from_files: bool,
    current: RwLock<Option<Arc<CertifiedKey>>>,
    not_after: AtomicI64,
    // The bytes of the last pair seen (loaded or refused), so an unchanged pair is not
    // re-parsed and a refused one is reported once.
    last_seen: Mutex<(Vec<u8>, Vec<u8>)>,
    metrics: Arc<Metrics>,
}

impl CertStore {
    /// Loads the pair; the server does not start without a usable certificate.
    pub fn load(
        cert_path: PathBuf,
        key_path: PathBuf,
        metrics: Arc<Metrics>,
    ) -> Result<Self, TlsError> {
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&key_path)?;
        let loaded = parse_pair(&cert_path, &cert_pem, &key_path, &key_pem)?;
        metrics.certificate_loaded(loaded.not_after);
        Ok(CertStore {
            cert_path,
            key_path,
            from_files: true,
            current: RwLock::new(Some(loaded.key)),
            not_after: AtomicI64::new(loaded.not_after),
            last_seen: Mutex::new((cert_pem, key_pem)),
            metrics,
        })
    }

    /// A store without files and without a certificate: handshakes fail until
    /// [`CertStore::install`] puts one in.
    pub fn empty(metrics: Arc<Metrics>) -> Self {
        CertStore {
            cert_path: PathBuf::from("<memory>"),
            key_path: PathBuf::from("<memory>"),
            from_files: false,
            current: RwLock::new(None),
            not_after: AtomicI64::new(0),
            last_seen: Mutex::new((Vec::new(), Vec::new())),
            metrics,
        }
    }

    /// Serves this pair from now on (new connections), if it is a good pair.
    pub fn install(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let loaded = parse_pair(
            &self.cert_path,
            cert_pem.as_bytes(),
            &self.key_path,
            key_pem.as_bytes(),
        )?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(loaded.key);
        self.not_after.store(loaded.not_after, Ordering::Relaxed);
        self.metrics.certificate_loaded(loaded.not_after);
        Ok(())
    }

    /// The files, when the certificate comes from files.
    pub fn paths(&self) -> Option<[&Path; 2]> {
        self.from_files.then_some([&self.cert_path, &self.key_path])
    }

    /// The pair handshakes get; `None` before a runtime CA installed one.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `notAfter` of the served certificate (Unix seconds).
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Relaxed)
    }

    /// Re-reads the files. `Ok(true)`: a new pair is being served; `Ok(false)`: nothing
    /// changed; `Err`: the new files were refused and the previous pair stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        if !self.from_files {
            return Ok(false);
        }
        let result = match self.load_changed(false) {
            // Tools replace the two files one after the other, so a reload can read a new
            // certificate with the old key (or a file already deleted). Such a torn read
            // settles within moments: look again once before calling the new pair bad.
            Err(_) => {
                std::thread::sleep(SETTLE);
                self.load_changed(true)
            }
            other => other,
        };
        match &result {
            Ok(true) => self.metrics.certificate_reload(ReloadResult::Success),
            Ok(false) => {}
            Err(_) => self.metrics.certificate_reload(ReloadResult::Failure),
        }
        result
    }

    /// Reads both files and serves them if they changed (or always, with `force`) and
    /// form a good pair.
    fn load_changed(&self, force: bool) -> Result<bool, TlsError> {
        let cert_pem = read(&self.cert_path)?;
        let key_pem = read(&self.key_path)?;
        {
            let mut last = self
                .last_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !force && last.0 == cert_pem && last.1 == key_pem {
                return Ok(false);
            }
            *last = (cert_pem.clone(), key_pem.clone());
        }
        let loaded = parse_pair(&self.cert_path, &cert_pem, &self.key_path, &key_pem)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(loaded.key);
        self.not_after.store(loaded.not_after, Ordering::Relaxed);
        self.metrics.certificate_loaded(loaded.not_after);
        Ok(true)
    }

    /// Reloads and logs the outcome; for the file watcher.
    pub fn reload_and_log(&self) {
        match self.reload() {
            Ok(true) => tracing::info!(
                cert = %self.cert_path.display(),
                not_after = self.not_after(),
                "serving certificate reloaded"
            ),
            Ok(false) => {}
            Err(error) => tracing::error!(
                %error,
                cert = %self.cert_path.display(),
                "new certificate refused; still serving the previous one"
            ),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })
}

/// Hands the store's current pair to every handshake.
#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current()
    }
}

/// Server configuration: TLS 1.3 and 1.2 only, ALPN h2 and http/1.1, certificate from
/// the store.
pub fn server_config(
    store: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&TLS13, &TLS12])
        .map_err(TlsError::Config)?;
    let builder = match client_ca {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path)?),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(Resolver(store)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A verifier of client certificates signed by one of the CAs in the PEM file at `path`
/// (the API server's, `--client-ca`). A client without one completes the handshake (the
/// API server presents none when it calls `/convert`: its conversion webhooks do not use
/// the AdmissionConfiguration's kubeconfig), and the admission routes refuse it; a
/// certificate of another CA fails the handshake.
fn client_verifier(
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let pem = std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|error| TlsError::Pem {
            path: path.to_owned(),
            error,
        })?;
        roots.add(cert).map_err(|error| TlsError::Parse {
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|error| TlsError::ClientVerifier {
            path: path.to_owned(),
            reason: error.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn reload_swaps_valid_pairs_and_refuses_bad_ones() {
        install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (cert, key) = pair("a.example");
        std::fs::write(&cert_path, &cert).unwrap();
        std::fs::write(&key_path, &key).unwrap();
        let metrics = Arc::new(Metrics::new());
        let store = CertStore::load(cert_path.clone(), key_path.clone(), metrics.clone()).unwrap();
        let first = store.current().unwrap();
        assert!(!store.reload().unwrap(), "unchanged files are not reloaded");

        // A new certificate with the old key: refused, old pair kept.
        let (cert2, key2) = pair("b.example");
        std::fs::write(&cert_path, &cert2).unwrap();
        assert!(matches!(store.reload(), Err(TlsError::KeyPair(_))));
        assert!(Arc::ptr_eq(&first, &store.current().unwrap()));

        std::fs::write(&key_path, &key2).unwrap();
        assert!(store.reload().unwrap());
        assert!(!Arc::ptr_eq(&first, &store.current().unwrap()));

        // Garbage: refused, still serving b.
        std::fs::write(&cert_path, "not pem").unwrap();
        assert!(store.reload().is_err());
        assert_eq!(
            store.current().unwrap().cert[0].as_ref(),
            CertificateDer::from_pem_slice(cert2.as_bytes())
                .unwrap()
                .as_ref()
        );
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(r#"appservice_webhook_certificate_reloads_total{result="failure"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"appservice_webhook_certificate_reloads_total{result="success"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn expired_certificates_are_refused() {
        install_crypto_provider();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["old.example".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        let err = parse_pair(
            Path::new("c"),
            cert.pem().as_bytes(),
            Path::new("k"),
            key.serialize_pem().as_bytes(),
        )
        .unwrap_err();
        assert!(matches!(err, TlsError::Expired { .. }), "{err}");
    }
}
