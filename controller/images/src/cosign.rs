//! cosign's signatures, as `cosign sign --key` stores them in a registry, and their check.
//!
//! For an image of manifest digest `sha256:<hex>`, the signatures are the layers of the
//! manifest tagged `sha256-<hex>.sig` in the same repository ([`signature_tag`]). Each
//! layer is a "simple signing" JSON payload ([`SIMPLE_SIGNING_MEDIA_TYPE`]) naming the
//! digest it signs; the layer's annotation [`SIGNATURE_ANNOTATION`] holds the base64 of
//! an ASN.1 DER ECDSA signature over the payload's bytes, SHA-256, curve P-256.
//!
//! [`verify`] is pure: the caller has fetched the layers (bounded) and parsed the keys
//! once ([`Key::from_pem`]). The signature is checked over the exact bytes fetched
//! (never a re-serialization), then the payload must name the very digest that will
//! run: a valid signature of another image proves nothing about this one.
//!
//! Crypto is aws-lc-rs, already the process's one TLS provider: no second crypto stack.

use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1, ParsedPublicKey};
use base64::Engine as _;
use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;

/// Media type of a signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation of a signature layer holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign payload.
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Bounds of what is looked at (their table is [`super::bounds`]): a payload (cosign's
/// are a few hundred bytes; annotations make them longer), a base64 signature, and the
/// layers of one signature manifest.
pub const MAX_PAYLOAD_BYTES: usize = super::bounds::SIGNATURE_LAYER.bytes;
pub const MAX_SIGNATURE_B64: usize = super::bounds::MAX_SIGNATURE_B64;
pub const MAX_LAYERS: usize = super::bounds::MAX_LAYERS;

/// The tag of the signatures of `digest` (`sha256:<hex>` → `sha256-<hex>.sig`).
pub fn signature_tag(digest: &str) -> Result<String, Refusal> {
    match digest.split_once(':') {
        Some(("sha256", hex))
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(format!("sha256-{hex}.sig"))
        }
        _ => Err(Refusal::Digest(digest.chars().take(80).collect())),
    }
}

/// A public key a policy accepts, parsed once.
#[derive(Debug)]
pub struct Key {
    /// The policy's name for it (`keys[].name`), reported as the verifier.
    pub name: String,
    key: ParsedPublicKey,
}

/// Why a policy's key is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not a PEM public key (-----BEGIN PUBLIC KEY-----): {0}")]
    Pem(String),
    #[error("not an ECDSA P-256 public key (cosign generate-key-pair makes those)")]
    Algorithm,
}

impl Key {
    /// Parses the PEM SubjectPublicKeyInfo `cosign generate-key-pair` writes.
    pub fn from_pem(name: &str, pem: &str) -> Result<Self, KeyError> {
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| KeyError::Pem(e.to_string()))?;
        let key = ParsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, der.as_ref())
            .map_err(|_| KeyError::Algorithm)?;
        Ok(Key {
            name: name.to_owned(),
            key,
        })
    }
}

/// One layer of a signature manifest, as fetched.
#[derive(Debug, Clone)]
pub struct SignatureLayer {
    pub media_type: String,
    /// The value of [`SIGNATURE_ANNOTATION`], if the layer had one.
    pub signature: Option<String>,
    /// The layer's blob (its digest checked by the fetcher).
    pub payload: Vec<u8>,
}

/// Why no layer verified, by the most telling reason among them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0:?} is not a sha256 manifest digest")]
    Digest(String),
    #[error("the image has no signatures")]
    Unsigned,
    #[error("the signature manifest has more than {MAX_LAYERS} layers")]
    TooManyLayers,
    #[error("no signature is valid for any of the policy's keys")]
    NoKeyMatches,
    #[error("a valid signature signs {signed}, not this image")]
    OtherDigest { signed: String },
    #[error("a signature layer is malformed: {0}")]
    Malformed(String),
}

impl Refusal {
    /// Severity for choosing the message to report: a signature of another image or by
    /// another key says more than a layer that is not a signature at all.
    fn weight(&self) -> u8 {
        match self {
            Refusal::OtherDigest { .. } => 3,
            Refusal::NoKeyMatches => 2,
            Refusal::Malformed(_) => 1,
            _ => 0,
        }
    }
}

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    image: PayloadImage,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PayloadImage {
    #[serde(rename = "docker-manifest-digest")]
    digest: String,
}

