//! Connections to a class's server: TLS as the class asks, the admin login, timeouts,
//! and a small pool per class, rebuilt when the class or its Secrets change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::DatabaseClass;
use common::TlsMode;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::SslMode;

use super::DatabaseError;

/// Limits of every connection the controller opens.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections per class.
    pub pool_size: usize,
    /// TCP connect plus login.
    pub connect_timeout: Duration,
    /// Server-side limit on one statement (`statement_timeout`); the client gives up
    /// a little later.
    pub statement_timeout: Duration,
}

/// What a pool was built from; a different value means the pool is stale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub class_uid: String,
    pub class_generation: i64,
    pub secret_version: String,
    pub ca_version: String,
}

/// Admin login and CA, read from the operator's namespace.
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// PEM, for `require` (unused) and `verify-full`.
    pub ca_pem: Option<String>,
}

/// The pools, one per class name.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<String, (Fingerprint, Pool)>>,
}

impl Pools {
    /// The pool of `class`, built anew when `fingerprint` changed.
    pub fn get_or_build(
        &self,
        class: &DatabaseClass,
        fingerprint: Fingerprint,
        credentials: impl FnOnce() -> Result<Credentials, DatabaseError>,
        limits: Limits,
    ) -> Result<Pool, DatabaseError> {
        let name = class.metadata.name.clone().unwrap_or_default();
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((fp, pool)) = pools.get(&name)
            && *fp == fingerprint
        {
            return Ok(pool.clone());
        }
        let pool = build_pool(class, &credentials()?, limits)?;
        if let Some((_, old)) = pools.insert(name, (fingerprint, pool.clone())) {
            old.close();
        }
        Ok(pool)
    }
}

fn build_pool(
    class: &DatabaseClass,
    credentials: &Credentials,
    limits: Limits,
) -> Result<Pool, DatabaseError> {
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let mut config = admin_config(class, credentials, limits);
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match class.spec.tls.mode {
        TlsMode::Disable => {
            config.ssl_mode(SslMode::Disable);
            Manager::from_config(config, tokio_postgres::NoTls, manager_config)
        }
        mode => {
            config.ssl_mode(SslMode::Require);
            let tls =
                tls_config(mode, credentials.ca_pem.as_deref()).map_err(|e| DatabaseError::Ca {
                    class: class_name.clone(),
                    reason: e.to_string(),
                })?;
            Manager::from_config(
                config,
                tokio_postgres_rustls::MakeRustlsConnect::new(tls),
                manager_config,
            )
        }
    };
    Pool::builder(manager)
        .max_size(limits.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(limits.connect_timeout + limits.statement_timeout))
        .create_timeout(Some(limits.connect_timeout))
        .recycle_timeout(Some(limits.connect_timeout))
        .build()
        .map_err(|e| DatabaseError::Internal(format!("building the pool: {e}")))
}

/// The admin session's settings. Its options are set at login (the startup packet), so
/// they hold before the first statement: `standard_conforming_strings=on` makes a
/// quoted literal mean exactly its text (a server configured with `off` would read
/// backslashes in it as escapes), and the timeouts bound every statement.
pub fn admin_config(
    class: &DatabaseClass,
    credentials: &Credentials,
    limits: Limits,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&class.spec.host)
        .port(u16::try_from(class.spec.port).unwrap_or(5432))
        .user(&credentials.username)
        .password(&credentials.password)
        .dbname("postgres")
        .application_name("appservice-controller")
        .connect_timeout(limits.connect_timeout)
        .options(format!(
            "-c standard_conforming_strings=on -c statement_timeout={} -c lock_timeout={}",
            limits.statement_timeout.as_millis(),
            limits.statement_timeout.as_millis()
        ));
    config
}

/// Why the TLS settings for a DatabaseClass cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS versions: {0}")]
    Versions(rustls::Error),
    #[error("verify-full needs a CA certificate (spec.tls.ca)")]
    NoCa,
    #[error("CA certificate is not valid PEM: {0}")]
    Pem(std::io::Error),
    #[error("CA certificate rejected: {0}")]
    Rejected(rustls::Error),
    #[error("the CA holds no PEM certificate")]
    Empty,
}

/// rustls settings for `mode`: `verify-full` checks the chain against `ca_pem` and the
/// host name; `require` encrypts without authenticating the server, as libpq does.
pub fn tls_config(mode: TlsMode, ca_pem: Option<&str>) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?;
    match mode {
        TlsMode::VerifyFull => {
            let pem = ca_pem.ok_or(TlsError::NoCa)?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
                let cert = cert.map_err(TlsError::Pem)?;
                roots.add(cert).map_err(TlsError::Rejected)?;
            }
            if roots.is_empty() {
                return Err(TlsError::Empty);
            }
            Ok(builder.with_root_certificates(roots).with_no_client_auth())
        }
        TlsMode::Require | TlsMode::Disable => Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth()),
    }
}

/// `sslmode=require`: any certificate, but the handshake signatures are still checked.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn admin_sessions_force_standard_conforming_strings() {
        let class = DatabaseClass::new(
            "c",
            serde_json::from_value(serde_json::json!({
                "host": "db", "tls": {"mode": "require"}, "adminCredentials": {"secretName": "a"}
            }))
            .unwrap(),
        );
        let credentials = Credentials {
            username: "admin".into(),
            password: "pw".into(),
            ca_pem: None,
        };
        let limits = Limits {
            pool_size: 1,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(2),
        };
        let config = admin_config(&class, &credentials, limits);
        let options = config.get_options().unwrap();
        assert!(
            options.contains("-c standard_conforming_strings=on"),
            "{options}"
        );
        assert!(options.contains("statement_timeout=2000"), "{options}");
    }
}
