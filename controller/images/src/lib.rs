//! Image verification (the `ImagePolicy` API of `common::image_policy`): the controller,
//! not the webhook, resolves a tag to a digest, fetches the digest's cosign signatures,
//! and verifies them against the policy's keys, so admission never waits on a registry.
//!
//! | module | holds |
//! | --- | --- |
//! | [`cosign`] | cosign's tag-based signature layout and the pure check of a signature against keys |
//! | [`bounds`] | every bound of what a registry may make the controller read, hold and wait for |
//! | [`registry`] | the registry client: resolve a tag, fetch signature layers, bounded, timed, classified |
//! | [`cache`] | the bounded single-flight caches of tags, signatures and Secrets |
//! | [`verdict`] | the pure decision per image from what was fetched |
//! | [`metrics`] | `appservice_controller_registry_*` and `_image_*`, registered through `Metrics::families` of the core |
//! | [`policy_status`] | the ImagePolicy's `Ready`, written by the leader |
//! | [`watch`] | the ImagePolicy and Namespace caches, and what their changes wake |
//!
//! One step of a pass ([`Verifier::check`]), after the database and before the children:
//! every image of the AppService (the stable one and the canary's) that a policy governs
//! is resolved and verified, and the children are rendered with `image@digest`
//! ([`Pins`]); the spec is never rewritten. An image that fails an `Enforce` policy (or
//! waits for a registry that is down) holds the spec back: the children are converged to
//! what ran before ([`Hold`]), so what ran keeps running and is repaired like any
//! other child, and nothing is created when nothing ran.

pub mod bounds;
pub mod cache;
pub mod cosign;
pub mod metrics;
pub mod policy_status;
pub mod registry;
pub mod verdict;
pub mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::ImageStatus;
use common::image_policy::{ImagePolicy, PolicyKey};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use controller_core::config::parse_duration;
use controller_core::external::{ConditionReport, Readiness, Report};
use controller_core::image_gate::ImageGate;
pub use controller_core::image_verdict::{Hold, Images, Live, Pins};
use controller_core::subject::Subject;
use cosign::{Key, SignatureLayer};
use metrics::{ImageCache, ImageMetrics};
use registry::{Auth, Credentials, Registry, RegistryError, Target};
use verdict::{Fetched, PolicyKeys, Verdict};

/// A tag's or signature's failed fetch is tried again after this long at the earliest:
/// a storm of passes during an outage makes one request per key per interval.
const FAILURE_TTL: Duration = Duration::from_secs(5);
/// Signatures that did not verify are fetched again after this long (one may be added).
const UNVERIFIED_TTL: Duration = Duration::from_secs(30);
/// Key Secrets and the credentials Secret are read at most this often.
const SECRET_TTL: Duration = Duration::from_secs(30);
/// A held image is looked at again this often (besides every change of the AppService,
/// of a policy and of the Secrets' TTL): the core's bound, which also caps the backoff
/// of a pass that waits on a registry.
pub use controller_core::image_gate::HOLD_RECHECK;
/// The first pass waits this long at most for the ImagePolicies to be listed.
const LIST_WAIT: Duration = Duration::from_secs(10);

impl ImageGate for Verifier {
    fn check<'a>(
        &'a self,
        app: &'a Subject<'a>,
        live: &'a Live,
        report: &'a mut Report,
        now: &'a Time,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.verify(app, live, report, now))
    }

    fn watch(
        self: Arc<Self>,
        client: &Client,
        apps: Store<common::AppService>,
    ) -> (
        BoxStream<'static, ()>,
        BoxStream<'static, ObjectRef<common::AppService>>,
    ) {
        let (policies, namespaces) = watch::watch(client, &self, apps);
        (policies.boxed(), namespaces.boxed())
    }

    fn background(
        self: Arc<Self>,
        leading: tokio::sync::watch::Receiver<bool>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(policy_status::run(self, leading, stop))
    }
}

