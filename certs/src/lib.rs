//! Certificates for development and tests: a certificate authority, serving certificates
//! with DNS/IP subject alternative names, client certificates whose CN and O become a
//! Kubernetes user and its groups, and bare signing key pairs (service-account tokens).
//!
//! Everything is generated in memory with `rcgen` (ECDSA P-256) and handed out as PEM.
//! Keys are never encrypted and the CA key lives as long as the [`Ca`] value. Besides
//! development and tests, the webhook uses [`Ca::with_period`] and
//! [`Ca::serving_cert_for`] for its runtime CA (its key stays in memory and in the CA
//! Secret the webhook owns).

#![forbid(unsafe_code)]

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Errors of certificate generation and storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A subject alternative name is neither an IP address nor a valid DNS name.
    #[error("invalid subject alternative name {name:?}: {reason}")]
    InvalidSan { name: String, reason: String },
    /// A serving certificate needs at least one subject alternative name.
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoSans,
    /// More organisations than [`MAX_ORGANISATIONS`] were asked for.
    #[error("at most {MAX_ORGANISATIONS} organisations fit a certificate here, got {count}")]
    TooManyOrganisations { count: usize },
    /// A client certificate needs a common name (the Kubernetes user name).
    #[error("a client certificate needs a non-empty common name")]
    EmptyCommonName,
    /// The validity period does not fit the calendar.
    #[error("invalid validity of {days} days")]
    InvalidValidity { days: u32 },
    /// An exact validity period that ends before it starts or does not fit the calendar.
    #[error("invalid validity period from {not_before} to {not_after} (Unix seconds)")]
    InvalidPeriod { not_before: i64, not_after: i64 },
    /// A CA's private key does not belong to its certificate.
    #[error("the CA key does not belong to the CA certificate")]
    KeyMismatch,
    /// Key generation, signing or parsing failed in rcgen.
    #[error("{what}: {error}")]
    Rcgen {
        what: &'static str,
        error: rcgen::Error,
    },
    /// Reading or writing a PEM file failed.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn rcgen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |error| Error::Rcgen { what, error }
}

/// How long generated certificates are valid, in days, unless told otherwise.
pub const DEFAULT_VALIDITY_DAYS: u32 = 365;

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone)]
pub struct CertKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_public_half(f, "CertKey", ("cert_pem", &self.cert_pem), "key_pem")
    }
}

impl CertKey {
    /// Writes the certificate and key to `cert_path` and `key_path` (the key with mode
    /// 0600 on Unix).
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> Result<()> {
        write_pair(cert_path, &self.cert_pem, key_path, &self.key_pem)
    }
}

/// Debug output of a key pair that shows the public half and never the private key.
fn debug_public_half(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    (public_field, public): (&str, &str),
    private_field: &str,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field(public_field, &public)
        .field(private_field, &"[elided]")
        .finish()
}

/// A signing key pair without a certificate, e.g. for service-account tokens.
#[derive(Clone)]
pub struct SigningKeyPair {
    /// The private key, PKCS#8 PEM.
    pub private_pem: String,
    /// The public key, SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
    pub public_pem: String,
}

impl std::fmt::Debug for SigningKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_public_half(
            f,
            "SigningKeyPair",
            ("public_pem", &self.public_pem),
            "private_pem",
        )
    }
}

impl SigningKeyPair {
    /// Generates an ECDSA P-256 key pair.
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate().map_err(rcgen_err("generating a key pair"))?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

/// A certificate authority that signs serving and client certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: Vec<u8>,
    key_pem: String,
    validity_days: u32,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .field("validity_days", &self.validity_days)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Creates a self-signed CA named `common_name`, valid for [`DEFAULT_VALIDITY_DAYS`].
    pub fn new(common_name: &str) -> Result<Self> {
        Self::with_validity(common_name, DEFAULT_VALIDITY_DAYS)
    }

