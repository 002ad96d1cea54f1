//! Image verification on a real API server against a real OCI registry (CNCF
//! distribution over TLS), with images pushed by crane and signed by cosign in the test,
//! with keys made for this run. The controller runs at its shipped defaults
//! (`ImageConfig::defaults()`: resolve interval 1 min, registry timeout 10 s; resync
//! 10 min): waits are bounded by those intervals, never shortened for the test.
//!
//! Each test has its own registry (its own host and port) and its policies select only
//! the test's namespace, so tests sharing the control plane never govern each other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::conditions::{IMAGE_VERIFIED, READY, STALLED, reasons};
use common::image_policy::ImagePolicy;
use common::{AppService, ImageStatus};
use controller::images::ImageConfig;
use controller::images::metrics::{ImageMetrics, RegistryOperation, RegistryOutcome};
use controller::metrics::Metrics;
use futures::{StreamExt, TryStreamExt};
use harness::{KeyPair, Registry, RegistryOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Fixture, Running, condition, create, image_of, verifying};

/// One pass after a hold's recheck (60 s) or a tag's resolve interval (1 min), with room
/// for a busy machine.
const RECHECK: Duration = Duration::from_secs(150);
/// What a first pass needs.
const FIRST: Duration = Duration::from_secs(60);

struct World {
    f: Fixture,
    ctl: Running,
    registry: Registry,
    metrics: Arc<Metrics>,
    policies: Api<ImagePolicy>,
    names: Vec<String>,
}

impl World {
    async fn start(registry: Registry) -> anyhow::Result<World> {
        World::start_with(registry, |_| {}).await
    }

    /// With `tweak` applied to the image flags (the registry's CA is always trusted).
    async fn start_with(
        registry: Registry,
        tweak: impl FnOnce(&mut ImageConfig),
    ) -> anyhow::Result<World> {
        let f = Fixture::setup().without_controller().await?;
        let mut images = ImageConfig {
            registry_ca_file: Some(registry.ca_file()),
            ..ImageConfig::defaults()
        };
        tweak(&mut images);
        let (ctl, metrics) = verifying(&f, images)?;
        Ok(World {
            policies: Api::all(f.client.clone()),
            f,
            ctl,
            registry,
            metrics,
            names: Vec::new(),
        })
    }

    fn image(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.registry.host())
    }

    /// A policy governing every image of this registry in this test's namespace.
    async fn policy(
        &mut self,
        name: &str,
        mode: &str,
        keys: serde_json::Value,
    ) -> anyhow::Result<()> {
        let spec = json!({
            "images": [{"glob": format!("{}/**", self.registry.host())}],
            "mode": mode,
            "keys": keys,
        });
        self.create_policy(name, spec).await
    }

    /// A policy with `spec`, selecting only this test's namespace.
    async fn create_policy(
        &mut self,
        name: &str,
        mut spec: serde_json::Value,
    ) -> anyhow::Result<()> {
        let name = format!("{}-{name}", self.f.ns.name());
        spec["namespaceSelector"] =
            json!({"matchLabels": {"kubernetes.io/metadata.name": self.f.ns.name()}});
        let policy: ImagePolicy = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        self.policies
            .create(&PostParams::default(), &policy)
            .await?;
        self.names.push(name);
        Ok(())
    }

    /// [`Self::policy`], then waits until the controller reports it observed (its
    /// status's `observedGeneration`, written from the cache the verifier reads, at the
    /// shipped interval): an AppService created after that is judged by it. One created
    /// before may be judged without it (the caches are eventually consistent), and its
    /// children may then exist before the verdict.
    async fn policy_in_force(
        &mut self,
        name: &str,
        mode: &str,
        keys: serde_json::Value,
    ) -> anyhow::Result<()> {
        self.policy(name, mode, keys).await?;
        let name = format!("{}-{name}", self.f.ns.name());
        harness::eventually(
            &format!("{name} observed by the controller"),
            Duration::from_secs(60),
            || async {
                let p = self.policies.get(&name).await?;
                let observed = p.status.as_ref().and_then(|s| s.observed_generation);
                Ok((observed.is_some() && observed == p.metadata.generation).then_some(()))
            },
        )
        .await?;
        Ok(())
    }

    async fn edit_policy(&self, name: &str, spec: serde_json::Value) -> anyhow::Result<i64> {
        let name = format!("{}-{name}", self.f.ns.name());
        let p = self
            .policies
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await?;
        Ok(p.metadata.generation.unwrap_or_default())
    }

    async fn delete_policy(&mut self, name: &str) -> anyhow::Result<()> {
        let name = format!("{}-{name}", self.f.ns.name());
        self.policies
            .delete(&name, &DeleteParams::default())
            .await?;
        self.names.retain(|n| *n != name);
        Ok(())
    }

    async fn app(&self, name: &str, image: &str) -> anyhow::Result<()> {
        create(
            &self.f.apps,
            &common::testing::app(name, image).replicas(1).build(),
        )
        .await?;
        Ok(())
    }

    /// Waits until `pick` finds what it looks for in the AppService and its Deployment.
    async fn until<T>(
        &self,
        name: &str,
        what: &str,
        bound: Duration,
        pick: impl Fn(&AppService, Option<&Deployment>) -> Option<T>,
    ) -> anyhow::Result<T> {
        let what = format!("{name}: {what}");
        Ok(harness::eventually(&what, bound, || async {
            let app = self.f.apps.get(name).await?;
            let deployment = self.f.deployments.get_opt(name).await?;
            Ok(pick(&app, deployment.as_ref()))
        })
        .await?)
    }

    /// Waits for `ImageVerified` with `status` and `reason`, and returns the AppService.
    async fn verdict(
        &self,
        name: &str,
        status: &str,
        reason: &str,
        bound: Duration,
    ) -> anyhow::Result<AppService> {
        self.until(
            name,
            &format!("ImageVerified={status} {reason}"),
            bound,
            |app, _| {
                let (s, r, _) = condition(app, IMAGE_VERIFIED)?;
                (s == status && r == reason).then(|| app.clone())
            },
        )
        .await
    }

    /// Waits until the Deployment runs `image`.
    async fn runs(&self, name: &str, image: &str, bound: Duration) -> anyhow::Result<AppService> {
        // ... and the status, written at the end of the same pass, says so: the digest
        // pinned, or no status.image when the image runs as written.
        let digest = image.split_once('@').map(|(_, d)| d);
        self.until(
            name,
            &format!("its Deployment runs {image}"),
            bound,
            |app, d| {
                let said = recorded(app).map(|i| i.digest.as_str());
                let agrees = match digest {
                    Some(digest) => said == Some(digest),
                    None => said.is_none(),
                };
                (d.and_then(image_of).as_deref() == Some(image) && agrees).then(|| app.clone())
            },
        )
        .await
    }

    async fn stop(self) -> anyhow::Result<()> {
        for name in &self.names {
            let _ = self.policies.delete(name, &DeleteParams::default()).await;
        }
        self.ctl.stop().await
    }
}

