#![allow(clippy::unwrap_used)]
use super::*;
use crate::cosign::testing::{Signer, digest, payload};
use common::image_policy::{ImagePattern, ImagePolicySpec, PolicyKey};

const IMAGE: &str = "registry.example.com/shop/app:v1";

fn policy(
    name: &str,
    generation: i64,
    mode: PolicyMode,
    keys: Result<Vec<Key>, String>,
) -> PolicyKeys {
    let mut p = ImagePolicy::new(
        name,
        ImagePolicySpec {
            images: vec![ImagePattern {
                glob: "registry.example.com/**".into(),
            }],
            namespace_selector: None,
            on_running_failure: Default::default(),
            mode,
            keys: vec![PolicyKey {
                name: "k".into(),
                public_key: Some("unused".into()),
                secret_ref: None,
            }],
        },
    );
    p.metadata.generation = Some(generation);
    PolicyKeys {
        policy: Arc::new(p),
        keys,
    }
}

fn signed(d: &str, layers: Vec<SignatureLayer>) -> Fetched {
    Fetched::Signed {
        digest: d.to_owned(),
        layers: Arc::new(layers),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

#[test]
fn a_signed_image_runs_pinned_and_records_who_verified_it() {
    let signer = Signer::new();
    let d = digest('a');
    let p = [policy(
        "prod",
        3,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    let v = decide(
        IMAGE,
        &p,
        signed(&d, vec![signer.layer(&payload(&d))]),
        None,
        None,
    );
    assert!(!v.holds() && v.transient().is_none());
    assert_eq!(v.pin(), Some(format!("{IMAGE}@{d}")));
    let status = v.status(&now()).unwrap();
    assert_eq!(status.digest, d);
    assert_eq!(
        status.verified_by,
        vec![ImageVerification {
            policy: "prod".into(),
            generation: 3,
            mode: "Enforce".into(),
            key: Some("release".into()),
        }]
    );
    let c = condition(&[&v]);
    assert_eq!((c.status, c.reason), (TRUE, reasons::VERIFIED));
    // A second pass with that status recorded keeps verifiedAt: no status write.
    let again = decide(
        IMAGE,
        &p,
        signed(&d, vec![signer.layer(&payload(&d))]),
        Some(&status),
        None,
    );
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
    assert_eq!(again.status(&later), Some(status));
}

#[test]
fn unsigned_wrong_key_and_other_image_hold_with_their_reason() {
    let (signer, stranger) = (Signer::new(), Signer::new());
    let (d, other) = (digest('a'), digest('b'));
    let p = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    let prior = ImageStatus {
        reference: IMAGE.into(),
        digest: digest('c'),
        verified_at: None,
        verified_by: vec![],
    };
    for (layers, reason, result) in [
        (vec![], reasons::IMAGE_UNSIGNED, Verification::Unsigned),
        (
            vec![stranger.layer(&payload(&d))],
            reasons::SIGNATURE_INVALID,
            Verification::Invalid,
        ),
        (
            vec![signer.layer(&payload(&other))],
            reasons::SIGNATURE_INVALID,
            Verification::Invalid,
        ),
    ] {
        let v = decide(IMAGE, &p, signed(&d, layers), Some(&prior), None);
        assert!(v.holds(), "{reason}");
        assert_eq!(v.result, result);
        assert_eq!(v.pin(), None);
        // What ran keeps running, and the status keeps saying so.
        assert_eq!(v.status(&now()), Some(prior.clone()));
        let c = condition(&[&v]);
        assert_eq!((c.status, c.reason), (FALSE, reason));
        assert!(c.message.contains("keeps running"), "{}", c.message);
    }
}

#[test]
fn policies_add_up_keys_are_alternatives_and_audit_never_holds() {
    let (a, b) = (Signer::new(), Signer::new());
    let d = digest('a');
    let by_a = vec![a.layer(&payload(&d))];
    // Keys within one policy: either suffices (rotation with both keys listed).
    let rotating = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![b.key("new"), a.key("old")]),
    )];
    let v = decide(IMAGE, &rotating, signed(&d, by_a.clone()), None, None);
    assert_eq!(
        v.status(&now()).unwrap().verified_by[0].key.as_deref(),
        Some("old")
    );
    // Two Enforce policies: both must verify.
    let two = [
        policy("a", 1, PolicyMode::Enforce, Ok(vec![a.key("a")])),
        policy("b", 1, PolicyMode::Enforce, Ok(vec![b.key("b")])),
    ];
    assert!(decide(IMAGE, &two, signed(&d, by_a.clone()), None, None).holds());
    let both = vec![a.layer(&payload(&d)), b.layer(&payload(&d))];
    assert!(!decide(IMAGE, &two, signed(&d, both), None, None).holds());
    // Audit: runs pinned, reported as failed.
    let audit = [policy("watch", 1, PolicyMode::Audit, Ok(vec![b.key("b")]))];
    let v = decide(IMAGE, &audit, signed(&d, by_a), None, None);
    assert!(!v.holds());
    assert_eq!(v.pin(), Some(format!("{IMAGE}@{d}")));
    let c = condition(&[&v]);
    assert_eq!((c.status, c.reason), (FALSE, reasons::SIGNATURE_INVALID));
    assert!(c.message.contains("Audit"), "{}", c.message);
}

#[test]
fn a_policy_that_cannot_be_used_holds_only_when_it_enforces() {
    let d = digest('a');
    let broken = || Err("key k: Secret ops/keys not found".to_owned());
    let v = decide(
        IMAGE,
        &[policy("p", 1, PolicyMode::Enforce, broken())],
        signed(&d, vec![]),
        None,
        None,
    );
    assert!(v.holds());
    assert_eq!(condition(&[&v]).reason, reasons::IMAGE_POLICY_NOT_USABLE);
    let v = decide(
        IMAGE,
        &[policy("p", 1, PolicyMode::Audit, broken())],
        signed(&d, vec![]),
        None,
        None,
    );
    assert!(!v.holds());
}

#[test]
fn a_registry_outage_keeps_what_was_verified_for_the_same_reference_and_generations() {
    let d = digest('a');
    let p = [policy("prod", 2, PolicyMode::Enforce, Ok(vec![]))];
    let verified = ImageStatus {
        reference: IMAGE.into(),
        digest: d.clone(),
        verified_at: None,
        verified_by: vec![ImageVerification {
            policy: "prod".into(),
            generation: 2,
            mode: "Enforce".into(),
            key: Some("k".into()),
        }],
    };
    let down = || {
        Fetched::failed(
            None,
            RegistryError::Unavailable("connection refused".into()),
        )
    };
    let v = decide(IMAGE, &p, down(), Some(&verified), None);
    assert!(!v.holds() && v.transient().is_none());
    assert_eq!(v.pin(), Some(format!("{IMAGE}@{d}")));
    assert_eq!(condition(&[&v]).status, UNKNOWN);
    // Another reference, or the policy at another generation: nothing stands in.
    let other = ImageStatus {
        reference: "registry.example.com/shop/app:v2".into(),
        ..verified.clone()
    };
    let v = decide(IMAGE, &p, down(), Some(&other), None);
    assert!(v.transient().is_some());
    assert_eq!(v.pin(), None);
    let moved = [policy("prod", 3, PolicyMode::Enforce, Ok(vec![]))];
    assert!(
        decide(IMAGE, &moved, down(), Some(&verified), None)
            .transient()
            .is_some()
    );
    // Missing and refused are not transient: held.
    for e in [
        RegistryError::NotFound("tag".into()),
        RegistryError::Denied("401".into()),
    ] {
        assert!(decide(IMAGE, &p, Fetched::failed(None, e), Some(&verified), None).holds());
    }
}

#[test]
fn a_digest_reference_is_pinned_as_written_and_the_worst_image_decides() {
    let signer = Signer::new();
    let d = digest('a');
    let by_digest = format!("registry.example.com/shop/app@{d}");
    let p = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("k")]),
    )];
    let good = decide(
        &by_digest,
        &p,
        signed(&d, vec![signer.layer(&payload(&d))]),
        None,
        None,
    );
    assert_eq!(good.pin(), Some(by_digest.clone()));
    let bad = decide(IMAGE, &p, signed(&d, vec![]), None, None);
    let c = condition(&[&good, &bad]);
    assert_eq!((c.status, c.reason), (FALSE, reasons::IMAGE_UNSIGNED));
}

