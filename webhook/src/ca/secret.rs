//! The CA Secret's layout: what [`super::plan::CaState`] looks like in `data`, and back.
//!
//! | key | holds |
//! | --- | --- |
//! | `ca.crt`, `ca.key` | the active CA (signs serving certificates) |
//! | `next.crt`, `next.key`, `next-since` | the next CA and when it joined the bundles |
//! | `retired.crt`, `retired-since` | previous CAs still trusted, and when the newest left |
//!
//! The annotation [`ROTATE_ANNOTATION`] (an RFC 3339 time, set by an admin) asks for a
//! rotation of a CA made before it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::plan::{CaCert, CaKeyPair, CaState, Next};

pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const NEXT_CRT: &str = "next.crt";
pub const NEXT_KEY: &str = "next.key";
pub const NEXT_SINCE: &str = "next-since";
pub const RETIRED_CRT: &str = "retired.crt";
pub const RETIRED_SINCE: &str = "retired-since";
pub use common::names::ROTATE_ANNOTATION;

/// The CA certificates of a PEM bundle (a caBundle, `retired.crt`). Entries that are not
/// certificates are skipped; a certificate that does not parse is an error.
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CaCert>, String> {
    let mut out = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem) {
        let der = der.map_err(|e| format!("invalid PEM: {e}"))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("a certificate does not parse: {e}"))?;
        let validity = parsed.validity();
        let pem = pem_of(&der);
        out.push(CaCert {
            pem,
            der: der.to_vec(),
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        });
    }
    Ok(out)
}

fn pem_of(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// A CA from its PEM certificate and key; the key must belong to the certificate.
pub fn key_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<CaKeyPair, String> {
    let mut certs = parse_certs(cert_pem)?;
    if certs.len() != 1 {
        return Err(format!("expected one certificate, found {}", certs.len()));
    }
    let cert = certs.remove(0);
    let cert_text = std::str::from_utf8(cert_pem).map_err(|_| "not UTF-8".to_owned())?;
    let key_text = std::str::from_utf8(key_pem).map_err(|_| "the key is not UTF-8".to_owned())?;
    certs::Ca::from_pem(cert_text, key_text).map_err(|e| e.to_string())?;
    Ok(CaKeyPair {
        cert,
        key_pem: key_text.to_owned(),
    })
}

fn timestamp(value: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(value)
        .map_err(|_| "not UTF-8".to_owned())?
        .trim()
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|e| e.to_string())
}

/// The state a Secret's `data` holds, and what was wrong with it (a part that does not
/// parse is left out, so the rules replace it).
pub fn decode(data: &BTreeMap<String, ByteString>) -> (CaState, Vec<String>) {
    let get = |key: &str| {
        data.get(key)
            .map(|v| v.0.as_slice())
            .filter(|v| !v.is_empty())
    };
    let mut problems = Vec::new();
    let mut state = CaState::default();
    if let (Some(cert), Some(key)) = (get(CA_CRT), get(CA_KEY)) {
        match key_pair(cert, key) {
            Ok(pair) => state.active = Some(pair),
            Err(e) => problems.push(format!("{CA_CRT}/{CA_KEY}: {e}")),
        }
    }
    if let (Some(cert), Some(key)) = (get(NEXT_CRT), get(NEXT_KEY)) {
        let since = get(NEXT_SINCE).map(timestamp);
        match (key_pair(cert, key), since) {
            (Ok(pair), Some(Ok(since))) => state.next = Some(Next { pair, since }),
            (Err(e), _) | (_, Some(Err(e))) => problems.push(format!("{NEXT_CRT}: {e}")),
            (Ok(_), None) => problems.push(format!("{NEXT_CRT} without {NEXT_SINCE}")),
        }
    }
    if let Some(retired) = get(RETIRED_CRT) {
        match parse_certs(retired) {
            Ok(certs) => state.retired = certs,
            Err(e) => problems.push(format!("{RETIRED_CRT}: {e}")),
        }
        match get(RETIRED_SINCE).map(timestamp) {
            Some(Ok(since)) => state.retired_since = Some(since),
            // Unknown age: keep them for a full retention from now on.
            Some(Err(e)) => problems.push(format!("{RETIRED_SINCE}: {e}")),
            None => {}
        }
    }
    (state, problems)
}