fn recorded(app: &AppService) -> Option<&ImageStatus> {
    app.status.as_ref()?.image.as_ref()
}

fn inline(name: &str, key: &KeyPair) -> serde_json::Value {
    json!({"name": name, "publicKey": key.public_pem()})
}

/// The registry's resolves of tags (HEAD of a manifest by tag, signatures left out) and
/// signature manifests fetched, from its access log.
fn counts(registry: &Registry) -> anyhow::Result<(usize, usize)> {
    let requests = registry.requests()?;
    let resolves = requests
        .iter()
        .filter(|r| r.method == "HEAD" && r.is_manifest() && !r.is_signature())
        .count();
    let signatures = requests
        .iter()
        .filter(|r| r.method == "GET" && r.is_signature())
        .count();
    Ok((resolves, signatures))
}

#[tokio::test]
async fn signed_unsigned_foreign_and_digest_references_get_their_verdicts() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let (ours, theirs) = (KeyPair::generate().await?, KeyPair::generate().await?);
    let host = registry.host();
    let signed = registry.push_image("shop/signed", "v1", "signed").await?;
    let unsigned = registry
        .push_image("shop/unsigned", "v1", "unsigned")
        .await?;
    let foreign = registry.push_image("shop/foreign", "v1", "foreign").await?;
    registry
        .sign(&ours, &format!("{host}/shop/signed@{signed}"))
        .await?;
    registry
        .sign(&theirs, &format!("{host}/shop/foreign@{foreign}"))
        .await?;
    let mut w = World::start(registry).await?;
    w.policy_in_force("release", "Enforce", json!([inline("release", &ours)]))
        .await?;

    let by_digest = format!("{host}/shop/signed@{signed}");
    let unsigned_by_digest = format!("{host}/shop/unsigned@{unsigned}");
    w.app("signed", &w.image("shop/signed", "v1")).await?;
    w.app("unsigned", &w.image("shop/unsigned", "v1")).await?;
    w.app("foreign", &w.image("shop/foreign", "v1")).await?;
    w.app("by-digest", &by_digest).await?;
    w.app("unsigned-by-digest", &unsigned_by_digest).await?;

    // Signed: runs pinned to the digest, status says by which key, under which policy.
    let app = w
        .runs(
            "signed",
            &format!("{}@{signed}", w.image("shop/signed", "v1")),
            FIRST,
        )
        .await?;
    let image = recorded(&app).context("status.image")?;
    assert_eq!(image.digest, signed);
    assert_eq!(image.reference, w.image("shop/signed", "v1"));
    assert_eq!(image.verified_by.len(), 1);
    assert_eq!(image.verified_by[0].key.as_deref(), Some("release"));
    assert_eq!(image.verified_by[0].mode, "Enforce");
    assert!(image.verified_at.is_some());
    assert_eq!(
        condition(&app, IMAGE_VERIFIED).map(|c| c.1),
        Some(reasons::VERIFIED.to_owned())
    );
    // The user's spec is never rewritten.
    assert_eq!(app.spec.image, w.image("shop/signed", "v1"));
    // A digest reference runs as written, verified like a tag.
    w.runs("by-digest", &by_digest, FIRST).await?;

    // Unsigned, and signed by another key: held, Stalled, not Ready, nothing created.
    for (name, reason) in [
        ("unsigned", reasons::IMAGE_UNSIGNED),
        ("foreign", reasons::SIGNATURE_INVALID),
        ("unsigned-by-digest", reasons::IMAGE_UNSIGNED),
    ] {
        let app = w.verdict(name, "False", reason, FIRST).await?;
        assert_eq!(
            condition(&app, STALLED).map(|c| c.0).as_deref(),
            Some("True"),
            "{name}"
        );
        assert_eq!(
            condition(&app, READY).map(|c| c.1).as_deref(),
            Some(reason),
            "{name}"
        );
        assert!(
            w.f.deployments.get_opt(name).await?.is_none(),
            "{name}: held, nothing runs"
        );
    }

    // cosign agrees with every verdict.
    let host = w.registry.host();
    assert!(
        w.registry
            .cosign_verify(&ours, &format!("{host}/shop/signed@{signed}"))
            .await?
    );
    assert!(
        !w.registry
            .cosign_verify(&ours, &format!("{host}/shop/unsigned@{unsigned}"))
            .await?
    );
    assert!(
        !w.registry
            .cosign_verify(&ours, &format!("{host}/shop/foreign@{foreign}"))
            .await?
    );
    w.stop().await
}