#[test]
fn what_keeps_running_is_the_record_else_the_live_deployment_else_nothing() {
    let signer = Signer::new();
    let d = digest('a');
    let p = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    // Recorded: the record runs, whatever the live Deployment was edited to.
    let prior = ImageStatus {
        reference: "registry.example.com/shop/app:v0".into(),
        digest: digest('c'),
        verified_at: None,
        verified_by: vec![],
    };
    let v = decide(
        IMAGE,
        &p,
        signed(&d, vec![]),
        Some(&prior),
        Some("registry.example.com/evil:latest"),
    );
    assert!(v.holds());
    assert_eq!(
        v.runs(),
        Some(format!("registry.example.com/shop/app:v0@{}", digest('c')))
    );
    assert_eq!(v.status(&now()), Some(prior.clone()));
    let message = condition(&[&v]).message;
    assert!(
        message.contains("registry.example.com/shop/app:v0 (sha256:cccccccccccc…) keeps running"),
        "{message}"
    );
    // Not recorded (it ran before a policy governed it): the live Deployment's image, as
    // written, is pinned to the digest its tag resolves to now, and recorded.
    let v = decide(IMAGE, &p, signed(&d, vec![]), None, Some(IMAGE));
    assert_eq!(v.runs(), Some(format!("{IMAGE}@{d}")));
    let recorded = v.status(&now()).unwrap();
    assert_eq!(
        (recorded.reference.as_str(), recorded.digest.as_str()),
        (IMAGE, d.as_str())
    );
    assert!(recorded.verified_by.is_empty() && recorded.verified_at.is_none());
    assert!(condition(&[&v]).message.contains("keeps running"));
    // A live image pinned by an earlier pass (its status since edited away).
    let live = format!("registry.example.com/shop/app:v0@{}", digest('c'));
    let v = decide(IMAGE, &p, signed(&d, vec![]), None, Some(&live));
    assert_eq!(v.runs(), Some(live.clone()));
    assert_eq!(v.status(&now()).unwrap().digest, digest('c'));
    // Another tag, never resolved: it keeps running as it is.
    let v = decide(
        IMAGE,
        &p,
        signed(&d, vec![]),
        None,
        Some("registry.example.com/x:1"),
    );
    assert_eq!(v.runs(), Some("registry.example.com/x:1".into()));
    // Nothing ran: nothing runs, and the message says so.
    let v = decide(IMAGE, &p, signed(&d, vec![]), None, None);
    assert_eq!((v.runs(), v.status(&now())), (None, None));
    assert!(
        condition(&[&v])
            .message
            .contains("nothing runs until it verifies")
    );
    // A registry that is down holds the same way: what ran keeps running.
    let down = Fetched::failed(None, RegistryError::Unavailable("refused".into()));
    let v = decide(IMAGE, &p, down, None, Some(IMAGE));
    assert!(v.transient().is_some());
    assert_eq!(v.runs(), Some(IMAGE.to_owned()));
}