    /// Creates a self-signed CA valid for `days` days; certificates it issues get the
    /// same validity.
    pub fn with_validity(common_name: &str, days: u32) -> Result<Self> {
        if common_name.is_empty() {
            return Err(Error::EmptyCommonName);
        }
        let mut params = ca_params(common_name)?;
        set_validity(&mut params, days)?;
        let key = KeyPair::generate().map_err(rcgen_err("generating the CA key"))?;
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("self-signing the CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem,
            validity_days: days,
        })
    }

    /// Creates a self-signed CA valid exactly for `validity`; certificates it issues
    /// without a period of their own get [`DEFAULT_VALIDITY_DAYS`].
    pub fn with_period(common_name: &str, validity: Validity) -> Result<Self> {
        if common_name.is_empty() {
            return Err(Error::EmptyCommonName);
        }
        let mut params = ca_params(common_name)?;
        validity.apply(&mut params)?;
        let key = KeyPair::generate().map_err(rcgen_err("generating the CA key"))?;
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("self-signing the CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem,
            validity_days: DEFAULT_VALIDITY_DAYS,
        })
    }

    /// Loads a CA from its PEM certificate and PEM private key, e.g. written earlier by
    /// [`Ca::write`], so that new certificates chain to an already trusted CA.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let key = KeyPair::from_pem(key_pem).map_err(rcgen_err("parsing the CA key"))?;
        let cert_der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| Error::Rcgen {
                what: "parsing the CA certificate",
                error: rcgen::Error::CouldNotParseCertificate,
            })?;
        // A key of another CA would sign certificates nobody trusts.
        let (_, parsed) =
            x509_parser::parse_x509_certificate(&cert_der).map_err(|_| Error::Rcgen {
                what: "parsing the CA certificate",
                error: rcgen::Error::CouldNotParseCertificate,
            })?;
        if parsed.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return Err(Error::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(rcgen_err("parsing the CA certificate"))?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_owned(),
            cert_der: cert_der.to_vec(),
            key_pem: key_pem.to_owned(),
            validity_days: DEFAULT_VALIDITY_DAYS,
        })
    }

    /// Reads a CA from `cert_path` and `key_path`.
    pub fn read(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let cert = read_file(cert_path)?;
        let key = read_file(key_path)?;
        Self::from_pem(&cert, &key)
    }

    /// The CA certificate, PEM: the `caBundle` of a webhook, a client's trust root.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER (e.g. for `kube::Config::root_cert`).
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA private key, PKCS#8 PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Writes the CA certificate and key.
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> Result<()> {
        write_pair(cert_path, &self.cert_pem, key_path, &self.key_pem)
    }

    /// Issues a TLS serving certificate for `sans`: entries that parse as IP addresses
    /// become IP SANs, all others DNS SANs. The first entry is also the common name.
    pub fn serving_cert<S: AsRef<str>>(&self, sans: &[S]) -> Result<CertKey> {
        let mut params = serving_params(sans)?;
        set_validity(&mut params, self.validity_days)?;
        self.sign(params)
    }

    /// [`Ca::serving_cert`] valid exactly for `validity`.
    pub fn serving_cert_for<S: AsRef<str>>(
        &self,
        sans: &[S],
        validity: Validity,
    ) -> Result<CertKey> {
        let mut params = serving_params(sans)?;
        validity.apply(&mut params)?;
        self.sign(params)
    }

    /// Issues a TLS client certificate. Kubernetes reads the common name as the user name
    /// and each organisation as a group (e.g. `system:masters`); at most
    /// [`MAX_ORGANISATIONS`] of them (for more groups, impersonate).
    pub fn client_cert<S: AsRef<str>>(
        &self,
        common_name: &str,
        organisations: &[S],
    ) -> Result<CertKey> {
        if common_name.is_empty() {
            return Err(Error::EmptyCommonName);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, organisations)?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, mut params: CertificateParams) -> Result<CertKey> {
        set_validity(&mut params, self.validity_days)?;
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> Result<CertKey> {
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(rcgen_err("generating a key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err("signing a certificate"))?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// An exact validity period, in Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// First second the certificate is valid.
    pub not_before: i64,
    /// Last second the certificate is valid.
    pub not_after: i64,
}

impl Validity {
    fn apply(self, params: &mut CertificateParams) -> Result<()> {
        let invalid = || Error::InvalidPeriod {
            not_before: self.not_before,
            not_after: self.not_after,
        };
        if self.not_after <= self.not_before {
            return Err(invalid());
        }
        params.not_before =
            time::OffsetDateTime::from_unix_timestamp(self.not_before).map_err(|_| invalid())?;
        params.not_after =
            time::OffsetDateTime::from_unix_timestamp(self.not_after).map_err(|_| invalid())?;
        Ok(())
    }
}

fn ca_params(common_name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn::<&str>(common_name, &[])?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn serving_params<S: AsRef<str>>(sans: &[S]) -> Result<CertificateParams> {
    let first = sans.first().ok_or(Error::NoSans)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn::<&str>(first.as_ref(), &[])?;
    params.subject_alt_names = sans
        .iter()
        .map(|s| san(s.as_ref()))
        .collect::<Result<_>>()?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// The most organisations a certificate can carry: rcgen keeps one value per attribute
/// type, so the second `O` is written under the same OID as a "custom" type.
pub const MAX_ORGANISATIONS: usize = 2;

/// The OID of `organizationName` (2.5.4.10).
const OID_ORGANIZATION: [u64; 4] = [2, 5, 4, 10];

fn dn<S: AsRef<str>>(common_name: &str, organisations: &[S]) -> Result<DistinguishedName> {
    if organisations.len() > MAX_ORGANISATIONS {
        return Err(Error::TooManyOrganisations {
            count: organisations.len(),
        });
    }
    let mut dn = DistinguishedName::new();
    for (i, org) in organisations.iter().enumerate() {
        let ty = if i == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(OID_ORGANIZATION.to_vec())
        };
        dn.push(ty, org.as_ref());
    }
    dn.push(DnType::CommonName, common_name);
    Ok(dn)
}

fn san(name: &str) -> Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let invalid = |reason: &str| Error::InvalidSan {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(invalid("not an IP address nor a DNS name"));
    }
    let dns = name
        .try_into()
        .map_err(|e: rcgen::Error| invalid(&e.to_string()))?;
    Ok(SanType::DnsName(dns))
}

/// Valid from yesterday (tolerates clock skew between processes) for `days` days.
fn set_validity(params: &mut CertificateParams, days: u32) -> Result<()> {
    let invalid = || Error::InvalidValidity { days };
    if days == 0 {
        return Err(invalid());
    }
    let today = jiff::Zoned::now()
        .with_time_zone(jiff::tz::TimeZone::UTC)
        .date();
    let ymd = |date: jiff::civil::Date| -> Result<_> {
        let month = u8::try_from(date.month()).map_err(|_| invalid())?;
        let day = u8::try_from(date.day()).map_err(|_| invalid())?;
        Ok(rcgen::date_time_ymd(i32::from(date.year()), month, day))
    };
    let start = today.yesterday().map_err(|_| invalid())?;
    let end = today
        .checked_add(jiff::Span::new().days(i64::from(days)))
        .map_err(|_| invalid())?;
    params.not_before = ymd(start)?;
    params.not_after = ymd(end)?;
    Ok(())
}

fn read_file(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|error| Error::Io {
        path: path.to_owned(),
        error,
    })
}

/// Writes a certificate and its private key (the key with mode 0600 on Unix).
fn write_pair(cert_path: &Path, cert_pem: &str, key_path: &Path, key_pem: &str) -> Result<()> {
    write_file(cert_path, cert_pem, false)?;
    write_file(key_path, key_pem, true)
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<()> {
    let io = |error| Error::Io {
        path: path.to_owned(),
        error,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(io)?;
    std::io::Write::write_all(&mut file, contents.as_bytes()).map_err(io)
}

/// The files [`write_dev_certs`] produces, relative to its directory.
pub mod files {
    /// CA certificate.
    pub const CA_CERT: &str = "ca.crt";
    /// CA private key.
    pub const CA_KEY: &str = "ca.key";
    /// Serving certificate.
    pub const TLS_CERT: &str = "tls.crt";
    /// Serving private key.
    pub const TLS_KEY: &str = "tls.key";
    /// Client certificate.
    pub const CLIENT_CERT: &str = "client.crt";
    /// Client private key.
    pub const CLIENT_KEY: &str = "client.key";
}

/// What [`write_dev_certs`] writes.
#[derive(Debug, Clone)]
pub struct DevCerts<'a> {
    /// SANs of the serving certificate.
    pub sans: Vec<String>,
    /// Common name of the client certificate, if one is wanted.
    pub client_cn: Option<String>,
    /// Organisations (groups) of the client certificate.
    pub client_orgs: Vec<String>,
    /// Reuse this CA (certificate, key) instead of creating one.
    pub existing_ca: Option<(&'a Path, &'a Path)>,
    /// Validity of new certificates in days.
    pub validity_days: u32,
}

/// Writes a CA (unless an existing one is given), a serving certificate and optionally a
/// client certificate into `dir` under the names in [`files`]; returns the paths written.
pub fn write_dev_certs(dir: &Path, spec: &DevCerts<'_>) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).map_err(|error| Error::Io {
        path: dir.to_owned(),
        error,
    })?;
    let mut written = Vec::new();
    // Writes a certificate and its key into `dir` under these names.
    let write = |(cert_name, key_name): (&str, &str), cert_pem: &str, key_pem: &str| {
        let (cert, key) = (dir.join(cert_name), dir.join(key_name));
        write_pair(&cert, cert_pem, &key, key_pem).map(|()| [cert, key])
    };
    let ca = match spec.existing_ca {
        Some((cert, key)) => {
            let mut ca = Ca::read(cert, key)?;
            ca.validity_days = spec.validity_days;
            let cert = dir.join(files::CA_CERT);
            write_file(&cert, ca.cert_pem(), false)?;
            written.push(cert);
            ca
        }
        None => {
            let ca = Ca::with_validity("appservice-operator development CA", spec.validity_days)?;
            written.extend(write(
                (files::CA_CERT, files::CA_KEY),
                ca.cert_pem(),
                ca.key_pem(),
            )?);
            ca
        }
    };
    let serving = ca.serving_cert(&spec.sans)?;
    written.extend(write(
        (files::TLS_CERT, files::TLS_KEY),
        &serving.cert_pem,
        &serving.key_pem,
    )?);
    if let Some(cn) = &spec.client_cn {
        let client = ca.client_cert(cn, &spec.client_orgs)?;
        written.extend(write(
            (files::CLIENT_CERT, files::CLIENT_KEY),
            &client.cert_pem,
            &client.key_pem,
        )?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use rustls::pki_types::{PrivateKeyDer, ServerName, UnixTime};
    use std::sync::Arc;
    use x509_parser::prelude::*;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    fn roots(ca: &Ca) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(ca.cert_pem())).unwrap();
        Arc::new(roots)
    }

    /// Whether `ca` vouches for `leaf` as the server `name`.
    fn verify_server(ca: &Ca, leaf: &CertificateDer<'_>, name: &str) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca), provider())
            .build()
            .unwrap()
            .verify_server_cert(
                leaf,
                &[],
                &ServerName::try_from(name).unwrap(),
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
    }

    #[test]
    fn serving_cert_has_sans_and_verifies_against_the_ca() {
        let ca = Ca::new("test CA").unwrap();
        let leaf = ca
            .serving_cert(&["localhost", "127.0.0.1", "webhook.ns.svc"])
            .unwrap();
        let leaf_der = der(&leaf.cert_pem);
        let (_, x509) = parse_x509_certificate(&leaf_der).unwrap();
        let sans = x509.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(ip) => format!("ip:{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            ["localhost", "ip:[127, 0, 0, 1]", "webhook.ns.svc"],
            "SANs in order"
        );
        assert!(!x509.is_ca());

        for name in ["localhost", "127.0.0.1", "webhook.ns.svc"] {
            verify_server(&ca, &leaf_der, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(
            verify_server(&ca, &leaf_der, "example.com").is_err(),
            "a name outside the SANs must not verify"
        );

        // The key matches the certificate: rustls accepts the pair.
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf_der.clone()], key)
            .unwrap();
    }

    #[test]
    fn a_certificate_from_another_ca_does_not_verify() {
        let ca = Ca::new("one").unwrap();
        let other = Ca::new("other").unwrap();
        let leaf = other.serving_cert(&["localhost"]).unwrap();
        assert!(verify_server(&ca, &der(&leaf.cert_pem), "localhost").is_err());
    }

    #[test]
    fn client_cert_carries_user_and_groups_and_verifies() {
        let ca = Ca::new("test CA").unwrap();
        let client = ca
            .client_cert("alice", &["system:masters", "developers"])
            .unwrap();
        let client_der = der(&client.cert_pem);
        let (_, x509) = parse_x509_certificate(&client_der).unwrap();
        let cn: Vec<_> = x509
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let orgs: Vec<_> = x509
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(cn, ["alice"]);
        assert_eq!(orgs, ["system:masters", "developers"]);
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);

        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&ca), provider())
                .build()
                .unwrap();
        verifier
            .verify_client_cert(&client_der, &[], UnixTime::now())
            .unwrap();
    }

    #[test]
    fn ca_is_a_ca_and_round_trips_through_pem() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("round trip").unwrap();
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        ca.write(&cert, &key).unwrap();
        let ca_der = der(ca.cert_pem());
        let (_, x509) = parse_x509_certificate(&ca_der).unwrap();
        assert!(x509.is_ca());
        assert!(x509.validity().is_valid());

        let loaded = Ca::read(&cert, &key).unwrap();
        let leaf = loaded.serving_cert(&["localhost"]).unwrap();
        verify_server(&ca, &der(&leaf.cert_pem), "localhost").unwrap();
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let ca = Ca::new("ca").unwrap();
        assert!(matches!(ca.serving_cert::<&str>(&[]), Err(Error::NoSans)));
        assert!(matches!(
            ca.serving_cert(&["has space"]),
            Err(Error::InvalidSan { .. })
        ));
        assert!(matches!(
            ca.client_cert::<&str>("", &[]),
            Err(Error::EmptyCommonName)
        ));
        assert!(matches!(
            ca.client_cert("bob", &["a", "b", "c"]),
            Err(Error::TooManyOrganisations { count: 3 })
        ));
        assert!(matches!(
            Ca::with_validity("ca", 0),
            Err(Error::InvalidValidity { .. })
        ));
        assert!(matches!(
            Ca::from_pem("not pem", "not a key"),
            Err(Error::Rcgen { .. })
        ));
        let other = Ca::new("other").unwrap();
        assert!(matches!(
            Ca::from_pem(ca.cert_pem(), other.key_pem()),
            Err(Error::KeyMismatch)
        ));
    }

    #[test]
    fn exact_periods_are_kept_to_the_second() {
        let ca = Ca::with_period(
            "period CA",
            crate::Validity {
                not_before: 1_700_000_000,
                not_after: 1_700_003_600,
            },
        )
        .unwrap();
        let ca_der = der(ca.cert_pem());
        let (_, x509) = parse_x509_certificate(&ca_der).unwrap();
        assert!(x509.is_ca());
        assert_eq!(x509.validity().not_before.timestamp(), 1_700_000_000);
        assert_eq!(x509.validity().not_after.timestamp(), 1_700_003_600);
        let now = jiff::Timestamp::now().as_second();
        let ca = Ca::with_period(
            "now",
            crate::Validity {
                not_before: now - 60,
                not_after: now + 3600,
            },
        )
        .unwrap();
        let leaf = ca
            .serving_cert_for(
                &["webhook.ns.svc"],
                crate::Validity {
                    not_before: now - 60,
                    not_after: now + 600,
                },
            )
            .unwrap();
        let leaf_der = der(&leaf.cert_pem);
        let (_, parsed) = parse_x509_certificate(&leaf_der).unwrap();
        assert_eq!(parsed.validity().not_after.timestamp(), now + 600);
        verify_server(&ca, &leaf_der, "webhook.ns.svc").unwrap();
        assert!(matches!(
            Ca::with_period(
                "x",
                crate::Validity {
                    not_before: 10,
                    not_after: 10
                }
            ),
            Err(Error::InvalidPeriod { .. })
        ));
    }

    #[test]
    fn signing_key_pair_is_pem() {
        let pair = SigningKeyPair::generate().unwrap();
        assert!(pair.private_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(pair.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(!format!("{pair:?}").contains("BEGIN PRIVATE KEY"));
    }

    #[test]
    fn dev_certs_are_written_and_a_second_run_reuses_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DevCerts {
            sans: vec!["localhost".into(), "127.0.0.1".into()],
            client_cn: Some("dev".into()),
            client_orgs: vec!["system:masters".into()],
            existing_ca: None,
            validity_days: 30,
        };
        let written = write_dev_certs(dir.path(), &spec).unwrap();
        assert_eq!(written.len(), 6);
        for f in &written {
            assert!(fs::read_to_string(f).unwrap().starts_with("-----BEGIN "));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(files::TLS_KEY))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "private keys are not group/world readable");
        }

        let ca_cert = dir.path().join(files::CA_CERT);
        let ca_key = dir.path().join(files::CA_KEY);
        let before = fs::read_to_string(&ca_cert).unwrap();
        let out = tempfile::tempdir().unwrap();
        let again = DevCerts {
            existing_ca: Some((&ca_cert, &ca_key)),
            client_cn: None,
            ..spec
        };
        let written = write_dev_certs(out.path(), &again).unwrap();
        assert_eq!(written.len(), 3);
        assert_eq!(
            fs::read_to_string(out.path().join(files::CA_CERT)).unwrap(),
            before
        );
    }
}
