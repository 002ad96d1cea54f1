//! Sharding (`--sharding`): the AppServices are divided among the controller replicas.
//! This crate implements the core's seam [`controller_core::share::Share`] with
//! [`served::Served`], and depends on the core, never the reverse.
//!
//! | part | holds |
//! | --- | --- |
//! | [`buckets`] | the 64 namespace hash buckets, and which live member each belongs to |
//! | [`claims`] | the buckets this member serves, agreed through the ring's Leases |
//! | [`served`] | what this member serves: the gate, the write check, what the watches select |
//! | [`ring`] | the pure assignment: rendezvous hashing over the live members |
//! | [`liveness`] | which members are live, from their Leases on this process's clock |
//! | [`metrics`] | `appservice_controller_shard_*`, registered through the core's `Metrics::families` |
//! | [`rings`] | which namespaces a ring may serve beside the other rings, agreed through their Leases |
//! | `peer_rings` | the other rings' Leases and the Namespaces as a member sees them; the claims task's step between rings |
//! | here | the [`Share`] and [`Ringed`] of [`Served`], the membership Lease |
//!
//! Each replica holds a membership Lease `<ring>-shard-<identity>` (labelled
//! `platform.example.com/shard-ring: <ring>`), renewed by the core's
//! [`controller_core::leader::Elector`] with the same rules as the leader Lease; each
//! renewal opens its fence ([`controller_core::fence`]). It claims in that Lease the
//! namespace buckets the ring's live members assign it ([`claims`]), and serves those:
//! its passes, its writes and its caches. Alone, it serves every bucket; that is not a
//! mode, the same rules hold with one member as with N. Nothing is written on the
//! objects. With `--sharded-watch` the API server filters each watch by the buckets;
//! without, the member filters them. Beside the buckets, each ring serves only the
//! namespaces its selector (`--namespace-selector`, a canary release) gives it and no
//! other live ring's does ([`rings`]).

pub mod buckets;
pub mod claims;
pub mod liveness;
pub mod metrics;
mod peer_rings;
pub mod ring;
pub mod rings;
pub mod served;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::AppService;
use common::names::{LABEL_SHARD_RING, shard_lease_name};
use controller_core::config::Config;
use controller_core::context::Context;
use controller_core::fence::Fence;
use controller_core::ring::{Following, Ring, Ringed};
use controller_core::share::{Scope, Share};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::info;

pub use metrics::{Direction, ShardMetrics};
pub use served::Served;

impl Share for Served {
    fn serves(&self, namespace: &str) -> bool {
        self.usable(namespace)
    }

    fn bound(self: Arc<Self>, client: kube::Client, own: &str) -> kube::Client {
        served::bounded(client, self, own)
    }

    fn scope(&self) -> watch::Receiver<Scope> {
        self.subscribe_scope()
    }

    fn register(&self, cache: &'static str) {
        Served::register(self, cache);
    }

    fn listed(&self, cache: &'static str, generation: u64) {
        self.synced(cache, generation);
    }

    fn gained(&self) -> BoxStream<'static, ()> {
        served::gained(self.subscribe_usable()).boxed()
    }
}

impl Ringed for Served {
    fn start(self: Arc<Self>, ring: Ring) -> Following {
        let config = ring.ctx.config().clone();
        if config.namespace_selector.is_some() && config.peer_lease_namespaces.is_empty() {
            tracing::warn!(
                lease_namespace = %config.lease_namespace,
                "--namespace-selector without --peer-lease-namespaces: only the rings whose Leases are in the lease namespace are seen; a release elsewhere would write the namespaces handed over to it at the same time (name its namespace, or '*')"
            );
        }
        // The Lease carries this member's claims and what it says to the other rings;
        // the claims task follows both.
        let (wanted, written) = (
            watch::channel(claims::initial(&config)).0,
            watch::channel(BTreeMap::new()).0,
        );
        let annotations = controller_core::leader::Annotations {
            wanted: wanted.subscribe(),
            written: written.clone(),
        };
        let member = ring.member.subscribe();
        let membership = start_membership(
            &config,
            &ring.lease_client,
            &ring.identity,
            ring.fence,
            annotations,
            ring.member,
            ring.membership_stop,
        );
        follow_owned(
            ring.ctx.clone(),
            self.clone(),
            ring.apps.clone(),
            ring.stop.clone(),
        );
        let claims = claims::Claims {
            ctx: ring.ctx,
            lease_client: ring.lease_client,
            identity: ring.identity,
            served: self,
            apps: ring.apps,
            wanted,
            written: written.subscribe(),
            member,
            stop: ring.stop,
        };
        Following {
            membership,
            ring: tokio::spawn(claims.run()),
        }
    }
}

/// The membership Lease of this shard, renewed until `stop`; `member` is true while it is
/// current, and each renewal opens `fence`.
fn start_membership(
    config: &Config,
    client: &kube::Client,
    identity: &str,
    fence: Fence,
    annotations: controller_core::leader::Annotations,
    member: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &config.lease_namespace);
    let lease_name = shard_lease_name(&config.shard_ring, identity);
    let elector = controller_core::leader::Elector::new(
        lease_api,
        controller_core::leader::ElectionConfig {
            lease_name: lease_name.clone(),
            identity: identity.to_owned(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
        },
    )
    .with_fence(fence)
    .with_annotations(annotations);
    let elector = elector.with_labels(BTreeMap::from([(
        LABEL_SHARD_RING.to_owned(),
        config.shard_ring.clone(),
    )]));
    info!(identity = %identity, lease = %lease_name, ring = %config.shard_ring, "sharding enabled: joining the ring");
    tokio::spawn(elector.run(member, stop))
}

/// Keeps `shard_objects` on the size of this shard's AppService cache, and counts the
/// AppServices that enter it after its initial list (`shard_handovers{direction="in"}`:
/// handed over to this shard, or new).
fn follow_owned(
    ctx: Arc<Context>,
    served: Arc<Served>,
    apps: kube::runtime::reflector::Store<AppService>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut known: Option<std::collections::HashSet<ObjectRef<AppService>>> = None;
        // A new generation of watches (the served buckets changed) lists everything
        // again: a new baseline, not handovers one by one.
        let generation = || served.listed_generation();
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
            shard_metrics(&ctx).set_objects(now.len());
            if let Some(before) = &known {
                for _ in now.difference(before) {
                    shard_metrics(&ctx).handover(Direction::In);
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

/// This crate's metric families, registered once per `Metrics`.
pub(crate) fn shard_metrics(ctx: &Context) -> ShardMetrics {
    ctx.metrics().families::<ShardMetrics>()
}

/// Counts the AppServices in what was just let go (`gone` says which namespaces) as
/// handed over.
pub(crate) fn handed_over(
    ctx: &Context,
    apps: &kube::runtime::reflector::Store<AppService>,
    gone: impl Fn(&str) -> bool,
) {
    let handed = apps
        .state()
        .iter()
        .filter(|a| gone(&a.namespace().unwrap_or_default()))
        .count();
    let metrics = shard_metrics(ctx);
    for _ in 0..handed {
        metrics.handover(Direction::Out);
    }
}
