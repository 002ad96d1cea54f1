//! The webhook's own CA, kept at run time (`--ca-secret`): the chart renders neither a
//! key nor a caBundle, so `helm template` gives the same output every time, and the
//! webhook keeps, in the background and never while answering a review:
//!
//! * the CA in a Secret of the release namespace ([`secret`]), created when absent;
//!   several replicas agree through the API server (create fails with 409 for all but
//!   one, every update carries the resourceVersion it read, a conflict starts the pass
//!   over), and a replica that saw the Secret restores it from memory if it is emptied;
//! * the caBundle of the webhook configurations and of the CRD's conversion webhook
//!   ([`targets`]) equal to the CAs the Secret says must be trusted;
//! * its serving certificate, issued in memory by the active CA (the key never leaves
//!   the process) and re-issued when the CA changes or at two thirds of its lifetime.
//!
//! Rotation overlaps (the rules are the pure [`plan`]): a next CA is trusted everywhere
//! before it signs, and the previous one stays trusted for an hour after. The replica is
//! ready only while its serving certificate's CA is in every caBundle.
//!
//! Each pass reads the Secret and the configurations fresh (no cache), so it acts on
//! what is stored, not on what a watch delivered earlier. Passes run when one of them
//! changes (metadata-only watches), when a rule falls due, and every five minutes.

pub mod plan;
pub mod secret;
pub mod targets;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::tls::{CertStore, TlsError};
use plan::{CaCert, CaKeyPair, CaState, Input, Step};
pub use targets::Target;

/// Longest time between two passes, whatever happens.
const RESYNC: Duration = Duration::from_secs(300);
/// Events come in bursts (our own writes among them): one pass for a burst.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Retry delays after a failed pass: from 1 s, doubling, to 30 s.
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why a pass of the CA manager failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{what}: {error}")]
    Kube { what: String, error: kube::Error },
    #[error("minting a certificate: {0}")]
    Certs(certs::Error),
    #[error("installing the serving certificate: {0}")]
    Tls(TlsError),
    #[error("encoding a caBundle patch: {0}")]
    Encode(String),
    #[error("a CA just minted does not read back: {0}")]
    Readback(String),
}

impl CaError {
    /// Someone else wrote the same object meanwhile: look again at once.
    fn is_conflict(&self) -> bool {
        matches!(self, CaError::Kube { error: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// What the CA manager needs to know.
#[derive(Clone, Debug)]
pub struct CaConfig {
    /// The CA Secret: name and namespace.
    pub secret: String,
    pub namespace: String,
    /// Subject alternative names of the serving certificate.
    pub sans: Vec<String>,
    /// Configurations whose caBundle is kept current.
    pub targets: Vec<Target>,
    /// Lifetime of a new CA.
    pub ca_validity: Duration,
}

/// What readiness reads: whether the serving certificate's CA is in every caBundle.
#[derive(Debug, Default)]
pub struct CaStatus {
    trusted: AtomicBool,
}

impl CaStatus {
    /// True while the API server can verify the certificate this replica serves.
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::SeqCst)
    }
}

/// Starts the manager; it runs until `shutdown` turns true. The certificate store stays
/// empty (and the replica not ready) until the first pass succeeds.
pub fn spawn(
    client: kube::Client,
    config: CaConfig,
    certs: Arc<CertStore>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> (Arc<CaStatus>, JoinHandle<()>) {
    let status = Arc::new(CaStatus::default());
    let wake = Arc::new(Notify::new());
    let mut watches = vec![watch_name(
        Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), &config.namespace),
        &config.secret,
        wake.clone(),
        shutdown.clone(),
    )];
    for target in &config.targets {
        watches.push(match target.kind {
            targets::Kind::Mutating => watch_name(
                Api::<PartialObjectMeta<MutatingWebhookConfiguration>>::all(client.clone()),
                &target.name,
                wake.clone(),
                shutdown.clone(),
            ),
            targets::Kind::Validating => watch_name(
                Api::<PartialObjectMeta<ValidatingWebhookConfiguration>>::all(client.clone()),
                &target.name,
                wake.clone(),
                shutdown.clone(),
            ),
            targets::Kind::Crd => watch_name(
                Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone()),
                &target.name,
                wake.clone(),
                shutdown.clone(),
            ),
        });
    }
    let manager = Manager {
        client,
        config,
        certs,
        metrics,
        status: status.clone(),
        memory: None,
        leaf: None,
    };
    let task = tokio::spawn(async move {
        manager.run(wake, shutdown).await;
        for watch in watches {
            let _ = watch.await;
        }
    });
    (status, task)
}