#[test]
fn a_signature_gone_from_a_verified_digest_is_a_revocation() {
    let signer = Signer::new();
    let d = digest('a');
    let p = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    let verified = ImageStatus {
        reference: IMAGE.into(),
        digest: d.clone(),
        verified_at: Some(now()),
        verified_by: vec![ImageVerification {
            policy: "prod".into(),
            generation: 1,
            mode: "Enforce".into(),
            key: Some("release".into()),
        }],
    };
    let stranger = Signer::new();
    for (layers, reason, result) in [
        (vec![], reasons::SIGNATURE_REVOKED, Verification::Revoked),
        // Replaced by a signature that does not verify: held as invalid (a key rotated
        // under the same name looks the same).
        (
            vec![stranger.layer(&payload(&d))],
            reasons::SIGNATURE_INVALID,
            Verification::Invalid,
        ),
    ] {
        let v = decide(IMAGE, &p, signed(&d, layers), Some(&verified), Some(IMAGE));
        assert!(v.holds());
        assert_eq!(v.result, result);
        // What runs keeps running: the verified digest, and its record.
        assert_eq!(v.runs(), Some(format!("{IMAGE}@{d}")));
        assert_eq!(v.status(&now()), Some(verified.clone()));
        let c = condition(&[&v]);
        assert_eq!((c.status, c.reason), (FALSE, reason));
        assert!(c.message.contains("keeps running"), "{}", c.message);
    }
    // Another digest of the tag, unsigned, is no revocation: it was never verified.
    let v = decide(
        IMAGE,
        &p,
        signed(&digest('b'), vec![]),
        Some(&verified),
        None,
    );
    assert_eq!(condition(&[&v]).reason, reasons::IMAGE_UNSIGNED);
}

