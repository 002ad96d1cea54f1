//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go does it.
//!
//! * A candidate takes the Lease when it has no holder, or when the holder's record has
//!   not changed for `lease_duration` as measured on the candidate's own clock (so clock
//!   skew between machines does not matter). Writes carry the resourceVersion they read,
//!   so two candidates can never both win.
//! * The leader renews every `retry_period`; if it could not renew for `renew_deadline`
//!   (shorter than the lease duration) it steps down before anyone else may take over.
//! * On shutdown the leader releases the Lease (empty holder, 1s duration), so a standby
//!   takes over on its next poll instead of waiting out the lease.
//!
//! kube-lease-manager was considered: its standby sleeps until the old lease would have
//! expired, so a released lease is not taken over promptly, and a leader whose renewals
//! fail keeps reporting leadership past expiry. Both matter here, hence this module.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::is_not_found;
use crate::fence::Fence;

#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What a candidate remembers of the last Lease record it saw.
#[derive(Clone, Debug)]
struct Observed {
    holder: Option<String>,
    resource_version: Option<String>,
    renew_time: Option<MicroTime>,
    duration: Duration,
    /// Local time at which the record was last seen to change.
    since: Instant,
}

/// Outcome of one acquire-or-renew attempt.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Leading,
    Following(Option<String>),
}

pub struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    observed: Option<Observed>,
    /// Opened by each successful renewal (a shard's membership Lease, the crate `controller_sharding`).
    fence: Option<Fence>,
    /// Labels of a Lease this candidate creates.
    labels: Option<std::collections::BTreeMap<String, String>>,
    annotations: Option<Annotations>,
}

/// Annotations the Lease carries, set by another task: each acquire or renewal writes
/// the latest `wanted`, and afterwards `written` holds what it wrote.
pub struct Annotations {
    pub wanted: watch::Receiver<std::collections::BTreeMap<String, String>>,
    pub written: watch::Sender<std::collections::BTreeMap<String, String>>,
}

impl Elector {
    pub fn new(api: Api<Lease>, config: ElectionConfig) -> Self {
        Elector {
            api,
            config,
            observed: None,
            fence: None,
            labels: None,
            annotations: None,
        }
    }

    /// Each successful acquire or renew opens `fence` until the renew deadline, counted
    /// from when that request was sent.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The Lease, when this candidate creates it, carries `labels`.
    pub fn with_labels(mut self, labels: std::collections::BTreeMap<String, String>) -> Self {
        self.labels = Some(labels);
        self
    }

    /// Runs the election until `shutdown` turns true, publishing leadership on `leading`.
    /// Releases the Lease on shutdown when leading. Returns only on shutdown.
    /// The Lease carries `annotations` (see [`Annotations`]); a change of the wanted ones
    /// is written at once rather than at the next renewal.
    pub fn with_annotations(mut self, annotations: Annotations) -> Self {
        self.annotations = Some(annotations);
        self
    }

    fn wanted_annotations(&mut self) -> Option<std::collections::BTreeMap<String, String>> {
        self.annotations
            .as_mut()
            .map(|a| a.wanted.borrow_and_update().clone())
    }