fn rfc3339(t: i64) -> String {
    jiff::Timestamp::from_second(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The `data` of a Secret holding `state`.
pub fn encode(state: &CaState) -> BTreeMap<String, ByteString> {
    let mut data = BTreeMap::new();
    let mut put = |key: &str, value: String| {
        data.insert(key.to_owned(), ByteString(value.into_bytes()));
    };
    if let Some(active) = &state.active {
        put(CA_CRT, active.cert.pem.clone());
        put(CA_KEY, active.key_pem.clone());
    }
    if let Some(next) = &state.next {
        put(NEXT_CRT, next.pair.cert.pem.clone());
        put(NEXT_KEY, next.pair.key_pem.clone());
        put(NEXT_SINCE, rfc3339(next.since));
    }
    if !state.retired.is_empty() {
        put(
            RETIRED_CRT,
            state.retired.iter().map(|c| c.pem.clone()).collect(),
        );
        if let Some(since) = state.retired_since {
            put(RETIRED_SINCE, rfc3339(since));
        }
    }
    data
}

/// The admin's rotation request, if the annotation holds a time.
pub fn rotate_before(annotations: Option<&BTreeMap<String, String>>) -> Option<i64> {
    let value = annotations?.get(ROTATE_ANNOTATION)?;
    timestamp(value.as_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(now: i64) -> CaKeyPair {
        let ca = certs::Ca::with_period(
            "test",
            certs::Validity {
                not_before: now - 10,
                not_after: now + 3600,
            },
        )
        .unwrap();
        key_pair(ca.cert_pem().as_bytes(), ca.key_pem().as_bytes()).unwrap()
    }

    #[test]
    fn a_state_round_trips_through_the_secret() {
        let now = jiff::Timestamp::now().as_second();
        let retired = pair(now).cert;
        let state = CaState {
            active: Some(pair(now)),
            next: Some(Next {
                pair: pair(now),
                since: now,
            }),
            retired: vec![retired.clone(), pair(now).cert],
            retired_since: Some(now - 5),
        };
        let (back, problems) = decode(&encode(&state));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(back, state);
        assert!(decode(&BTreeMap::new()).0 == CaState::default());
        // Our PEM of a parsed certificate is the certificate.
        assert_eq!(
            parse_certs(retired.pem.as_bytes()).unwrap()[0].der,
            retired.der
        );
    }

    #[test]
    fn broken_parts_are_reported_and_left_out() {
        let now = jiff::Timestamp::now().as_second();
        let (a, b) = (pair(now), pair(now));
        let mut data = encode(&CaState {
            active: Some(a),
            ..CaState::default()
        });
        // A key of another CA.
        data.insert(CA_KEY.into(), ByteString(b.key_pem.into_bytes()));
        data.insert(
            RETIRED_CRT.into(),
            ByteString(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()),
        );
        let (state, problems) = decode(&data);
        assert_eq!(state, CaState::default());
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn rotation_requests_are_rfc3339() {
        let annotations = BTreeMap::from([(
            ROTATE_ANNOTATION.to_owned(),
            "2030-01-02T03:04:05Z".to_owned(),
        )]);
        assert_eq!(rotate_before(Some(&annotations)), Some(1_893_553_445));
        let bad = BTreeMap::from([(ROTATE_ANNOTATION.to_owned(), "tomorrow".to_owned())]);
        assert_eq!(rotate_before(Some(&bad)), None);
        assert_eq!(rotate_before(None), None);
    }
}