#[test]
fn answers_larger_than_their_bound_or_invalid_hold_with_their_own_reason() {
    let p = [policy("prod", 1, PolicyMode::Enforce, Ok(vec![]))];
    for (error, reason, result) in [
        (
            RegistryError::TooLarge("the manifest at x is larger than its bound of 4 MiB".into()),
            reasons::REGISTRY_RESPONSE_TOO_LARGE,
            Verification::TooLarge,
        ),
        (
            RegistryError::Invalid("more than 5 redirects".into()),
            reasons::REGISTRY_RESPONSE_INVALID,
            Verification::InvalidAnswer,
        ),
    ] {
        let v = decide(IMAGE, &p, Fetched::failed(None, error), None, None);
        assert!(v.holds() && v.transient().is_none(), "{reason}");
        assert_eq!(v.result, result);
        let c = condition(&[&v]);
        assert_eq!((c.status, c.reason), (FALSE, reason));
    }
    let audit = [policy("watch", 1, PolicyMode::Audit, Ok(vec![]))];
    let v = decide(
        IMAGE,
        &audit,
        Fetched::failed(None, RegistryError::TooLarge("big".into())),
        None,
        None,
    );
    assert!(!v.holds());
    assert_eq!(v.runs(), Some(IMAGE.to_owned()));
}

#[test]
fn a_reference_with_a_tag_and_a_digest_says_the_digest_runs() {
    let signer = Signer::new();
    let d = digest('a');
    let image = format!("{IMAGE}@{d}");
    let p = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    let v = decide(
        &image,
        &p,
        signed(&d, vec![signer.layer(&payload(&d))]),
        None,
        None,
    );
    assert_eq!(v.pin(), Some(image.clone()));
    let message = condition(&[&v]).message;
    assert!(
        message.contains("names tag \"v1\" and a digest: the digest runs, the tag is ignored"),
        "{message}"
    );
    let plain = decide(
        IMAGE,
        &p,
        signed(&d, vec![signer.layer(&payload(&d))]),
        None,
        None,
    );
    assert!(!condition(&[&plain]).message.contains("ignored"));
}

#[test]
fn a_policy_may_scale_what_runs_to_zero_when_it_fails() {
    let signer = Signer::new();
    let d = digest('a');
    let mut stopping = policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    );
    let mut spec = stopping.policy.spec.clone();
    spec.on_running_failure = common::image_policy::RunningFailure::ScaleToZero;
    stopping.policy = Arc::new(ImagePolicy::new("prod", spec));
    let p = [stopping];
    let verified = ImageStatus {
        reference: IMAGE.into(),
        digest: d.clone(),
        verified_at: Some(now()),
        verified_by: vec![ImageVerification {
            policy: "prod".into(),
            generation: 0,
            mode: "Enforce".into(),
            key: Some("release".into()),
        }],
    };
    // Its signature is gone: what runs is this digest, and the policy stops it.
    let v = decide(IMAGE, &p, signed(&d, vec![]), Some(&verified), Some(IMAGE));
    assert!(v.holds() && v.stops());
    assert!(
        condition(&[&v])
            .message
            .contains("is scaled to zero until it verifies"),
        "{}",
        condition(&[&v]).message
    );
    // Another digest of the tag fails: what runs (the verified one) is not stopped.
    let v = decide(
        IMAGE,
        &p,
        signed(&digest('b'), vec![]),
        Some(&verified),
        Some(IMAGE),
    );
    assert!(v.holds() && !v.stops());
    // Under the default, what runs keeps running.
    let keep = [policy(
        "prod",
        1,
        PolicyMode::Enforce,
        Ok(vec![signer.key("release")]),
    )];
    let v = decide(
        IMAGE,
        &keep,
        signed(&d, vec![]),
        Some(&verified),
        Some(IMAGE),
    );
    assert!(v.holds() && !v.stops());
}
