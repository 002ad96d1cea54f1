//! Which namespace buckets this member serves, agreed with the other members of its ring
//! through their Leases alone. A member alone serves all 64; the same rules with one
//! member.
//!
//! Each member's Lease carries the buckets it claims ([`ANNOTATION`], written by its own
//! renewals). The ring of live members ([`super::buckets::assigned`]) says which buckets
//! each should serve; a member
//!
//! * **lets go** of a bucket the ring gives to another at once: [`Served::release`] shuts
//!   its writes and waits for those in flight, then the claim leaves the Lease;
//! * **takes** a bucket the ring gives it only once no live member claims it: it writes
//!   the claim, then reads every member's Lease again (a quorum read, so it sees any claim
//!   written before its own), and serves only the buckets nobody else claimed. Of two
//!   members claiming at once the later always sees the earlier and withdraws.
//!
//! A member is live while its Lease has a holder and its record changed within the lease
//! duration on this process's clock (as the leader election counts it); the claims of a
//! dead member are void, because its fence (`controller_core::fence`) shut its writes before that.
//! So a bucket is written by at most one member at a time; what it rests on is the fence's
//! condition, `lease duration > renew deadline + the longest a request takes`.
//!
//! The same task follows the other rings ([`super::rings`], `super::peer_rings`): each turn it lets go of the
//! namespaces its ring may no longer serve, says in the Lease what it has seen, and takes
//! the namespaces it may newly serve after a quorum read of every ring's Leases.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::names::LABEL_SHARD_RING;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::runtime::reflector;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::buckets::{Buckets, assigned};
use super::liveness::{Liveness, Observed};
use super::peer_rings::{Parts, Rings};
use super::ring::Ring;
use super::rings;
use super::served::Served;
use controller_core::context::Context;

/// The annotation of a member's Lease that lists the buckets it claims
/// ([`Buckets::to_hex`]).
pub const ANNOTATION: &str = "shard.platform.example.com/buckets";

/// The annotations a member's Lease carries when it claims `buckets`.
pub fn annotations(buckets: Buckets) -> BTreeMap<String, String> {
    BTreeMap::from([(ANNOTATION.to_owned(), buckets.to_hex())])
}

/// The other members of the ring, from their Leases: what each claims, and whether it is
/// live.
#[derive(Debug, Default)]
struct Peers {
    leases: Liveness<Buckets>,
}

impl Peers {
    fn observe(&mut self, leases: &[Arc<Lease>], ours: &str, now: Instant) {
        let others = leases
            .iter()
            .filter(|l| l.name_any() != ours)
            .map(|l| Observed {
                key: l.name_any(),
                holder: l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                version: l.resource_version(),
                said: claims_of(l),
            });
        self.leases.observe(others, now);
    }

    /// A quorum read of the ring's Leases (a list, not the watch's cache: it holds every
    /// record written before it), observed now; the live members and what they claim.
    async fn reread(
        &mut self,
        api: &Api<Lease>,
        selector: &str,
        ours: &str,
        lease_duration: Duration,
    ) -> Result<Vec<(&str, Buckets)>, kube::Error> {
        let list = api.list(&ListParams::default().labels(selector)).await?;
        let fresh: Vec<Arc<Lease>> = list.items.into_iter().map(Arc::new).collect();
        let now = Instant::now();
        self.observe(&fresh, ours, now);
        Ok(self.live(lease_duration, now))
    }

    /// The live members and what they claim.
    fn live(&self, lease_duration: Duration, now: Instant) -> Vec<(&str, Buckets)> {
        self.leases
            .live(lease_duration, now)
            .into_iter()
            .map(|(id, claims)| (id, *claims))
            .collect()
    }
}

/// The buckets a Lease claims. One that cannot be read claims every bucket: a member that
/// does not say what it serves must be assumed to serve everything.
pub(crate) fn claims_of(lease: &Lease) -> Buckets {
    match lease.annotations().get(ANNOTATION) {
        None => Buckets::NONE,
        Some(v) => Buckets::from_hex(v).unwrap_or_else(|| {
            warn!(lease = %lease.name_any(), value = %v, "unreadable bucket claim: taken as a claim on every bucket");
            (0..super::buckets::BUCKETS).fold(Buckets::NONE, Buckets::with)
        }),
    }
}

/// What the claims task needs.
pub struct Claims {
    pub ctx: Arc<Context>,
    pub lease_client: kube::Client,
    pub identity: String,
    pub served: Arc<Served>,
    /// This shard's AppServices (to count those a release hands over).
    pub apps: reflector::Store<common::AppService>,
    /// The annotations this member's Lease should carry, and what its last renewal wrote.
    pub wanted: watch::Sender<BTreeMap<String, String>>,
    pub written: watch::Receiver<BTreeMap<String, String>>,
    pub member: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
}

/// The annotations a member's Lease carries at first: no bucket claimed, its ring's
/// selector, nothing seen.
pub fn initial(config: &controller_core::config::Config) -> BTreeMap<String, String> {
    let mut a = annotations(Buckets::NONE);
    a.extend(rings::annotations(config.namespace_selector.as_ref(), 0));
    a
}

