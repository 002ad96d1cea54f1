//! The test registry against the real binaries: the distribution registry, crane and
//! cosign. What the image tests rely on is checked here: pushes and digests, basic auth,
//! an outage and its end on the same images, a slow registry, cosign's verdicts and the
//! request counts.

use std::time::{Duration, Instant};

use harness::{KeyPair, Registry, RegistryOptions};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn a_pushed_image_has_a_digest_that_depends_on_its_content() -> TestResult {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let one = registry.push_image("team/app", "v1", "one").await?;
    let again = registry.push_image("team/app", "v1-again", "one").await?;
    let two = registry.push_image("team/app", "v2", "two").await?;
    assert!(one.starts_with("sha256:") && one.len() == 71, "{one}");
    assert_eq!(one, again, "the same content makes the same digest");
    assert_ne!(one, two);
    let by_digest = registry
        .crane(&["digest", &format!("{}/team/app@{one}", registry.host())])
        .await?;
    assert_eq!(by_digest.trim(), one);
    assert_eq!(registry.get("/v2/team/app/manifests/v2", None).await?, 200);
    assert_eq!(registry.get("/v2/team/app/manifests/v3", None).await?, 404);
    Ok(())
}

#[tokio::test]
async fn basic_auth_refuses_anonymous_clients_and_accepts_the_user() -> TestResult {
    let registry = Registry::start(RegistryOptions {
        auth: Some(("alice".to_owned(), "s3cret".to_owned())),
        ..RegistryOptions::default()
    })
    .await?;
    assert_eq!(registry.get("/v2/", None).await?, 401);
    assert_eq!(registry.get("/v2/", Some(("alice", "wrong"))).await?, 401);
    assert_eq!(registry.get("/v2/", Some(("alice", "s3cret"))).await?, 200);
    // crane logs in (the harness stores the credentials) and pushes.
    let digest = registry.push_image("private/app", "v1", "x").await?;
    let manifest = format!("/v2/private/app/manifests/{digest}");
    assert_eq!(registry.get(&manifest, None).await?, 401);
    assert_eq!(
        registry.get(&manifest, Some(("alice", "s3cret"))).await?,
        200
    );
    Ok(())
}

#[tokio::test]
async fn an_outage_refuses_connections_and_its_end_serves_the_same_images() -> TestResult {
    let mut registry = Registry::start(RegistryOptions::default()).await?;
    let digest = registry
        .push_image("team/app", "v1", "before the outage")
        .await?;
    let host = registry.host();

    registry.stop().await;
    let refused = registry.get("/v2/", None).await;
    assert!(refused.is_err(), "no answer during the outage: {refused:?}");
    let crane = registry
        .crane(&["digest", &format!("{host}/team/app:v1")])
        .await;
    assert!(crane.is_err(), "crane fails during the outage: {crane:?}");

    registry.start_again()?;
    assert_eq!(registry.host(), host, "the same address");
    let after = registry
        .crane(&["digest", &format!("{host}/team/app:v1")])
        .await?;
    assert_eq!(after.trim(), digest, "the same storage");
    Ok(())
}

#[tokio::test]
async fn a_delay_holds_each_new_connection() -> TestResult {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let delay = Duration::from_millis(1500);
    registry.set_delay(delay);
    let started = Instant::now();
    assert_eq!(registry.get("/v2/", None).await?, 200);
    // A lower bound only: the proxy holds the connection at least this long.
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    registry.set_delay(Duration::ZERO);
    assert_eq!(registry.get("/v2/", None).await?, 200);
    Ok(())
}

#[tokio::test]
async fn cosign_verifies_the_signing_key_only_and_no_unsigned_image() -> TestResult {
    let registry = Registry::start(RegistryOptions {
        auth: Some(("signer".to_owned(), "pw".to_owned())),
        ..RegistryOptions::default()
    })
    .await?;
    let (key, other) = (KeyPair::generate().await?, KeyPair::generate().await?);
    assert!(key.public_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
    assert_ne!(key.public_pem(), other.public_pem());

    let host = registry.host();
    let signed = format!(
        "{host}/team/app@{}",
        registry.push_image("team/app", "signed", "signed").await?
    );
    let unsigned = format!(
        "{host}/team/app@{}",
        registry
            .push_image("team/app", "unsigned", "unsigned")
            .await?
    );
    registry.sign(&key, &signed).await?;

    assert!(registry.cosign_verify(&key, &signed).await?);
    assert!(!registry.cosign_verify(&other, &signed).await?);
    assert!(!registry.cosign_verify(&key, &unsigned).await?);
    Ok(())
}

#[tokio::test]
async fn the_request_log_counts_pushes_and_signature_reads() -> TestResult {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let digest = registry.push_image("team/app", "v1", "counted").await?;
    let key = KeyPair::generate().await?;
    let reference = format!("{}/team/app@{digest}", registry.host());
    registry.sign(&key, &reference).await?;
    assert!(registry.cosign_verify(&key, &reference).await?);

    // The access log line is written once the response is: wait for it, never sleep.
    let requests = harness::eventually(
        "the signature read in the access log",
        Duration::from_secs(30),
        || async {
            let requests = registry.requests()?;
            let read = requests
                .iter()
                .any(|r| r.method == "GET" && r.is_signature() && r.status == 200);
            Ok::<_, harness::poll::Failure>(read.then_some(requests))
        },
    )
    .await?;
    let manifest_puts = requests
        .iter()
        .filter(|r| r.method == "PUT" && r.is_manifest() && r.status == 201)
        .count();
    // The image and its signature.
    assert_eq!(manifest_puts, 2, "{requests:#?}");
    let image_put = "/v2/team/app/manifests/v1";
    assert!(
        requests
            .iter()
            .any(|r| r.method == "PUT" && r.path == image_put),
        "{requests:#?}"
    );
    let blob_uploads = requests
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/blobs/uploads/"))
        .count();
    assert!(
        blob_uploads >= 2,
        "layer and config of the image: {requests:#?}"
    );
    Ok(())
}