#[tokio::test]
async fn a_repushed_tag_keeps_the_verified_digest_until_the_new_one_is_signed() -> anyhow::Result<()>
{
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let first = registry.push_image("shop/app", "stable", "first").await?;
    registry
        .sign(&key, &format!("{host}/shop/app@{first}"))
        .await?;
    let mut w = World::start(registry).await?;
    w.policy("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let tag = w.image("shop/app", "stable");
    w.app("app", &tag).await?;
    w.runs("app", &format!("{tag}@{first}"), FIRST).await?;

    // The tag now points at an unsigned image: the verified digest keeps running.
    let second = w
        .registry
        .push_image("shop/app", "stable", "second")
        .await?;
    assert_ne!(first, second);
    let app = w
        .verdict("app", "False", reasons::IMAGE_UNSIGNED, RECHECK)
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(message.contains("keeps running"), "{message}");
    let d = w.f.deployments.get("app").await?;
    assert_eq!(image_of(&d), Some(format!("{tag}@{first}")));
    assert_eq!(
        recorded(&app).map(|i| i.digest.as_str()),
        Some(first.as_str())
    );

    // Signed: it rolls out.
    w.registry
        .sign(&key, &format!("{host}/shop/app@{second}"))
        .await?;
    let app = w.runs("app", &format!("{tag}@{second}"), RECHECK).await?;
    assert_eq!(
        recorded(&app).map(|i| i.digest.as_str()),
        Some(second.as_str())
    );
    w.stop().await
}

#[tokio::test]
async fn a_registry_outage_or_a_slow_registry_never_stops_what_runs() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let running = registry.push_image("shop/running", "v1", "running").await?;
    let fresh = registry.push_image("shop/fresh", "v1", "fresh").await?;
    for (repo, digest) in [("shop/running", &running), ("shop/fresh", &fresh)] {
        registry
            .sign(&key, &format!("{host}/{repo}@{digest}"))
            .await?;
    }
    let mut w = World::start(registry).await?;
    w.policy_in_force("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let pinned = format!("{}@{running}", w.image("shop/running", "v1"));
    w.app("running", &w.image("shop/running", "v1")).await?;
    w.runs("running", &pinned, FIRST).await?;

    w.registry.stop().await;
    let down = Instant::now();
    // A new image cannot be verified: it waits, Reconciling, and nothing runs.
    w.app("fresh", &w.image("shop/fresh", "v1")).await?;
    let app = w
        .verdict("fresh", "Unknown", reasons::REGISTRY_UNAVAILABLE, FIRST)
        .await?;
    assert_eq!(
        condition(&app, "Reconciling").map(|c| c.0).as_deref(),
        Some("True")
    );
    assert_eq!(
        condition(&app, STALLED).map(|c| c.0).as_deref(),
        Some("False")
    );
    assert!(w.f.deployments.get_opt("fresh").await?.is_none());

    // Past the tag's resolve interval, a spec change of the running AppService still
    // reaches its Deployment, with the digest verified before standing in.
    harness::eventually("the tag's resolve interval to pass", RECHECK, || async {
        down.elapsed() > Duration::from_secs(65)
    })
    .await?;
    w.f.apps
        .patch(
            "running",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    w.until(
        "running",
        "3 replicas of the verified digest",
        FIRST,
        |_, d| {
            let d = d?;
            (d.spec.replicas == Some(3) && image_of(d).as_deref() == Some(pinned.as_str()))
                .then_some(())
        },
    )
    .await?;
    w.verdict("running", "Unknown", reasons::REGISTRY_UNAVAILABLE, FIRST)
        .await?;
    assert!(
        w.metrics
            .families::<ImageMetrics>()
            .requests_of(RegistryOperation::Resolve, RegistryOutcome::Unavailable)
            > 0
    );

    // Slower than the timeout is as good as down; back and fast, the new image runs.
    w.registry.start_again()?;
    w.registry.set_delay(Duration::from_secs(15));
    w.app("slow", &w.image("shop/fresh", "v1")).await?;
    w.verdict("slow", "Unknown", reasons::REGISTRY_UNAVAILABLE, FIRST)
        .await?;
    w.registry.set_delay(Duration::ZERO);
    w.runs(
        "fresh",
        &format!("{}@{fresh}", w.image("shop/fresh", "v1")),
        RECHECK,
    )
    .await?;
    w.verdict("running", "True", reasons::VERIFIED, RECHECK)
        .await?;
    w.stop().await
}

#[tokio::test]
async fn a_policy_added_to_running_workloads_audits_then_enforces_then_goes() -> anyhow::Result<()>
{
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let digest = registry.push_image("shop/legacy", "v1", "legacy").await?;
    let mut w = World::start(registry).await?;
    let tag = w.image("shop/legacy", "v1");
    w.app("legacy", &tag).await?;
    // No policy: the image runs as written and nothing is said about it.
    let app = w.runs("legacy", &tag, FIRST).await?;
    assert!(condition(&app, IMAGE_VERIFIED).is_none());

    // Audit: reported, pinned, and it keeps running; not Stalled.
    w.policy("watch", "Audit", json!([inline("k", &key)]))
        .await?;
    let pinned = format!("{tag}@{digest}");
    w.runs("legacy", &pinned, RECHECK).await?;
    let app = w
        .verdict("legacy", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    assert_eq!(
        condition(&app, STALLED).map(|c| c.0).as_deref(),
        Some("False")
    );
    assert_eq!(
        recorded(&app).and_then(|i| i.verified_by[0].key.clone()),
        None
    );

    // Enforce: held; what runs keeps running.
    w.edit_policy("watch", json!({"mode": "Enforce"})).await?;
    let app = w
        .until("legacy", "held and Stalled", RECHECK, |app, _| {
            (condition(app, STALLED)?.0 == "True").then(|| app.clone())
        })
        .await?;
    assert_eq!(
        condition(&app, IMAGE_VERIFIED).map(|c| c.1).as_deref(),
        Some(reasons::IMAGE_UNSIGNED)
    );
    assert_eq!(
        image_of(&w.f.deployments.get("legacy").await?),
        Some(pinned.clone())
    );

    // Signed: verified, Ready again as far as the image goes.
    w.registry
        .sign(&key, &format!("{host}/shop/legacy@{digest}"))
        .await?;
    w.verdict("legacy", "True", reasons::VERIFIED, RECHECK)
        .await?;

    // The policy goes: so do the condition and status.image; the image runs as written.
    w.delete_policy("watch").await?;
    let app = w.runs("legacy", &tag, FIRST).await?;
    w.until("legacy", "no ImageVerified", FIRST, |app, _| {
        (condition(app, IMAGE_VERIFIED).is_none() && recorded(app).is_none()).then_some(())
    })
    .await?;
    drop(app);
    w.stop().await
}

#[tokio::test]
async fn keys_rotate_through_a_secret_and_two_policies_add_up() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let (old, new, audit) = (
        KeyPair::generate().await?,
        KeyPair::generate().await?,
        KeyPair::generate().await?,
    );
    let host = registry.host();
    let digest = registry.push_image("shop/app", "v1", "app").await?;
    let reference = format!("{host}/shop/app@{digest}");
    registry.sign(&old, &reference).await?;
    let mut w = World::start(registry).await?;
    let secrets: Api<Secret> = w.f.api();
    let key_secret = |pem: &str| -> Secret {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "signing-key"},
            "stringData": {"cosign.pub": pem}
        }))
        .unwrap()
    };
    secrets
        .create(&PostParams::default(), &key_secret(old.public_pem()))
        .await?;
    w.policy(
        "release",
        "Enforce",
        json!([{"name": "release", "secretRef": {"name": "signing-key"}}]),
    )
    .await?;
    let tag = w.image("shop/app", "v1");
    w.app("app", &tag).await?;
    w.runs("app", &format!("{tag}@{digest}"), FIRST).await?;

    // The Secret now holds the new key only: the image signed by the old one is held.
    secrets
        .replace(
            "signing-key",
            &PostParams::default(),
            &key_secret(new.public_pem()),
        )
        .await?;
    w.verdict("app", "False", reasons::SIGNATURE_INVALID, RECHECK)
        .await?;
    // Signed with the new key: verified by it.
    w.registry.sign(&new, &reference).await?;
    let app = w.verdict("app", "True", reasons::VERIFIED, RECHECK).await?;
    assert_eq!(
        recorded(&app).unwrap().verified_by[0].key.as_deref(),
        Some("release")
    );

    // A second policy on the same image: both must verify. Its generation is recorded.
    w.policy("second", "Enforce", json!([inline("second", &audit)]))
        .await?;
    w.verdict("app", "False", reasons::SIGNATURE_INVALID, RECHECK)
        .await?;
    w.registry.sign(&audit, &reference).await?;
    let generation = w
        .edit_policy(
            "second",
            json!({"keys": [inline("second", &audit), inline("spare", &old)]}),
        )
        .await?;
    let app = w
        .until(
            "app",
            "verified by both at the new generation",
            RECHECK,
            |app, _| {
                let by = &recorded(app)?.verified_by;
                (by.len() == 2
                    && by.iter().all(|v| v.key.is_some())
                    && by
                        .iter()
                        .any(|v| v.generation == generation && v.policy.ends_with("-second")))
                .then(|| app.clone())
            },
        )
        .await?;
    assert_eq!(
        condition(&app, IMAGE_VERIFIED).map(|c| c.0).as_deref(),
        Some("True")
    );
    w.stop().await
}

