//! Sharding (`--sharding`): the AppServices are divided among the controller replicas.
//!
//! | part | holds |
//! | --- | --- |
//! | [`buckets`] | the 64 namespace hash buckets, and which live member each belongs to |
//! | [`claims`] | the buckets this member serves, agreed through the ring's Leases |
//! | [`served`] | the served buckets: the gate, the write check, the watches that follow them |
//! | [`ring`] | the pure assignment: rendezvous hashing over the live members |
//! | [`liveness`] | which members are live, from their Leases on this process's clock |
//! | [`fence`] | the check before every write: this member's Lease is current |
//! | [`metrics`] | `appservice_controller_shard_*`, registered by [`crate::metrics::Metrics`] |
//! | [`namespaces`] | `--namespace-selector`: the namespaces a ring owns (a canary release) |
//! | [`rings`] | which namespaces a ring may serve beside the other rings, agreed through their Leases |
//! | `peer_rings` | the other rings' Leases and the Namespaces as a member sees them; the claims task's step between rings |
//! | here | the membership Lease, the gate of each pass |
//!
//! Each replica holds a membership Lease `<ring>-shard-<identity>` (labelled
//! `platform.example.com/shard-ring: <ring>`), renewed by [`crate::leader::Elector`] with
//! the same rules as the leader Lease. It claims in that Lease the namespace buckets the
//! ring's live members assign it ([`claims`]), and serves those: its passes, its writes
//! and its caches. Alone, it serves every bucket; that is not a mode, the same rules hold
//! with one member as with N. Nothing is written on the objects. With `--sharded-watch`
//! the API server filters each watch by the buckets; without, the member filters them.
//! Beside the buckets, each ring serves only the namespaces its selector
//! (`--namespace-selector`, a canary release) gives it and no other live ring's does
//! ([`rings`]). Off (the default), none of this runs and the controller is the single
//! leader it always was.

pub mod buckets;
pub mod claims;
pub mod fence;
pub mod liveness;
pub mod metrics;
pub mod namespaces;
mod peer_rings;
pub mod ring;
pub mod rings;
pub mod served;

use std::collections::BTreeMap;

use common::AppService;
use common::names::{LABEL_SHARD_RING, shard_lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::info;

pub use fence::{Fence, fenced};
pub use metrics::{Direction, ShardMetrics};
pub use namespaces::is_label_value;

use crate::config::Config;
use crate::context::Context;
use crate::queue::Next;

/// What [`gate`] says about a pass.
pub enum Gate {
    /// Not this shard's to reconcile now.
    Stop(Next),
    /// Go on.
    Go,
}

/// Before a pass: it runs only for a namespace this member serves (its bucket claimed,
/// the namespace admitted beside the other rings) and whose objects every cache has
/// listed. Labels on the object mean nothing, and the claims task lets a bucket or a
/// namespace go only between writes, so there is nothing to acknowledge.
pub fn gate(app: &AppService, ctx: &Context) -> Gate {
    let namespace = app.namespace().unwrap_or_default();
    match ctx.served() {
        Some(served) if !served.usable(&namespace) => Gate::Stop(Next::await_change()),
        _ => Gate::Go,
    }
}

/// The membership Lease of this shard, renewed until `stop`; `member` is true while it is
/// current, and each renewal opens `fence`.
pub fn start_membership(
    config: &Config,
    client: &kube::Client,
    identity: &str,
    fence: Fence,
    annotations: Option<crate::leader::Annotations>,
    member: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &config.lease_namespace);
    let lease_name = shard_lease_name(&config.shard_ring, identity);
    let elector = crate::leader::Elector::new(
        lease_api,
        crate::leader::ElectionConfig {
            lease_name: lease_name.clone(),
            identity: identity.to_owned(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
        },
    )
    .with_fence(fence);
    let elector = match annotations {
        Some(a) => elector.with_annotations(a),
        None => elector,
    };
    let elector = elector.with_labels(BTreeMap::from([(
        LABEL_SHARD_RING.to_owned(),
        config.shard_ring.clone(),
    )]));
    info!(identity = %identity, lease = %lease_name, ring = %config.shard_ring, "sharding enabled: joining the ring");
    tokio::spawn(elector.run(member, stop))
}

/// Completes when this shard's membership, once held, lapses: the process must stop
/// (its fence is shut for good). Never completes without sharding.
pub async fn lapsed(mut member: watch::Receiver<bool>) {
    if member.wait_for(|m| *m).await.is_err() || member.wait_for(|m| !*m).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Keeps `shard_objects` on the size of this shard's AppService cache, and counts the
/// AppServices that enter it after its initial list (`shard_handovers{direction="in"}`:
/// handed over to this shard, or new).
pub fn follow_owned(
    ctx: std::sync::Arc<Context>,
    apps: kube::runtime::reflector::Store<AppService>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut known: Option<std::collections::HashSet<ObjectRef<AppService>>> = None;
        // A new generation of watches (the served buckets changed) lists everything
        // again: a new baseline, not handovers one by one.
        let generation = || ctx.served().map(|s| s.listed_generation());
        let mut listed = generation();
        loop {
            if generation() != listed {
                listed = generation();
                known = None;
            }
            let now: std::collections::HashSet<_> = apps
                .state()
                .iter()
                .map(|a| ObjectRef::from_obj(&**a))
                .collect();
            ctx.metrics().shard().set_objects(now.len());
            if let Some(before) = &known {
                for _ in now.difference(before) {
                    ctx.metrics().shard().handover(Direction::In);
                }
            }
            if ctx.is_ready() {
                known = Some(now);
            }
            tokio::select! {
                _ = tokio::time::sleep(ctx.config().retry_period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_must_be_label_values() {
        assert!(is_label_value("appservice-controller-7d9f8-abcde"));
        assert!(is_label_value("host-1234"));
        for bad in ["", "-a", "a-", "a/b", "a b", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }
}