/// The name of the first key that verifies a layer signing `digest`, or why none does.
/// Keys are alternatives: any one suffices.
pub fn verify<'k>(
    digest: &str,
    layers: &[SignatureLayer],
    keys: &'k [Key],
) -> Result<&'k str, Refusal> {
    signature_tag(digest)?;
    if layers.len() > MAX_LAYERS {
        return Err(Refusal::TooManyLayers);
    }
    let mut worst = Refusal::Unsigned;
    for layer in layers {
        match verify_layer(digest, layer, keys) {
            Ok(name) => return Ok(name),
            Err(e) if e.weight() > worst.weight() => worst = e,
            Err(_) => {}
        }
    }
    Err(worst)
}

fn verify_layer<'k>(
    digest: &str,
    layer: &SignatureLayer,
    keys: &'k [Key],
) -> Result<&'k str, Refusal> {
    if layer.media_type != SIMPLE_SIGNING_MEDIA_TYPE {
        return Err(Refusal::Malformed(format!(
            "media type {:?}",
            layer.media_type.chars().take(100).collect::<String>()
        )));
    }
    let b64 = layer
        .signature
        .as_deref()
        .ok_or_else(|| Refusal::Malformed(format!("no {SIGNATURE_ANNOTATION} annotation")))?;
    if b64.len() > MAX_SIGNATURE_B64 {
        return Err(Refusal::Malformed(format!(
            "a signature of more than {MAX_SIGNATURE_B64} characters"
        )));
    }
    if layer.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Refusal::Malformed(format!(
            "a payload of more than {MAX_PAYLOAD_BYTES} bytes"
        )));
    }
    let signature = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| Refusal::Malformed(format!("the signature is not base64: {e}")))?;
    let key = keys
        .iter()
        .find(|k| k.key.verify_sig(&layer.payload, &signature).is_ok())
        .ok_or(Refusal::NoKeyMatches)?;
    // Only now is the payload trusted enough to read.
    let payload: Payload = serde_json::from_slice(&layer.payload)
        .map_err(|e| Refusal::Malformed(format!("the payload is not cosign's: {e}")))?;
    if payload.critical.kind != PAYLOAD_TYPE {
        return Err(Refusal::Malformed(format!(
            "payload type {:?}",
            payload.critical.kind.chars().take(100).collect::<String>()
        )));
    }
    if payload.critical.image.digest != digest {
        return Err(Refusal::OtherDigest {
            signed: payload.critical.image.digest.chars().take(80).collect(),
        });
    }
    Ok(&key.name)
}