#[tokio::test]
async fn a_thousand_appservices_on_ten_images_resolve_each_tag_once() -> anyhow::Result<()> {
    const APPS: usize = 1000;
    const IMAGES: usize = 10;
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let mut digests = Vec::new();
    for i in 0..IMAGES {
        let digest = registry
            .push_image(&format!("fleet/svc{i}"), "v1", &format!("svc{i}"))
            .await?;
        registry
            .sign(&key, &format!("{host}/fleet/svc{i}@{digest}"))
            .await?;
        digests.push(digest);
    }
    let (resolves_before, signatures_before) = counts(&registry)?;
    let mut w = World::start(registry).await?;
    w.policy("fleet", "Enforce", json!([inline("k", &key)]))
        .await?;
    let started = Instant::now();
    let apps: Vec<AppService> = (0..APPS)
        .map(|i| {
            let image = w.image(&format!("fleet/svc{}", i % IMAGES), "v1");
            common::testing::app(&format!("app-{i}"), &image)
                .replicas(1)
                .build()
        })
        .collect();
    futures::stream::iter(apps.iter().map(|app| create(&w.f.apps, app)))
        .buffer_unordered(50)
        .try_collect::<Vec<_>>()
        .await?;
    // Every Deployment pinned to its digest. How long a thousand take depends on what
    // else the machine runs (CI runs four suites at once on 2 cores), so the wait is
    // bounded by progress, not by a total: it fails when no further Deployment is
    // pinned for a minute, which a stuck resolve or verification would cause.
    const STALL: Duration = Duration::from_secs(60);
    let (mut pinned, mut progressed) = (0, Instant::now());
    while pinned < APPS {
        let list = w.f.deployments.list(&Default::default()).await?;
        let now_pinned = list
            .items
            .iter()
            .filter(|d| {
                image_of(d).is_some_and(|i| digests.iter().any(|dg| i.ends_with(dg.as_str())))
            })
            .count();
        if now_pinned > pinned {
            (pinned, progressed) = (now_pinned, Instant::now());
        } else if progressed.elapsed() > STALL {
            anyhow::bail!("{pinned} of {APPS} Deployments pinned, none more for {STALL:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = started.elapsed();
    let (resolves, signatures) = counts(&w.registry)?;
    let (resolves, signatures) = (resolves - resolves_before, signatures - signatures_before);
    // Each tag resolved once per resolve interval (1 min) that the run spans, and each
    // digest's signatures fetched once per reverify interval (5 min, the shipped
    // default) it spans.
    let intervals = 1 + (took.as_secs() / 60) as usize;
    let reverifies = 1 + (took.as_secs() / 300) as usize;
    println!(
        "{APPS} AppServices on {IMAGES} images in {took:?}: {resolves} resolves, {signatures} signature manifests"
    );
    assert!(
        resolves >= IMAGES && resolves <= IMAGES * intervals,
        "{resolves} resolves"
    );
    assert!(
        signatures >= IMAGES && signatures <= IMAGES * reverifies,
        "{signatures} signature manifests: cached per digest for a reverify interval"
    );
    w.stop().await
}

#[tokio::test]
async fn without_the_imagepolicy_crd_nothing_waits_and_its_install_is_seen() -> anyhow::Result<()> {
    // Helm installs `crds/` only on install: after an upgrade from a release without
    // ImagePolicies the CRD is missing. A private control plane, since the CRD goes.
    let cp = harness::ControlPlane::start(harness::Options::plain()).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(cp.client());
    crds.delete(
        "imagepolicies.platform.example.com",
        &DeleteParams::default(),
    )
    .await?;
    harness::eventually("the ImagePolicy CRD gone", FIRST, || async {
        Ok(crds
            .get_opt("imagepolicies.platform.example.com")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let f = Fixture::setup().on(&cp).without_controller().await?;
    let (ctl, _) = verifying(&f, ImageConfig::defaults())?;
    let image = "registry.example.com/shop/app:v1";
    create(
        &f.apps,
        &common::testing::app("app", image).replicas(1).build(),
    )
    .await?;
    harness::eventually(
        "the image running as written, unverified",
        FIRST,
        || async {
            let app = f.apps.get("app").await?;
            let d = f.deployments.get_opt("app").await?;
            let done = d.as_ref().and_then(image_of).as_deref() == Some(image)
                && app.status.as_ref().and_then(|s| s.observed_generation) == Some(1)
                && condition(&app, IMAGE_VERIFIED).is_none();
            Ok(done.then_some(()))
        },
    )
    .await?;

    // The CRD installed and a policy written at once: the controller lists them and
    // the AppService is governed (this registry does not exist: it waits on it).
    cp.apply_crd(&common::crd::image_policy_crd()).await?;
    let policies: Api<ImagePolicy> = Api::all(cp.client());
    let key = KeyPair::generate().await?;
    let policy: ImagePolicy = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": "everything"},
        "spec": {"images": [{"glob": "registry.example.com/**"}], "keys": [inline("k", &key)]}
    }))?;
    harness::eventually("the ImagePolicy created", FIRST, || async {
        Ok(policies
            .create(&PostParams::default(), &policy)
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;
    harness::eventually("the AppService governed", RECHECK, || async {
        let app = f.apps.get("app").await?;
        Ok(condition(&app, IMAGE_VERIFIED).map(|_| ()))
    })
    .await?;
    // What ran before the policy keeps running while the registry is out of reach.
    let d = f.deployments.get("app").await?;
    assert_eq!(image_of(&d).as_deref(), Some(image));
    ctl.stop().await
}

#[tokio::test]
async fn a_private_registry_is_read_with_the_credentials_secret_and_refused_without()
-> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions {
        auth: Some(("robot".to_owned(), "pull-only".to_owned())),
        ..RegistryOptions::default()
    })
    .await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let digest = registry.push_image("private/app", "v1", "private").await?;
    registry
        .sign(&key, &format!("{host}/private/app@{digest}"))
        .await?;
    let mut w = World::start_with(registry, |images| {
        images.registry_credentials_secret = Some("registry-pull".into());
    })
    .await?;
    w.policy("private", "Enforce", json!([inline("k", &key)]))
        .await?;
    let tag = w.image("private/app", "v1");

    // No credentials Secret yet: the registry refuses, and that holds.
    w.app("app", &tag).await?;
    let app = w
        .verdict("app", "False", reasons::REGISTRY_DENIED, FIRST)
        .await?;
    assert_eq!(
        condition(&app, STALLED).map(|c| c.0).as_deref(),
        Some("True")
    );

    // The Secret as `kubectl create secret docker-registry` makes it, keyed by host.
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("robot:pull-only");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "registry-pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": json!({"auths": {host.clone(): {"auth": auth}}}).to_string()}
    }))?;
    w.f.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    w.runs("app", &format!("{tag}@{digest}"), RECHECK).await?;
    w.verdict("app", "True", reasons::VERIFIED, FIRST).await?;
    w.stop().await
}