/// A pass waits on a registry (or on the ImagePolicies being listed): retried with
/// backoff, counted as `registry`, and looked at again within [`HOLD_RECHECK`] at most.
fn registry_error(message: &str) -> controller_core::error::Error {
    controller_core::error::Error::External {
        reason: controller_core::error::ErrorReason::Registry,
        message: format!("image verification: {message}"),
    }
}

/// Flags of image verification.
#[derive(clap::Args, Debug, Clone)]
pub struct ImageConfig {
    /// Verify the images ImagePolicies govern. Off: policies are not read.
    #[arg(long = "image-verification", env = "IMAGE_VERIFICATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// PEM CA certificates trusted for registries, besides the system's.
    #[arg(long, env = "REGISTRY_CA_FILE")]
    pub registry_ca_file: Option<PathBuf>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the lease namespace with registry
    /// credentials, matched by host.
    #[arg(long, env = "REGISTRY_CREDENTIALS_SECRET")]
    pub registry_credentials_secret: Option<String>,
    /// Timeout of one registry operation.
    #[arg(long, env = "REGISTRY_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub registry_timeout: Duration,
    /// How long a tag's digest is trusted before it is resolved again (and how often a
    /// governed AppService is looked at again).
    #[arg(long, env = "IMAGE_RESOLVE_INTERVAL", value_parser = parse_duration, default_value = "1m")]
    pub resolve_interval: Duration,
    /// How long a verified signature is trusted before it is fetched and verified again
    /// (a revocation at the registry is honoured within this long), in the background of
    /// the passes a governed AppService gets every resolve interval.
    #[arg(long, env = "IMAGE_REVERIFY_INTERVAL", value_parser = parse_duration, default_value = "5m")]
    pub reverify_interval: Duration,
    /// Digests whose signatures are cached (and tags whose digests are).
    #[arg(long, env = "SIGNATURE_CACHE_SIZE", default_value_t = 4096)]
    pub signature_cache_size: usize,
}

impl ImageConfig {
    /// The shipped defaults (what the binary runs with no flag).
    pub fn defaults() -> Self {
        ImageConfig {
            enabled: true,
            registry_ca_file: None,
            registry_credentials_secret: None,
            registry_timeout: Duration::from_secs(10),
            resolve_interval: Duration::from_secs(60),
            reverify_interval: Duration::from_secs(300),
            signature_cache_size: 4096,
        }
    }
}

/// Why the verifier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("reading --registry-ca-file {path}: {error}")]
    CaFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--registry-ca-file {path}: {error}")]
    Client { path: String, error: String },
}

/// The caches the verifier reads, cluster-wide: set once by `run_with`.
pub struct Stores {
    pub policies: Store<ImagePolicy>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The API server does not serve ImagePolicies (404): the CRD is not installed, as
    /// after a `helm upgrade` from a release without it (Helm installs `crds/` only on
    /// install). No policy can exist then, so none governs; set and cleared by the watch.
    pub not_served: std::sync::atomic::AtomicBool,
}

type Secrets = Option<Arc<BTreeMap<String, ByteString>>>;

/// The image step: registry client, caches, and the policies' and namespaces' stores.
pub struct Verifier {
    registry: Arc<Registry>,
    tags: Arc<cache::Cache<Result<String, RegistryError>>>,
    signatures: Arc<cache::Cache<Result<Arc<Vec<SignatureLayer>>, RegistryError>>>,
    secrets: Arc<cache::Cache<Result<Secrets, String>>>,
    client: Client,
    secret_namespace: String,
    config: ImageConfig,
    pub(crate) stores: OnceLock<Stores>,
    metrics: Arc<ImageMetrics>,
    /// The controller's metrics, where the policies' status writes count.
    writes: Arc<controller_core::metrics::Metrics>,
    /// The one namespace the controller watches (`--watch-namespace`), if any: it writes
    /// the status of the policies that select that namespace only.
    scope: Option<String>,
}