    pub async fn run(mut self, leading: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        let id = self.config.identity.clone();
        let mut last_renew: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            // A leader past its renew deadline (its renewals failed, or the process was
            // frozen) steps down before it writes again. A fenced member's lapse is for
            // good: it never writes its Lease again, because the other members may have
            // taken its objects meanwhile without writing this Lease, so a renewal now
            // would claim them a second time; the process stops (`share::lapsed`) and a
            // fresh one joins.
            let lapsed = self.fence_lapsed();
            self.step_down_past_deadline(&leading, last_renew, lapsed);
            if lapsed {
                break;
            }
            let is_leader = *leading.borrow();
            // A request must not outlive the renew deadline: a leader that cannot
            // confirm its lease in time steps down.
            let budget = match (is_leader, last_renew) {
                (true, Some(t)) => self.config.renew_deadline.saturating_sub(t.elapsed()),
                _ => self.config.renew_deadline,
            };
            let sent = Instant::now();
            let annotations = self.wanted_annotations();
            let attempt =
                tokio::time::timeout(budget, self.try_acquire_or_renew(annotations.as_ref())).await;
            match attempt {
                Ok(Ok(Attempt::Leading)) => {
                    if let (Some(a), Some(sent)) = (&self.annotations, annotations) {
                        a.written.send_replace(sent);
                    }
                    last_renew = Some(Instant::now());
                    if let Some(fence) = &self.fence {
                        fence.renewed(sent, self.config.renew_deadline, Instant::now());
                    }
                    if !is_leader {
                        info!(identity = %id, lease = %self.config.lease_name, "acquired leadership");
                        leading.send_replace(true);
                    }
                }
                Ok(Ok(Attempt::Following(holder))) => {
                    if is_leader {
                        warn!(identity = %id, holder = ?holder, "lost leadership: lease taken over");
                        leading.send_replace(false);
                    }
                }
                Ok(Err(e)) => {
                    warn!(identity = %id, error = %e, "lease request failed");
                }
                Err(_) => warn!(identity = %id, "lease request timed out"),
            }
            self.step_down_past_deadline(&leading, last_renew, self.fence_lapsed());
            let pause = jittered(self.config.retry_period, !*leading.borrow());
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
                _ = async {
                    match self.annotations.as_mut() {
                        Some(a) => {
                            if a.wanted.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
        if *leading.borrow() {
            leading.send_replace(false);
            match tokio::time::timeout(self.config.renew_deadline, self.release()).await {
                Ok(Ok(())) => info!(identity = %id, "released the leader lease"),
                Ok(Err(e)) => {
                    warn!(identity = %id, error = %e, "could not release the leader lease")
                }
                Err(_) => warn!(identity = %id, "timed out releasing the leader lease"),
            }
        }
    }

    /// Whether this member's fence (if any) has lapsed for good.
    fn fence_lapsed(&self) -> bool {
        self.fence.as_ref().is_some_and(Fence::lapsed)
    }

    /// A leader whose last renewal is older than the renew deadline, or whose fence
    /// lapsed (`fence_lapsed`, read once by the caller, which acts on the same reading),
    /// steps down.
    fn step_down_past_deadline(
        &self,
        leading: &watch::Sender<bool>,
        last_renew: Option<Instant>,
        fence_lapsed: bool,
    ) {
        if *leading.borrow()
            && (fence_lapsed
                || last_renew.is_none_or(|t| t.elapsed() >= self.config.renew_deadline))
        {
            warn!(identity = %self.config.identity, "lost leadership: could not renew within the renew deadline");
            leading.send_replace(false);
        }
    }

    async fn try_acquire_or_renew(
        &mut self,
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<Attempt, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let id = self.config.identity.clone();
        let duration_secs =
            i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(15);
        let lease = match self.api.get(&self.config.lease_name).await {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => {
                if self.fence_lapsed() {
                    return Ok(Attempt::Following(None));
                }
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.lease_name.clone()),
                        labels: self.labels.clone(),
                        annotations: annotations.cloned(),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(id.clone()),
                        lease_duration_seconds: Some(duration_secs),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Attempt::Leading),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following(None)),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record_duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        );
        let changed = self.observed.as_ref().is_none_or(|o| {
            o.holder != holder
                || o.renew_time != spec.renew_time
                || o.resource_version != lease.metadata.resource_version
        });
        if changed {
            self.observed = Some(Observed {
                holder: holder.clone(),
                resource_version: lease.metadata.resource_version.clone(),
                renew_time: spec.renew_time.clone(),
                duration: record_duration,
                since: Instant::now(),
            });
        }
        let held_by_us = holder.as_deref() == Some(id.as_str());
        if let (Some(other), false) = (&holder, held_by_us) {
            let expired = self
                .observed
                .as_ref()
                .is_some_and(|o| o.since.elapsed() >= o.duration);
            if !expired {
                return Ok(Attempt::Following(Some(other.clone())));
            }
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(id);
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(now.clone());
        if !held_by_us {
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        // The last moment to refuse: a fenced member whose fence lapsed while this
        // attempt waited for the read must not write.
        if self.fence_lapsed() {
            return Ok(Attempt::Following(holder));
        }
        let mut updated = lease;
        if let Some(wanted) = annotations {
            updated
                .metadata
                .annotations
                .get_or_insert_default()
                .extend(wanted.clone());
        }
        updated.spec = Some(new_spec);
        // `replace` sends the resourceVersion we read: if anyone wrote in between, 409.
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following(holder)),
            Err(e) => Err(e),
        }
    }

    async fn release(&self) -> Result<(), kube::Error> {
        let mut lease = self.api.get(&self.config.lease_name).await?;
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        self.api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

/// Standbys poll with jitter so several of them do not race in lockstep.
fn jittered(period: Duration, jitter: bool) -> Duration {
    if jitter {
        period.mul_f64(1.0 + rand::random::<f64>() * 0.2)
    } else {
        period
    }
}