#[tokio::test]
async fn hostile_signature_manifests_are_refused_within_their_bounds() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let host = registry.host();
    let key = KeyPair::generate().await?;
    let many = registry.push_image("hostile/many", "v1", "many").await?;
    let big = registry.push_image("hostile/big", "v1", "big").await?;
    let tag_of = |digest: &str| format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let files = tempfile::tempdir()?;
    // 65 layers under the signature tag: one more than is ever looked at.
    let mut layers = Vec::new();
    for i in 0..65 {
        let path = files.path().join(format!("layer-{i}.tar"));
        std::fs::write(
            &path,
            harness::registry::tar_with_one_file("x", format!("{i}").as_bytes()),
        )?;
        layers.push(path.display().to_string());
    }
    let mut args = vec!["append", "--oci-empty-base"];
    for layer in &layers {
        args.extend(["--new_layer", layer.as_str()]);
    }
    let many_sig = format!("{host}/hostile/many:{}", tag_of(&many));
    args.extend(["--new_tag", many_sig.as_str()]);
    registry.crane(&args).await?;
    // One layer of 100 KiB (random: crane gzips layers): larger than any payload read.
    let path = files.path().join("big.tar");
    std::fs::write(
        &path,
        harness::registry::tar_with_one_file(
            "x",
            &(0..100 * 1024)
                .map(|_| rand::random::<u8>())
                .collect::<Vec<_>>(),
        ),
    )?;
    let big_layer = path.display().to_string();
    let big_sig = format!("{host}/hostile/big:{}", tag_of(&big));
    registry
        .crane(&[
            "append",
            "--oci-empty-base",
            "--new_layer",
            &big_layer,
            "--new_tag",
            &big_sig,
        ])
        .await?;
    let blob_reads = |registry: &Registry| -> anyhow::Result<usize> {
        Ok(registry
            .requests()?
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.path.starts_with("/v2/hostile/")
                    && r.path.contains("/blobs/")
            })
            .count())
    };
    let before = blob_reads(&registry)?;

    let mut w = World::start(registry).await?;
    w.policy("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    w.app("many", &w.image("hostile/many", "v1")).await?;
    w.app("big", &w.image("hostile/big", "v1")).await?;
    let app = w
        .verdict("many", "False", reasons::SIGNATURE_INVALID, FIRST)
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(message.contains("more than 64 layers"), "{message}");
    let app = w
        .verdict("big", "False", reasons::SIGNATURE_INVALID, FIRST)
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    // (Refused as a layer that is no signature: its media type is checked first.)
    assert!(message.contains("malformed"), "{message}");
    // Neither the 65 layers nor the large one were downloaded.
    assert_eq!(blob_reads(&w.registry)? - before, 0);
    w.stop().await
}