/// Wakes `wake` on every change of the object `name` (metadata only: the Secret's key
/// never travels on a watch).
fn watch_name<K>(
    api: Api<PartialObjectMeta<K>>,
    name: &str,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    tokio::spawn(async move {
        let events = watcher(api, config).default_backoff();
        let mut events = std::pin::pin!(events);
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                event = events.next() => match event {
                    Some(Ok(_)) => wake.notify_one(),
                    Some(Err(error)) => tracing::warn!(%error, object = %name, "CA manager watch failed; retrying"),
                    None => return,
                },
            }
        }
    })
}

/// The serving certificate this replica issued: its CA and validity.
struct Leaf {
    ca_der: Vec<u8>,
    not_before: i64,
    not_after: i64,
}

struct Manager {
    client: kube::Client,
    config: CaConfig,
    certs: Arc<CertStore>,
    metrics: Arc<Metrics>,
    status: Arc<CaStatus>,
    /// The last state this replica read or wrote: restores an emptied Secret.
    memory: Option<CaState>,
    leaf: Option<Leaf>,
}

impl Manager {
    async fn run(mut self, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = MIN_BACKOFF;
        loop {
            let delay = match self.pass().await {
                Ok(wake_at) => {
                    backoff = MIN_BACKOFF;
                    let now = jiff::Timestamp::now().as_second();
                    wake_at
                        .map(|t| Duration::from_secs(u64::try_from(t - now).unwrap_or(0) + 1))
                        .unwrap_or(RESYNC)
                        .min(RESYNC)
                }
                Err(error) if error.is_conflict() => {
                    tracing::debug!(%error, "CA manager: a concurrent write; looking again");
                    DEBOUNCE
                }
                Err(error) => {
                    self.metrics.ca_sync_failed();
                    tracing::warn!(%error, retry_in = ?backoff, "CA manager pass failed");
                    let delay = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    delay
                }
            };
            let woken = tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                () = wake.notified() => true,
                () = tokio::time::sleep(delay) => false,
            };
            if woken {
                tokio::select! {
                    _ = shutdown.wait_for(|stop| *stop) => return,
                    () = tokio::time::sleep(DEBOUNCE) => {}
                }
            }
        }
    }

    /// One pass: read, plan, write what differs, (re-)issue the serving certificate.
    /// Returns when the next rule falls due.
    async fn pass(&mut self) -> Result<Option<i64>, CaError> {
        let now = jiff::Timestamp::now().as_second();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let name = &self.config.secret;
        let live = secrets.get_opt(name).await.map_err(|error| CaError::Kube {
            what: format!("reading Secret {}/{name}", self.config.namespace),
            error,
        })?;
        let (stored, problems) = live
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .map(secret::decode)
            .unwrap_or_default();
        for problem in &problems {
            tracing::warn!(secret = %name, %problem, "CA Secret: a part is unusable and will be replaced");
        }
        let base = if stored.active.is_some() {
            stored
        } else {
            self.memory.clone().unwrap_or_default()
        };

        let mut observed = Vec::new();
        let mut bundles = Vec::new();
        for target in &self.config.targets {
            let seen = targets::read(&self.client, target).await?;
            for (entry, bundle) in seen.iter().flat_map(|s| &s.entries) {
                bundles.push(secret::parse_certs(bundle).unwrap_or_else(|problem| {
                    tracing::warn!(%target, entry = entry.as_deref().unwrap_or("conversion"), %problem, "a caBundle does not parse; it will be replaced");
                    Vec::new()
                }));
            }
            observed.push((target, seen));
        }

        let rotate_before = live
            .as_ref()
            .and_then(|s| secret::rotate_before(s.metadata.annotations.as_ref()));
        let validity = self.config.ca_validity;
        let planned = plan::plan(
            &Input {
                state: &base,
                bundles: &bundles,
                now,
                ca_validity: validity,
                rotate_before,
            },
            mint,
        )?;
        let data = secret::encode(&planned.state);
        if live.as_ref().and_then(|s| s.data.as_ref()) != Some(&data) {
            self.store(&secrets, live, data).await?;
        }
        self.memory = Some(planned.state.clone());
        self.report(&planned.steps);
        let Some(active) = planned.state.active.clone() else {
            return Ok(planned.wake_at);
        };
        self.metrics.ca_loaded(active.cert.not_after);

        let desired = planned.state.bundle_pem();
        let mut trusted = true;
        let mut failure = None;
        for (target, seen) in &observed {
            let Some(seen) = seen else { continue };
            if seen.entries.iter().all(|(_, b)| b == desired.as_bytes()) {
                continue;
            }
            if let Err(error) = targets::write(&self.client, target, seen, &desired).await {
                let had_it = seen.entries.iter().all(|(_, b)| {
                    secret::parse_certs(b)
                        .is_ok_and(|certs| certs.iter().any(|c| c.der == active.cert.der))
                });
                trusted &= had_it;
                failure.get_or_insert(error);
            } else {
                tracing::info!(%target, cas = planned.state.bundle().len(), "caBundle updated");
            }
        }
        self.serve_from(&active, now)?;
        self.status.trusted.store(trusted, Ordering::SeqCst);
        match failure {
            Some(error) => Err(error),
            None => Ok(planned.wake_at.into_iter().chain(self.leaf_due()).min()),
        }
    }

    /// Writes the Secret: created when absent, else updated from the version read.
    async fn store(
        &self,
        secrets: &Api<Secret>,
        live: Option<Secret>,
        data: std::collections::BTreeMap<String, k8s_openapi::ByteString>,
    ) -> Result<(), CaError> {
        let name = &self.config.secret;
        let what = |verb: &str| format!("{verb} Secret {}/{name}", self.config.namespace);
        match live {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    type_: Some("Opaque".to_owned()),
                    data: Some(data),
                    ..Secret::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|error| CaError::Kube {
                        what: what("creating"),
                        error,
                    })?;
            }
            Some(mut secret) => {
                secret.data = Some(data);
                secret.string_data = None;
                secrets
                    .replace(name, &PostParams::default(), &secret)
                    .await
                    .map_err(|error| CaError::Kube {
                        what: what("updating"),
                        error,
                    })?;
            }
        }
        Ok(())
    }

    fn report(&self, steps: &[Step]) {
        for step in steps {
            match step {
                Step::Created => tracing::info!(secret = %self.config.secret, "webhook CA created"),
                Step::NextCreated => tracing::info!(
                    secret = %self.config.secret,
                    delay = ?plan::PROPAGATION,
                    "next webhook CA added to the caBundles; it signs once every caBundle has carried it this long"
                ),
                Step::Promoted => {
                    self.metrics.ca_rotated();
                    tracing::info!(secret = %self.config.secret, kept = ?plan::RETENTION, "webhook CA rotated; the previous one stays trusted for a while");
                }
                Step::Dropped(n) => {
                    tracing::info!(secret = %self.config.secret, dropped = n, "retired webhook CAs removed from the caBundles");
                }
                Step::Adopted(n) => tracing::info!(
                    secret = %self.config.secret,
                    adopted = n,
                    kept = ?plan::RETENTION,
                    "CAs already in the caBundles stay trusted for a while"
                ),
            }
        }
    }

    /// When this replica's serving certificate falls due for renewal.
    fn leaf_due(&self) -> Option<i64> {
        self.leaf
            .as_ref()
            .map(|l| CaCert::renewal_due(l.not_before, l.not_after))
    }

    /// Serves a certificate from `active`, issuing a new one when the CA changed or the
    /// current one is due.
    fn serve_from(&mut self, active: &CaKeyPair, now: i64) -> Result<(), CaError> {
        let current = self.leaf.as_ref().is_some_and(|leaf| {
            leaf.ca_der == active.cert.der
                && now < CaCert::renewal_due(leaf.not_before, leaf.not_after)
        });
        if current {
            return Ok(());
        }
        let ca = certs::Ca::from_pem(&active.cert.pem, &active.key_pem).map_err(CaError::Certs)?;
        let (not_before, not_after) = plan::leaf_validity(&active.cert, now);
        let leaf = ca
            .serving_cert_for(
                &self.config.sans,
                certs::Validity {
                    not_before,
                    not_after,
                },
            )
            .map_err(CaError::Certs)?;
        self.certs
            .install(&leaf.cert_pem, &leaf.key_pem)
            .map_err(CaError::Tls)?;
        tracing::info!(not_after, "serving certificate issued by the webhook CA");
        self.leaf = Some(Leaf {
            ca_der: active.cert.der.clone(),
            not_before,
            not_after,
        });
        Ok(())
    }
}

/// A new CA for `[not_before, not_after]`.
fn mint(not_before: i64, not_after: i64) -> Result<CaKeyPair, CaError> {
    let name = format!(
        "appservice-operator webhook CA {}",
        jiff::Timestamp::from_second(not_before)
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default()
    );
    let ca = certs::Ca::with_period(
        &name,
        certs::Validity {
            not_before,
            not_after,
        },
    )
    .map_err(CaError::Certs)?;
    let pair = secret::key_pair(ca.cert_pem().as_bytes(), ca.key_pem().as_bytes())
        .map_err(CaError::Readback)?;
    Ok(pair)
}