impl Verifier {
    /// The verifier of a controller whose Secrets (keys, registry credentials) live in
    /// `secret_namespace` (the lease namespace); it records into `metrics`' families of
    /// image verification ([`ImageMetrics`]).
    pub fn new(
        client: Client,
        config: ImageConfig,
        secret_namespace: &str,
        metrics: &Arc<controller_core::metrics::Metrics>,
    ) -> Result<Self, SetupError> {
        let writes = metrics.clone();
        let metrics = Arc::new(metrics.families::<ImageMetrics>());
        let ca = match &config.registry_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|error| SetupError::CaFile {
                path: path.clone(),
                error,
            })?),
            None => None,
        };
        let registry = Registry::new(ca.as_deref(), config.registry_timeout, metrics.clone())
            .map_err(|error| SetupError::Client {
                path: config
                    .registry_ca_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                error,
            })?;
        Ok(Verifier {
            registry: Arc::new(registry),
            tags: cache::Cache::new(config.signature_cache_size),
            signatures: cache::Cache::new(config.signature_cache_size),
            secrets: cache::Cache::new(256),
            client,
            secret_namespace: secret_namespace.to_owned(),
            config,
            stores: OnceLock::new(),
            metrics,
            writes,
            scope: None,
        })
    }

    /// The verifier of a controller that watches `namespace` only (`None`: every
    /// namespace): the ImagePolicies' status it writes is that of the policies selecting
    /// it. A policy is cluster-wide and read by every release; a release watching one
    /// namespace, whose key Secrets live in its own namespace, must not write the verdict
    /// of its view on a policy meant for others (two releases would flip it back and
    /// forth).
    pub fn scoped_to(mut self, namespace: Option<&str>) -> Self {
        self.scope = namespace.map(str::to_owned);
        self
    }

    /// Whether this controller writes `policy`'s status ([`Verifier::scoped_to`]).
    pub(crate) fn writes_status_of(&self, stores: &Stores, policy: &ImagePolicy) -> bool {
        let Some(namespace) = &self.scope else {
            return true;
        };
        let labels = stores
            .namespaces
            .get(&ObjectRef::new(namespace))
            .and_then(|ns| ns.metadata.labels.clone())
            .unwrap_or_else(|| {
                BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), namespace.clone())])
            });
        policy.selects_namespace(&labels)
    }

    pub fn config(&self) -> &ImageConfig {
        &self.config
    }

    /// Hands the verifier its stores (once; a second call is ignored).
    pub fn set_stores(&self, stores: Stores) {
        let _ = self.stores.set(stores);
    }

    /// The policies governing `image` in `namespace`, by name.
    fn governing(&self, stores: &Stores, image: &str, namespace: &str) -> Vec<Arc<ImagePolicy>> {
        let labels = stores
            .namespaces
            .get(&ObjectRef::new(namespace))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
            .unwrap_or_default();
        let mut policies: Vec<_> = stores
            .policies
            .state()
            .into_iter()
            .filter(|p| p.governs(image, &labels))
            .collect();
        policies.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        policies
    }

    /// The step: adds `ImageVerified` and the images' status to `report`, and holds the
    /// pass (its outcome) when an image may not run. Nothing when no policy governs the
    /// AppService's images (the condition is then absent).
    pub async fn verify(&self, app: &Subject<'_>, live: &Live, report: &mut Report, now: &Time) {
        let Some(stores) = self.stores.get() else {
            return absent(report);
        };
        // At once when listed; only the first passes after a start wait, and not for a
        // CRD that is not installed.
        let deadline = tokio::time::Instant::now() + LIST_WAIT;
        let listed = loop {
            if stores.not_served.load(std::sync::atomic::Ordering::Relaxed) {
                return absent(report);
            }
            let poll = Duration::from_millis(200);
            match tokio::time::timeout(poll, stores.policies.wait_until_ready()).await {
                Ok(Ok(())) => break true,
                // The watch is gone (the controller is stopping): never listed.
                Ok(Err(_)) => break false,
                Err(_) if tokio::time::Instant::now() < deadline => {}
                Err(_) => break false,
            }
        };
        if !listed {
            report.conditions.push(ConditionReport {
                type_: common::conditions::IMAGE_VERIFIED,
                status: common::conditions::UNKNOWN,
                reason: common::conditions::reasons::IMAGE_POLICIES_LOADING,
                message: "the ImagePolicies are not listed yet".into(),
            });
            if matches!(report.outcome, Readiness::Done) {
                report.outcome =
                    Readiness::Failed(registry_error("the ImagePolicies are not listed yet"));
            }
            return;
        }
        let prior = app.status.as_ref();
        let stable = self
            .image(
                stores,
                app,
                &app.spec.image,
                prior.and_then(|s| s.image.as_ref()),
                live.image.as_deref(),
            )
            .await;
        let canary = match &app.spec.canary {
            Some(canary) => {
                self.image(
                    stores,
                    app,
                    &canary.image,
                    prior.and_then(|s| s.canary_image.as_ref()),
                    live.canary.as_deref(),
                )
                .await
            }
            None => None,
        };
        if stable.is_none() && canary.is_none() {
            return absent(report);
        }
        let verdicts: Vec<&Verdict> = [stable.as_ref(), canary.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        for v in &verdicts {
            self.metrics.verification(v.result);
        }
        let condition = verdict::condition(&verdicts);
        let holds = verdicts.iter().any(|v| v.holds());
        let transient = verdicts.iter().find_map(|v| v.transient());
        report.conditions.push(condition);
        // A hold rolls nothing new out: when no stable Deployment runs, the images that
        // verify are not started either (the held one's record, if any, brings it back).
        let ran = live.image.is_some();
        let hold = (holds || transient.is_some()).then(|| Hold {
            image: match &stable {
                Some(v) if v.blocks() => v.runs(),
                _ if !ran => None,
                Some(v) => v.runs(),
                None => Some(app.spec.image.clone()),
            },
            canary: app.spec.canary.as_ref().and_then(|c| match &canary {
                Some(v) if v.stops() => None,
                Some(v) => v.runs(),
                None => Some(c.image.clone()),
            }),
            stop: stable.as_ref().is_some_and(Verdict::stops),
        });
        let images = Images {
            image: stable.as_ref().and_then(|v| v.status(now)),
            canary_image: canary.as_ref().and_then(|v| v.status(now)),
            pins: Pins {
                image: stable.as_ref().and_then(|v| v.pin()),
                canary: canary.as_ref().and_then(|v| v.pin()),
            },
            recheck: Some(self.config.resolve_interval),
            hold,
        };
        report.images = Some(images);
        if !matches!(report.outcome, Readiness::Done) {
            return;
        }
        if holds {
            report.outcome = Readiness::NotReady(HOLD_RECHECK);
        } else if let Some(message) = transient {
            report.outcome = Readiness::Failed(registry_error(&message));
        }
    }

    /// The verdict on one image, or `None` when no policy governs it.
    async fn image(
        &self,
        stores: &Stores,
        app: &Subject<'_>,
        image: &str,
        prior: Option<&ImageStatus>,
        live: Option<&str>,
    ) -> Option<Verdict> {
        let policies = self.governing(stores, image, app.namespace());
        if policies.is_empty() {
            return None;
        }
        let mut keyed = Vec::with_capacity(policies.len());
        for policy in &policies {
            keyed.push(PolicyKeys {
                keys: self.keys(policy).await,
                policy: policy.clone(),
            });
        }
        let fetched = self.fetch(image, &keyed).await;
        Some(verdict::decide(image, &keyed, fetched, prior, live))
    }

    /// The digest and signature layers of `image`, from the caches or the registry.
    async fn fetch(&self, image: &str, keyed: &[PolicyKeys]) -> Fetched {
        let reference = match Target::parse(image) {
            Ok(r) => r,
            Err(e) => return Fetched::failed(None, e),
        };
        let auth = self.credentials(reference.registry()).await;
        let digest = match reference.digest() {
            Some(digest) => digest.to_owned(),
            None => {
                let resolve_interval = self.config.resolve_interval;
                let (registry, r, a) = (self.registry.clone(), reference.clone(), auth.clone());
                let got = self
                    .tags
                    .get(
                        &reference.whole(),
                        |age, v| match v {
                            Ok(_) => age < resolve_interval,
                            Err(_) => age < FAILURE_TTL,
                        },
                        move || async move { registry.resolve(&r, &a).await }.boxed(),
                    )
                    .await;
                self.metrics.lookup(ImageCache::Tags, got.hit);
                match got.value {
                    Ok(digest) => digest,
                    Err(e) => return Fetched::failed(None, e),
                }
            }
        };
        let verifies_all = |layers: &[SignatureLayer]| {
            keyed.iter().all(|p| match &p.keys {
                Ok(keys) => cosign::verify(&digest, layers, keys).is_ok(),
                Err(_) => true,
            })
        };
        let reverify_interval = self.config.reverify_interval;
        let (registry, r, a, d) = (
            self.registry.clone(),
            reference.clone(),
            auth,
            digest.clone(),
        );
        let got = self
            .signatures
            .get(
                &format!(
                    "{}/{}@{digest}",
                    reference.registry(),
                    reference.repository()
                ),
                |age, v| match v {
                    Ok(layers) => {
                        age < UNVERIFIED_TTL || (age < reverify_interval && verifies_all(layers))
                    }
                    Err(_) => age < FAILURE_TTL,
                },
                move || async move { registry.signatures(&r, &d, &a).await.map(Arc::new) }.boxed(),
            )
            .await;
        self.metrics.lookup(ImageCache::Signatures, got.hit);
        self.metrics.set_signature_entries(self.signatures.len());
        match got.value {
            Ok(layers) => Fetched::Signed { digest, layers },
            Err(e) => Fetched::failed(Some(digest), e),
        }
    }

    /// The credentials for `host` from the credentials Secret, if one is configured.
    async fn credentials(&self, host: &str) -> Auth {
        let Some(name) = self.config.registry_credentials_secret.clone() else {
            return Auth::Anonymous;
        };
        match self.secret(&name).await {
            Ok(Some(data)) => match data.get(".dockerconfigjson") {
                Some(json) => match Credentials::parse(&json.0) {
                    Ok(c) => c.for_host(host),
                    Err(e) => {
                        tracing::warn!(secret = %name, error = %e, "registry credentials Secret is malformed; pulling anonymously");
                        Auth::Anonymous
                    }
                },
                None => Auth::Anonymous,
            },
            _ => Auth::Anonymous,
        }
    }

    /// A Secret's data in the controller's namespace, read at most every [`SECRET_TTL`].
    async fn secret(&self, name: &str) -> Result<Secrets, String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.secret_namespace);
        let owned = name.to_owned();
        self.secrets
            .get(
                name,
                |age, _| age < SECRET_TTL,
                move || {
                    async move {
                        match api.get_opt(&owned).await {
                            Ok(secret) => Ok(secret.and_then(|s| s.data).map(Arc::new)),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                    .boxed()
                },
            )
            .await
            .value
    }

    /// The parsed keys of `policy`, or why it cannot be used.
    pub(crate) async fn keys(&self, policy: &ImagePolicy) -> Result<Vec<Key>, String> {
        if let Some(refusal) = common::image_policy::refusal(&policy.spec) {
            return Err(refusal);
        }
        let mut keys = Vec::with_capacity(policy.spec.keys.len());
        for key in &policy.spec.keys {
            keys.push(self.key(key).await?);
        }
        Ok(keys)
    }

    async fn key(&self, key: &PolicyKey) -> Result<Key, String> {
        let pem = match (&key.public_key, &key.secret_ref) {
            (Some(pem), _) => pem.clone(),
            (None, Some(r)) => {
                let data = self
                    .secret(&r.name)
                    .await
                    .map_err(|e| format!("key {}: reading Secret {}: {e}", key.name, r.name))?
                    .ok_or_else(|| {
                        format!(
                            "key {}: Secret {}/{} not found",
                            key.name, self.secret_namespace, r.name
                        )
                    })?;
                let bytes = data.get(r.key()).ok_or_else(|| {
                    format!(
                        "key {}: Secret {} has no key {:?}",
                        key.name,
                        r.name,
                        r.key()
                    )
                })?;
                String::from_utf8(bytes.0.clone())
                    .map_err(|_| format!("key {}: not UTF-8 PEM", key.name))?
            }
            (None, None) => return Err(format!("key {}: no publicKey nor secretRef", key.name)),
        };
        Key::from_pem(&key.name, &pem).map_err(|e| format!("key {}: {e}", key.name))
    }
}