impl Claims {
    /// Follows the ring, and the other rings, until `stop`.
    pub async fn run(mut self) {
        let config = self.ctx.config().clone();
        let api: Api<Lease> = Api::namespaced(self.lease_client.clone(), &config.lease_namespace);
        let selector = format!("{LABEL_SHARD_RING}={}", config.shard_ring);
        let ours = common::names::shard_lease_name(&config.shard_ring, &self.identity);
        let (mut rings, mut events) = Rings::follow(&self.lease_client, &config);
        let mut peers = Peers::default();
        // What this member's Lease was last seen to carry (`None`: not known).
        let mut published: Option<Buckets> = None;
        loop {
            tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(config.retry_period) => {}
                event = events.next() => {
                    // Everything that arrived together is one turn (a burst of
                    // Namespace events is not a turn each).
                    let mut next = Some(event);
                    while let Some(event) = next {
                        if let Some(Some(e)) = event {
                            warn!(error = %e, "watching the rings' Leases or the Namespaces");
                        }
                        next = events.next().now_or_never();
                    }
                }
            }
            if !*self.member.borrow() || !rings.ready() {
                continue;
            }
            let now = Instant::now();
            let own = rings.observe(&config, now);
            peers.observe(&own, &ours, now);
            let parts = Parts {
                ctx: &self.ctx,
                served: &self.served,
                apps: &self.apps,
                wanted: &self.wanted,
                lease_client: &self.lease_client,
            };
            rings.step(&parts, &config, now).await;

            let live = peers.live(config.lease_duration, now);
            let ring = Ring::new(
                live.iter()
                    .map(|(id, _)| *id)
                    .chain([self.identity.as_str()]),
            );
            crate::shard_metrics(&self.ctx).set_members(ring.len());
            let others = live.iter().fold(Buckets::NONE, |a, (_, b)| a.union(*b));
            let desired = assigned(&ring, &self.identity);

            let lose = self.served.allowed().minus(desired);
            if !lose.is_empty() {
                info!(
                    buckets = lose.len(),
                    "letting buckets go: the ring gave them to another member"
                );
                self.served.release(lose).await;
                crate::handed_over(&self.ctx, &self.apps, |ns| lose.contains_namespace(ns));
            }
            // The Lease says what we serve: after a release, after a contested claim was
            // withdrawn, or after a write of the claims that did not go through.
            let serving = self.served.allowed();
            if published != Some(serving) {
                published = self
                    .publish(serving, &rings, &config)
                    .await
                    .then_some(serving);
                if published.is_none() {
                    continue;
                }
            }
            let take = desired.minus(serving).minus(others);
            if take.is_empty() {
                continue;
            }
            let claim = serving.union(take);
            published = self.publish(claim, &rings, &config).await.then_some(claim);
            if published.is_none() {
                continue;
            }
            // A quorum read of every claim written before ours.
            let contested = match peers
                .reread(&api, &selector, &ours, config.lease_duration)
                .await
            {
                Ok(live) => live.iter().fold(Buckets::NONE, |a, (_, b)| a.union(*b)),
                Err(e) => {
                    warn!(error = %e, "reading the ring's Leases after a claim; not taking the buckets yet");
                    continue;
                }
            };
            let won = take.minus(contested);
            if won != take {
                info!(
                    buckets = take.minus(won).len(),
                    "another member claimed the same buckets at the same time; withdrawing"
                );
            }
            if !won.is_empty() {
                info!(
                    buckets = won.len(),
                    serving = serving.union(won).len(),
                    "taking buckets no live member claims"
                );
                self.served.acquire(won);
            }
        }
    }

    /// Writes `claims` into this member's Lease and waits for a renewal that carried them
    /// (at most the renew deadline: past it the fence has lapsed anyway).
    async fn publish(
        &mut self,
        claims: Buckets,
        rings: &Rings,
        config: &controller_core::config::Config,
    ) -> bool {
        let mut wanted = annotations(claims);
        wanted.extend(rings::annotations(
            config.namespace_selector.as_ref(),
            rings.seen,
        ));
        self.wanted.send_replace(wanted.clone());
        let written = tokio::time::timeout(
            config.renew_deadline,
            self.written.wait_for(|w| *w == wanted),
        )
        .await;
        matches!(written, Ok(Ok(_)))
    }
}

use futures::FutureExt as _;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn lease(name: &str, holder: Option<&str>, claims: Option<&str>, rv: &str) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                annotations: claims
                    .map(|c| BTreeMap::from([(ANNOTATION.to_owned(), c.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                ..LeaseSpec::default()
            }),
        })
    }

    #[test]
    fn peers_are_the_other_live_members_with_their_claims() {
        let d = Duration::from_secs(15);
        let t0 = Instant::now();
        let mut peers = Peers::default();
        let b = lease("r-shard-b", Some("b"), Some("0000000000000003"), "1");
        let ours = lease("r-shard-a", Some("a"), None, "1");
        peers.observe(&[b.clone(), ours], "r-shard-a", t0);
        assert_eq!(
            peers.live(d, t0 + Duration::from_secs(14)),
            vec![("b", Buckets::NONE.with(0).with(1))],
            "ours is not a peer"
        );
        peers.observe(
            std::slice::from_ref(&b),
            "r-shard-a",
            t0 + Duration::from_secs(10),
        );
        assert!(
            peers.live(d, t0 + Duration::from_secs(15)).is_empty(),
            "dead: its claims void"
        );
    }

    #[test]
    fn an_unreadable_claim_claims_every_bucket() {
        let l = lease("x", Some("x"), Some("not-hex"), "1");
        assert_eq!(claims_of(&l).len(), super::super::buckets::BUCKETS);
        assert_eq!(claims_of(&lease("x", Some("x"), None, "1")), Buckets::NONE);
    }
}