#[tokio::test]
async fn the_canary_image_is_verified_and_pinned_on_its_own() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let stable = registry.push_image("shop/web", "v1", "v1").await?;
    let canary = registry.push_image("shop/web", "v2", "v2").await?;
    registry
        .sign(&key, &format!("{host}/shop/web@{stable}"))
        .await?;
    let mut w = World::start(registry).await?;
    w.policy_in_force("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let (v1, v2) = (w.image("shop/web", "v1"), w.image("shop/web", "v2"));
    let app = common::testing::app("web", &v1)
        .replicas(2)
        .spec(|s| {
            s.canary = Some(common::CanarySpec {
                image: v2.clone(),
                replicas: Some(1),
            })
        })
        .build();
    create(&w.f.apps, &app).await?;
    // The canary's image is unsigned: the whole AppService is held before any child,
    // and status says it is the canary's image.
    let held = w
        .verdict("web", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    let (_, _, message) = condition(&held, IMAGE_VERIFIED).unwrap();
    assert!(message.contains(&v2), "{message}");
    assert!(w.f.deployments.get_opt("web").await?.is_none());
    // Signed: both run pinned, each recorded.
    w.registry
        .sign(&key, &format!("{host}/shop/web@{canary}"))
        .await?;
    let canary_name = common::names::canary_deployment_name("web");
    let app = w
        .until("web", "the canary Deployment pinned", RECHECK, |app, _| {
            let canary_image = app.status.as_ref()?.canary_image.as_ref()?;
            (canary_image.digest == canary).then(|| app.clone())
        })
        .await?;
    assert_eq!(
        recorded(&app).map(|i| i.digest.as_str()),
        Some(stable.as_str())
    );
    let d = w.f.deployments.get(&canary_name).await?;
    assert_eq!(image_of(&d), Some(format!("{v2}@{canary}")));
    let d = w.f.deployments.get("web").await?;
    assert_eq!(image_of(&d), Some(format!("{v1}@{stable}")));
    // status.canary names the canary's image as the spec writes it.
    assert_eq!(
        app.status
            .as_ref()
            .and_then(|s| s.canary.as_ref())
            .map(|c| c.image.as_str()),
        Some(v2.as_str())
    );
    w.stop().await
}

#[tokio::test]
async fn a_policy_whose_key_secret_is_missing_holds_and_says_so_on_itself() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let digest = registry.push_image("shop/app", "v1", "app").await?;
    registry
        .sign(&key, &format!("{host}/shop/app@{digest}"))
        .await?;
    let mut w = World::start(registry).await?;
    w.policy_in_force(
        "release",
        "Enforce",
        json!([{"name": "release", "secretRef": {"name": "release-key"}}]),
    )
    .await?;
    let policy_name = format!("{}-release", w.f.ns.name());
    let policy_ready = |want: &'static str| {
        let policies = w.policies.clone();
        let name = policy_name.clone();
        async move {
            harness::eventually(&format!("ImagePolicy Ready={want}"), FIRST, || async {
                let p = policies.get(&name).await?;
                let status = p.status.unwrap_or_default();
                let ready = common::conditions::find(&status.conditions, "Ready")
                    .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
                Ok(ready.filter(|r| r.0 == want))
            })
            .await
        }
    };
    let (_, reason, message) = policy_ready("False").await?;
    assert_eq!(reason, reasons::IMAGE_POLICY_NOT_USABLE);
    assert!(message.contains("release-key"), "{message}");
    w.app("app", &w.image("shop/app", "v1")).await?;
    w.verdict("app", "False", reasons::IMAGE_POLICY_NOT_USABLE, FIRST)
        .await?;
    assert!(w.f.deployments.get_opt("app").await?.is_none());

    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "release-key"},
        "stringData": {"cosign.pub": key.public_pem()}
    }))?;
    w.f.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    policy_ready("True").await?;
    w.runs(
        "app",
        &format!("{}@{digest}", w.image("shop/app", "v1")),
        RECHECK,
    )
    .await?;
    w.stop().await
}