/// No policy governs the AppService: the condition and the images' status go.
fn absent(report: &mut Report) {
    report.absent.push(common::conditions::IMAGE_VERIFIED);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_replace_only_the_images_they_name_and_never_the_spec_itself() {
        let app = common::testing::app("web", "registry.example.com/web:v1")
            .spec(|s| {
                s.canary = Some(common::CanarySpec {
                    image: "registry.example.com/web:v2".into(),
                    replicas: Some(1),
                })
            })
            .build();
        let stable = Pins {
            image: Some("registry.example.com/web:v1@sha256:aa".into()),
            canary: None,
        };
        let pinned = stable.apply(&app);
        assert_eq!(pinned.spec.image, "registry.example.com/web:v1@sha256:aa");
        assert_eq!(
            pinned.spec.canary.as_ref().map(|c| c.image.as_str()),
            Some("registry.example.com/web:v2")
        );
        let both = Pins {
            canary: Some("registry.example.com/web:v2@sha256:bb".into()),
            ..stable
        };
        let pinned = both.apply(&app);
        assert_eq!(
            pinned.spec.canary.as_ref().map(|c| c.image.as_str()),
            Some("registry.example.com/web:v2@sha256:bb")
        );
        assert_eq!(app.spec.image, "registry.example.com/web:v1");
        assert!(Pins::default().is_empty() && !both.is_empty());
    }

    #[test]
    fn a_hold_renders_what_ran_or_nothing_and_stops_when_told() {
        let app = common::testing::app("web", "registry.example.com/web:v2")
            .replicas(3)
            .spec(|s| {
                s.canary = Some(common::CanarySpec {
                    image: "registry.example.com/web:v3".into(),
                    replicas: Some(1),
                })
            })
            .build();
        let ran = "registry.example.com/web:v1@sha256:aa";
        let hold = Hold {
            image: Some(ran.into()),
            canary: None,
            stop: false,
        };
        let held = hold.apply(&app).expect("something ran");
        assert_eq!(held.spec.image, ran);
        assert!(held.spec.canary.is_none(), "no canary ran: none runs");
        assert_eq!(held.spec.replicas, Some(3));
        let stopped = Hold {
            stop: true,
            canary: Some("c".into()),
            ..hold.clone()
        }
        .apply(&app)
        .expect("something ran");
        assert_eq!(stopped.spec.replicas, Some(0));
        assert!(stopped.spec.canary.is_none());
        assert!(
            Hold {
                image: None,
                ..hold
            }
            .apply(&app)
            .is_none(),
            "nothing ran"
        );
        assert_eq!(
            app.spec.image, "registry.example.com/web:v2",
            "never the spec"
        );
    }
}
