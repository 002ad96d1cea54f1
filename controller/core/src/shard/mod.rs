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
//! | [`sharder`] | a canary ring's (`--namespace-selector`) label protocol, run by its leader |
//! | here | the membership Lease, the gate of each pass, the label on a canary ring's children |
//!
//! Each replica holds a membership Lease `<ring>-shard-<identity>` (labelled
//! `platform.example.com/shard-ring: <ring>`), renewed by [`crate::leader::Elector`] with
//! the same rules as the leader Lease. It claims in that Lease the namespace buckets the
//! ring's live members assign it ([`claims`]), and serves those: its passes, its writes
//! and its caches. Alone, it serves every bucket; that is not a mode, the same rules hold
//! with one member as with N. Nothing is written on the objects. With `--sharded-watch`
//! the API server filters each watch by the buckets; without, the member filters them.
//!
//! A canary ring (`--namespace-selector`) still divides by label: the ring's leader runs
//! the [`sharder`], which writes `shard.platform.example.com/<ring>: <identity>` on each
//! AppService and its children and hands them over by a drain handshake. Off (the
//! default), none of this runs and the controller is the single leader it always was.

pub mod buckets;
pub mod claims;
pub mod fence;
pub mod liveness;
pub mod metrics;
pub mod namespaces;
pub mod ring;
pub mod served;
pub mod sharder;

use std::collections::BTreeMap;

use common::AppService;
use common::names::{LABEL_SHARD_RING, drain_label, shard_label, shard_lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::info;

pub use fence::{Fence, fenced};
pub use metrics::{Direction, ShardMetrics};
pub use namespaces::is_label_value;

use crate::config::Config;
use crate::context::Context;
use crate::error::Result;
use crate::queue::Next;

/// The label a canary ring's member puts on the children it creates, so a create
/// already carries it: `(shard.platform.example.com/<ring>, <identity>)`; none otherwise.
pub fn child_label(config: &Config) -> Option<(String, String)> {
    labelled(config).then(|| (shard_label(&config.shard_ring), config.identity()))
}

/// A canary ring (`--namespace-selector`): divided by the sharder's labels.
pub fn labelled(config: &Config) -> bool {
    config.sharding && config.namespace_selector.is_some()
}

/// Every other ring: divided by namespace buckets claimed in the members' Leases, one
/// member or many alike.
pub fn bucketed(config: &Config) -> bool {
    config.sharding && !labelled(config)
}

/// The label selector of this shard's watches (`shard...=<identity>`), if sharding.
pub fn selector(config: &Config) -> Option<String> {
    child_label(config).map(|(k, v)| format!("{k}={v}"))
}

/// What [`gate`] says about a pass.
pub enum Gate {
    /// Not this shard's to reconcile now.
    Stop(Next),
    /// Go on.
    Go,
}

/// Before a pass. Divided by buckets: a pass runs only for a namespace this member serves
/// and whose objects every cache has listed; labels on the object mean nothing, and the
/// claims task lets a bucket go only between writes, so there is nothing to acknowledge.
///
/// A canary ring: an AppService labelled another member's is not ours; one this member
/// owns that the sharder asks to drain is let go here. kube-runtime runs one pass per
/// object at a time, so none of ours is in flight on it: forget it and remove our label,
/// the last write this member makes on it (guarded by the resourceVersion we read).
pub async fn gate(app: &AppService, ctx: &Context) -> Result<Gate> {
    let namespace = app.namespace().unwrap_or_default();
    if let Some(served) = ctx.served() {
        return Ok(if served.usable(&namespace) {
            Gate::Go
        } else {
            Gate::Stop(Next::await_change())
        });
    }
    let config = ctx.config();
    let Some((label, identity)) = child_label(config) else {
        return Ok(Gate::Go);
    };
    let labels = app.labels();
    if labels.get(&label) != Some(&identity) {
        return Ok(Gate::Stop(Next::await_change()));
    }
    if !labels.contains_key(&drain_label(&config.shard_ring)) {
        return Ok(Gate::Go);
    }
    let key = ObjectRef::from_obj(app);
    let api: Api<AppService> = Api::namespaced(ctx.client().clone(), &namespace);
    let patch = json!({"metadata": {
        "resourceVersion": app.metadata.resource_version,
        "labels": {label: null},
    }});
    let params = PatchParams {
        field_manager: Some(common::names::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch_metadata(&app.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.forget(&key);
    ctx.metrics().set_ready(&key, None);
    ctx.metrics().shard().handover(Direction::Out);
    info!(object = %key, "drained: handed over to the sharder");
    Ok(Gate::Stop(Next::await_change()))
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

    #[test]
    fn only_a_canary_ring_labels() {
        let mut config = Config::for_namespace("ns");
        assert_eq!(child_label(&config), None);
        assert_eq!(selector(&config), None);
        config.sharding = true;
        config.identity = Some("pod-0".into());
        assert_eq!(selector(&config), None, "one member or many: by buckets");
        assert!(bucketed(&config));
        for sharded_watch in [false, true] {
            config.sharded_watch = sharded_watch;
            assert_eq!(selector(&config), None);
        }
        config.sharded_watch = false;
        config.namespace_selector = Some(
            namespaces::NamespaceSelector::parse("operator-upgrade=canary").expect("a selector"),
        );
        assert!(!bucketed(&config));
        assert_eq!(
            selector(&config).as_deref(),
            Some("shard.platform.example.com/appservice-operator=pod-0")
        );
    }
}