/// Signatures made in unit tests as `cosign sign` makes them.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

    /// A key pair made for the test, as `cosign generate-key-pair` would.
    pub struct Signer(EcdsaKeyPair);

    impl Signer {
        pub fn new() -> Self {
            Signer(EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).unwrap())
        }
        pub fn public_pem(&self) -> String {
            pem(self.0.public_key())
        }
        pub fn key(&self, name: &str) -> Key {
            Key::from_pem(name, &self.public_pem()).unwrap()
        }
        pub fn sign(&self, payload: &[u8]) -> String {
            let sig = self.0.sign(&SystemRandom::new(), payload).unwrap();
            base64::engine::general_purpose::STANDARD.encode(sig.as_ref())
        }
        pub fn layer(&self, payload: &[u8]) -> SignatureLayer {
            SignatureLayer {
                media_type: SIMPLE_SIGNING_MEDIA_TYPE.to_owned(),
                signature: Some(self.sign(payload)),
                payload: payload.to_vec(),
            }
        }
    }

    pub fn pem(public: &aws_lc_rs::signature::EcdsaPublicKey) -> String {
        let der = public.as_der().unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            lines.join("\n")
        )
    }

    pub fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    pub fn payload(digest: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": "registry.example.com/shop/app"},
                "image": {"docker-manifest-digest": digest},
                "type": PAYLOAD_TYPE
            },
            "optional": null
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::testing::*;
    use super::*;
    use aws_lc_rs::signature::{ECDSA_P384_SHA384_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

    #[test]
    fn the_signature_tag_of_a_digest() {
        assert_eq!(
            signature_tag(&digest('a')).unwrap(),
            format!("sha256-{}.sig", "a".repeat(64))
        );
        for bad in [
            "sha256:abc".to_owned(),
            format!("sha512:{}", "a".repeat(128)),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}/x", "a".repeat(61)),
            "latest".to_owned(),
        ] {
            assert!(
                matches!(signature_tag(&bad), Err(Refusal::Digest(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_signature_by_one_of_the_keys_verifies() {
        let (release, other) = (Signer::new(), Signer::new());
        let keys = [other.key("old"), release.key("release")];
        let d = digest('a');
        assert_eq!(
            verify(&d, &[release.layer(&payload(&d))], &keys),
            Ok("release")
        );
        // A manifest may hold several signatures; one valid one is enough.
        let stranger = Signer::new();
        let layers = [stranger.layer(&payload(&d)), other.layer(&payload(&d))];
        assert_eq!(verify(&d, &layers, &keys), Ok("old"));
    }

    #[test]
    fn another_key_tampering_and_another_image_are_refused() {
        let (release, stranger) = (Signer::new(), Signer::new());
        let keys = [release.key("release")];
        let d = digest('a');
        assert_eq!(
            verify(&d, &[stranger.layer(&payload(&d))], &keys),
            Err(Refusal::NoKeyMatches)
        );
        // The payload changed after signing: the signature no longer covers it.
        let mut tampered = release.layer(&payload(&digest('b')));
        tampered.payload = payload(&d);
        assert_eq!(verify(&d, &[tampered], &keys), Err(Refusal::NoKeyMatches));
        // A genuine signature of another image (a signature copied to this digest's tag).
        assert_eq!(
            verify(&d, &[release.layer(&payload(&digest('b')))], &keys),
            Err(Refusal::OtherDigest {
                signed: digest('b')
            })
        );
        assert_eq!(verify(&d, &[], &keys), Err(Refusal::Unsigned));
    }

    #[test]
    fn malformed_layers_are_refused_with_a_reason() {
        let release = Signer::new();
        let keys = [release.key("release")];
        let d = digest('a');
        let good = release.layer(&payload(&d));
        let cases: Vec<(SignatureLayer, &str)> = vec![
            (
                SignatureLayer {
                    media_type: "application/octet-stream".into(),
                    ..good.clone()
                },
                "media type",
            ),
            (
                SignatureLayer {
                    signature: None,
                    ..good.clone()
                },
                "annotation",
            ),
            (
                SignatureLayer {
                    signature: Some("not base64!".into()),
                    ..good.clone()
                },
                "base64",
            ),
            (
                SignatureLayer {
                    signature: Some("A".repeat(MAX_SIGNATURE_B64 + 1)),
                    ..good.clone()
                },
                "characters",
            ),
            (release.layer(&vec![b' '; MAX_PAYLOAD_BYTES + 1]), "bytes"),
            (release.layer(b"{\"critical\": 1}"), "not cosign's"),
            (
                release.layer(
                    &serde_json::to_vec(&serde_json::json!({"critical": {
                        "image": {"docker-manifest-digest": d}, "type": "something else"
                    }}))
                    .unwrap(),
                ),
                "payload type",
            ),
        ];
        for (layer, why) in cases {
            match verify(&d, &[layer], &keys) {
                Err(Refusal::Malformed(m)) => assert!(m.contains(why), "{m} lacks {why}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        let too_many = vec![good; MAX_LAYERS + 1];
        assert_eq!(verify(&d, &too_many, &keys), Err(Refusal::TooManyLayers));
    }

    #[test]
    fn the_most_telling_refusal_is_reported() {
        let (release, stranger) = (Signer::new(), Signer::new());
        let keys = [release.key("release")];
        let d = digest('a');
        let junk = SignatureLayer {
            media_type: "x".into(),
            signature: None,
            payload: vec![],
        };
        let layers = [junk.clone(), stranger.layer(&payload(&d)), junk];
        assert_eq!(verify(&d, &layers, &keys), Err(Refusal::NoKeyMatches));
    }

    #[test]
    fn only_pem_p256_public_keys_are_keys() {
        let p384 = EcdsaKeyPair::generate(&ECDSA_P384_SHA384_ASN1_SIGNING).unwrap();
        assert_eq!(
            Key::from_pem("k", &pem(p384.public_key())).unwrap_err(),
            KeyError::Algorithm
        );
        assert!(matches!(
            Key::from_pem("k", "not a key"),
            Err(KeyError::Pem(_))
        ));
        let private = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(matches!(Key::from_pem("k", private), Err(KeyError::Pem(_))));
        let garbage = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert_eq!(
            Key::from_pem("k", garbage).unwrap_err(),
            KeyError::Algorithm
        );
        // CRLF line ends and text around the block, as keys pasted into YAML have.
        let signer = Signer::new();
        let crlf = format!("comment\r\n{}", signer.public_pem().replace('\n', "\r\n"));
        let key = Key::from_pem("k", &crlf).unwrap();
        let d = digest('c');
        assert_eq!(verify(&d, &[signer.layer(&payload(&d))], &[key]), Ok("k"));
    }
}