/// The container image of `deployment` set to `image`, as a tenant with `edit` can.
async fn edit_deployment_image(w: &World, deployment: &str, image: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": controller::desired::CONTAINER_NAME, "image": image}
    ]}}}});
    w.f.deployments
        .patch(
            deployment,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_held_appservice_keeps_its_children_converged_to_what_verified() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let signed = registry.push_image("shop/app", "v1", "v1").await?;
    registry.push_image("shop/app", "v2", "v2").await?;
    let evil = registry.push_image("shop/evil", "v1", "evil").await?;
    registry
        .sign(&key, &format!("{host}/shop/app@{signed}"))
        .await?;
    let mut w = World::start(registry).await?;
    w.policy_in_force("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let (v1, v2) = (w.image("shop/app", "v1"), w.image("shop/app", "v2"));
    let pinned = format!("{v1}@{signed}");
    w.app("app", &v1).await?;
    w.runs("app", &pinned, FIRST).await?;

    // The spec moves to an unsigned image: held, and status says what keeps running.
    w.f.apps
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": v2}})),
        )
        .await?;
    let app = w
        .verdict("app", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(
        message.contains(&format!("{v1} (sha256:")) && message.contains("keeps running"),
        "{message}"
    );
    assert_eq!(
        condition(&app, STALLED).map(|c| c.0).as_deref(),
        Some("True")
    );

    // A tenant points the Deployment at another unsigned image: it is put back.
    let evil_ref = format!("{host}/shop/evil@{evil}");
    edit_deployment_image(&w, "app", &evil_ref).await?;
    w.until("app", "the verified digest put back", FIRST, |_, d| {
        (d.and_then(image_of).as_deref() == Some(pinned.as_str())).then_some(())
    })
    .await?;
    // Deleted: it comes back, running the verified digest, while still held.
    w.f.deployments
        .delete("app", &DeleteParams::default())
        .await?;
    let app = w
        .until("app", "the Deployment back, held", FIRST, |app, d| {
            let d = d?;
            let fresh = d.metadata.deletion_timestamp.is_none();
            (fresh
                && image_of(d).as_deref() == Some(pinned.as_str())
                && condition(app, STALLED)?.0 == "True")
                .then(|| app.clone())
        })
        .await?;
    assert_eq!(
        recorded(&app).map(|i| i.digest.as_str()),
        Some(signed.as_str())
    );
    assert_eq!(app.spec.image, v2, "the spec is never rewritten");
    w.stop().await
}

#[tokio::test]
async fn an_enforce_policy_over_a_running_unsigned_workload_keeps_it_and_says_so()
-> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let digest = registry.push_image("shop/legacy", "v1", "legacy").await?;
    let other = registry.push_image("shop/other", "v1", "other").await?;
    let mut w = World::start(registry).await?;
    let tag = w.image("shop/legacy", "v1");
    w.app("legacy", &tag).await?;
    w.runs("legacy", &tag, FIRST).await?;

    // Enforce arrives: what runs keeps running, pinned to what its tag is now (a Pod
    // made later pulls that, not whatever the tag moves to), and status says so.
    w.policy("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let pinned = format!("{tag}@{digest}");
    let app = w
        .until("legacy", "held, pinned to what ran", RECHECK, |app, d| {
            let (_, reason, _) = condition(app, IMAGE_VERIFIED)?;
            (reason == reasons::IMAGE_UNSIGNED
                && d.and_then(image_of).as_deref() == Some(pinned.as_str()))
            .then(|| app.clone())
        })
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(message.contains("keeps running"), "{message}");
    assert!(!message.contains("nothing runs"), "{message}");
    let record = recorded(&app).context("status.image records what runs")?;
    assert_eq!(record.digest, digest);
    assert!(record.verified_by.is_empty() && record.verified_at.is_none());

    // A foreign edit is repaired to what ran.
    edit_deployment_image(&w, "legacy", &w.image("shop/other", "v1")).await?;
    w.until("legacy", "what ran put back", FIRST, |_, d| {
        (d.and_then(image_of).as_deref() == Some(pinned.as_str())).then_some(())
    })
    .await?;
    // A new AppService of an unsigned image runs nothing, and says so.
    w.app("fresh", &format!("{}@{other}", w.image("shop/other", "v1")))
        .await?;
    let app = w
        .verdict("fresh", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(
        message.contains("nothing runs until it verifies"),
        "{message}"
    );
    assert!(w.f.deployments.get_opt("fresh").await?.is_none());
    w.stop().await
}

#[tokio::test]
async fn a_signature_deleted_at_the_registry_is_a_revocation_within_the_reverify_interval()
-> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let digest = registry.push_image("shop/app", "v1", "app").await?;
    let by_digest = format!("{host}/shop/app@{digest}");
    registry.sign(&key, &by_digest).await?;
    // The admin's knob (the chart's `reverifyInterval`, 5 m by default), set short so
    // the test waits one interval, not five minutes; every other setting is shipped.
    let reverify = Duration::from_secs(30);
    let mut w = World::start_with(registry, |c| c.reverify_interval = reverify).await?;
    w.policy_in_force("release", "Enforce", json!([inline("k", &key)]))
        .await?;
    let tag = w.image("shop/app", "v1");
    let pinned = format!("{tag}@{digest}");
    w.app("app", &tag).await?;
    w.runs("app", &pinned, FIRST).await?;

    let signature = format!(
        "{host}/shop/app:sha256-{}.sig",
        digest.trim_start_matches("sha256:")
    );
    w.registry.crane(&["delete", &signature]).await?;
    // Within the reverify interval and a pass (a governed AppService gets one every
    // resolve interval): revoked; what runs keeps running.
    let app = w
        .verdict(
            "app",
            "False",
            reasons::SIGNATURE_REVOKED,
            RECHECK + reverify,
        )
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(message.contains("keeps running"), "{message}");
    assert_eq!(
        image_of(&w.f.deployments.get("app").await?),
        Some(pinned.clone())
    );
    // Nothing new rolls it out.
    w.app("another", &tag).await?;
    w.verdict("another", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    assert!(w.f.deployments.get_opt("another").await?.is_none());
    // Signed again: verified again.
    w.registry.sign(&key, &by_digest).await?;
    w.verdict("app", "True", reasons::VERIFIED, RECHECK).await?;
    w.runs("another", &pinned, RECHECK).await?;
    w.stop().await
}

#[tokio::test]
async fn a_policy_written_for_localhost_governs_every_spelling_of_it() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let port = registry
        .host()
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .context("the registry's port")?;
    registry
        .push_image("shop/unsigned", "v1", "unsigned")
        .await?;
    let mut w = World::start(registry).await?;
    // The policy names the registry as `localhost`; the AppService as `127.0.0.1`.
    w.create_policy(
        "localhost",
        json!({"images": [{"glob": format!("localhost:{port}/**")}], "keys": [inline("k", &key)]}),
    )
    .await?;
    w.app("loopback", &format!("127.0.0.1:{port}/shop/unsigned:v1"))
        .await?;
    w.verdict("loopback", "False", reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    assert!(w.f.deployments.get_opt("loopback").await?.is_none());
    w.stop().await
}

#[tokio::test]
async fn a_policy_that_says_so_scales_a_failing_running_workload_to_zero() -> anyhow::Result<()> {
    let registry = Registry::start(RegistryOptions::default()).await?;
    let key = KeyPair::generate().await?;
    let host = registry.host();
    let digest = registry.push_image("shop/legacy", "v1", "legacy").await?;
    let mut w = World::start(registry).await?;
    let tag = w.image("shop/legacy", "v1");
    w.f.apps
        .create(
            &PostParams::default(),
            &common::testing::app("legacy", &tag).replicas(2).build(),
        )
        .await?;
    w.runs("legacy", &tag, FIRST).await?;

    w.create_policy(
        "stop",
        json!({
            "images": [{"glob": format!("{host}/**")}],
            "onRunningFailure": "ScaleToZero",
            "keys": [inline("k", &key)],
        }),
    )
    .await?;
    let pinned = format!("{tag}@{digest}");
    let app = w
        .until("legacy", "scaled to zero, held", RECHECK, |app, d| {
            let d = d?;
            let (_, reason, _) = condition(app, IMAGE_VERIFIED)?;
            (reason == reasons::IMAGE_UNSIGNED
                && d.spec.replicas == Some(0)
                && image_of(d).as_deref() == Some(pinned.as_str()))
            .then(|| app.clone())
        })
        .await?;
    let (_, _, message) = condition(&app, IMAGE_VERIFIED).unwrap();
    assert!(
        message.contains("scaled to zero until it verifies"),
        "{message}"
    );
    assert_eq!(app.spec.replicas, Some(2), "the spec is never rewritten");
    // Signed: it runs again at the spec's replicas.
    w.registry
        .sign(&key, &format!("{host}/shop/legacy@{digest}"))
        .await?;
    w.until("legacy", "verified, 2 replicas again", RECHECK, |app, d| {
        let (status, _, _) = condition(app, IMAGE_VERIFIED)?;
        (status == "True" && d?.spec.replicas == Some(2)).then_some(())
    })
    .await?;
    w.stop().await
}
