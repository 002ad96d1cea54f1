//! The sharder: run by the holder of the ring's leader Lease, it decides which live
//! shard owns each AppService and says so with the label
//! `shard.platform.example.com/<ring>: <identity>` on the AppService and on its
//! children. It watches metadata only (AppServices, our children, the ring's Leases), and
//! only while it leads, so the other replicas hold none of it.
//!
//! Moving X from a live A to B is a drain, so that no two shards write X at once:
//! 1. the sharder labels X `drain.shard.platform.example.com/<ring>: "true"`, keeping A;
//! 2. A's watch shows the drain; kube-runtime never runs two passes of X at once, so
//!    when A's reconcile sees it no pass of A on X is in flight: A forgets X and removes
//!    its shard label, its last write on X (`super::gate`);
//! 3. the sharder relabels X's children to B, then X to B (dropping the drain); B's
//!    label-selected watches now show them.
//!
//! A dead or frozen A cannot answer: once A's Lease record has not changed for its
//! lease duration on the sharder's clock, X moves directly (A's fence closed at its
//! renew deadline, earlier). Every write here carries the resourceVersion the sharder
//! read, and each relabel changes the object's resourceVersion, so a write another
//! writer prepared before it fails with 409.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::AppService;
use common::names::{LABEL_MANAGED_BY, LABEL_SHARD_RING, MANAGED_BY, drain_label, shard_label};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info};

use super::ring::{self, Ring};
use crate::context::Context;
use crate::watches::WatchBackoff;

/// Field manager of the sharder's label patches.
pub const SHARDER_FIELD_MANAGER: &str = "appservice-sharder";

/// Writes the sharder has under way at once.
const CONCURRENCY: usize = 16;

/// A member Lease unchanged for this many of its lease durations is deleted.
const STALE_AFTER: u32 = 20;

/// What the sharder remembers of a member Lease's record, as leader.rs does of the
/// leader Lease: when it was last seen to change, on this clock.
#[derive(Debug)]
struct Seen {
    resource_version: Option<String>,
    since: Instant,
}

/// The members of the ring whose Lease record changed within its lease duration on
/// this clock; a released Lease (no holder) is no member.
#[derive(Debug, Default)]
pub struct Liveness {
    seen: HashMap<String, Seen>,
}

impl Liveness {
    /// The identities of the live members among `leases`, at `now`.
    pub fn live(&mut self, leases: &[Arc<Lease>], now: Instant) -> Vec<String> {
        let mut live = Vec::new();
        let mut present = Vec::new();
        for lease in leases {
            let name = lease.name_any();
            present.push(name.clone());
            let rv = lease.metadata.resource_version.clone();
            let seen = self.seen.entry(name).or_insert_with(|| Seen {
                resource_version: rv.clone(),
                since: now,
            });
            if seen.resource_version != rv {
                seen.resource_version = rv;
                seen.since = now;
            }
            let spec = lease.spec.clone().unwrap_or_default();
            let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
                continue;
            };
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            if now.saturating_duration_since(seen.since) < duration {
                live.push(holder);
            }
        }
        self.seen.retain(|name, _| present.contains(name));
        live
    }

    /// The Leases among `leases` whose record has not changed for [`STALE_AFTER`] lease
    /// durations (at least a minute) at `now`: members long gone (Pods get new names), to
    /// be deleted so the ring's Lease list does not grow with every rollout.
    pub fn stale<'a>(&self, leases: &'a [Arc<Lease>], now: Instant) -> Vec<&'a Lease> {
        leases
            .iter()
            .filter(|lease| {
                let secs = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_duration_seconds)
                    .unwrap_or(0);
                let after = (Duration::from_secs(u64::try_from(secs).unwrap_or(0)) * STALE_AFTER)
                    .max(Duration::from_secs(60));
                self.seen
                    .get(&lease.name_any())
                    .is_some_and(|s| now.saturating_duration_since(s.since) >= after)
            })
            .map(|l| &**l)
            .collect()
    }
}

/// What the sharder does about one AppService, decided from labels alone (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Owned by its target and not draining: only its children may need to follow.
    Keep(String),
    /// Ask the live owner to let it go.
    Drain,
    /// Waiting for the live owner to acknowledge the drain.
    AwaitAck,
    /// Drain no longer needed: its owner is the target again.
    Undrain,
    /// Label children, then the AppService, with the new owner.
    Move { to: String, from: Option<String> },
    /// No live member: nothing to do.
    Idle,
}

/// The step for an AppService owned by `owner` (its label), drained or not, whose
/// target in `ring` is `target`, with `live` telling whether a member is live.
pub fn step(
    owner: Option<&str>,
    draining: bool,
    target: Option<&str>,
    live: impl Fn(&str) -> bool,
) -> Step {
    let Some(target) = target else {
        return Step::Idle;
    };
    match owner {
        Some(o) if o == target && draining => Step::Undrain,
        Some(o) if o == target => Step::Keep(o.to_owned()),
        Some(o) if live(o) && draining => Step::AwaitAck,
        Some(o) if live(o) => Step::Drain,
        from => Step::Move {
            to: target.to_owned(),
            from: from.map(str::to_owned),
        },
    }
}

/// A child as the sharder keeps it: which kind, its name, its shard label, the uid of its
/// controller.
#[derive(Clone, Debug)]
struct ChildMeta {
    kind: ChildKind,
    namespace: String,
    name: String,
    resource_version: Option<String>,
    shard: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChildKind {
    Deployment,
    Service,
    Secret,
}

/// The caches of one leadership term.
struct Caches {
    apps: Store<PartialObjectMeta<AppService>>,
    leases: Store<Lease>,
    deployments: Store<PartialObjectMeta<Deployment>>,
    services: Store<PartialObjectMeta<Service>>,
    secrets: Store<PartialObjectMeta<Secret>>,
    synced: Arc<[AtomicBool; 5]>,
}

/// Runs the sharder whenever `leading` is true, until `stop` turns true.
pub async fn run(
    ctx: Arc<Context>,
    mut leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            r = leading.wait_for(|l| *l) => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        info!("sharder started (this replica leads the ring)");
        let mut tasks = JoinSet::new();
        let notify = Arc::new(Notify::new());
        let caches = start_caches(&ctx, &mut tasks, &notify);
        let mut liveness = Liveness::default();
        let mut announced_members = usize::MAX;
        loop {
            if *stop.borrow() || !*leading.borrow() {
                break;
            }
            if caches.synced.iter().all(|f| f.load(Ordering::Relaxed)) {
                let members = pass(&ctx, &caches, &mut liveness, &leading).await;
                if members != announced_members {
                    info!(members, "ring members");
                    announced_members = members;
                }
            }
            // Changes wake the next pass at once (after a short pause that gathers a
            // burst of events); the retry period bounds how late a Lease's expiry is seen.
            tokio::select! {
                _ = notify.notified() => tokio::time::sleep(Duration::from_millis(100)).await,
                _ = tokio::time::sleep(ctx.config().retry_period) => {}
                _ = leading.changed() => {}
                _ = stop.changed() => {}
            }
        }
        tasks.abort_all();
        info!("sharder stopped");
    }
}

fn start_caches(ctx: &Context, tasks: &mut JoinSet<()>, notify: &Arc<Notify>) -> Caches {
    let config = ctx.config();
    let client = ctx.client();
    let synced: Arc<[AtomicBool; 5]> = Arc::new(Default::default());
    let ns = config.watch_namespace.clone();
    let children = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
        .any_semantic();
    let ring_label = shard_label(&config.shard_ring);
    let drain = drain_label(&config.shard_ring);
    let keep_labels = {
        let (a, b) = (ring_label.clone(), drain.clone());
        move |meta: &mut kube::api::ObjectMeta| {
            let labels = meta.labels.take().unwrap_or_default();
            let kept: BTreeMap<String, String> = labels
                .into_iter()
                .filter(|(k, _)| *k == a || *k == b)
                .collect();
            *meta = kube::api::ObjectMeta {
                name: meta.name.take(),
                namespace: meta.namespace.take(),
                uid: meta.uid.take(),
                resource_version: meta.resource_version.take(),
                owner_references: meta.owner_references.take().map(|refs| {
                    refs.into_iter()
                        .filter(|r| r.controller == Some(true))
                        .collect()
                }),
                labels: Some(kept),
                ..kube::api::ObjectMeta::default()
            };
        }
    };
    let apps = cache::<PartialObjectMeta<AppService>, _>(
        tasks,
        api(client, ns.as_deref()),
        watcher::Config::default().any_semantic(),
        {
            let k = keep_labels.clone();
            move |o: &mut PartialObjectMeta<AppService>| k(&mut o.metadata)
        },
        (synced.clone(), 0),
        notify.clone(),
    );
    let leases = cache::<Lease, _>(
        tasks,
        Api::namespaced(client.clone(), &config.lease_namespace),
        watcher::Config::default()
            .labels(&format!("{LABEL_SHARD_RING}={}", config.shard_ring))
            .any_semantic(),
        |l: &mut Lease| l.metadata.managed_fields = None,
        (synced.clone(), 1),
        notify.clone(),
    );
    let deployments = cache::<PartialObjectMeta<Deployment>, _>(
        tasks,
        api(client, ns.as_deref()),
        children.clone(),
        {
            let k = keep_labels.clone();
            move |o: &mut PartialObjectMeta<Deployment>| k(&mut o.metadata)
        },
        (synced.clone(), 2),
        notify.clone(),
    );
    let services = cache::<PartialObjectMeta<Service>, _>(
        tasks,
        api(client, ns.as_deref()),
        children.clone(),
        {
            let k = keep_labels.clone();
            move |o: &mut PartialObjectMeta<Service>| k(&mut o.metadata)
        },
        (synced.clone(), 3),
        notify.clone(),
    );
    let secrets = cache::<PartialObjectMeta<Secret>, _>(
        tasks,
        api(client, ns.as_deref()),
        children,
        move |o: &mut PartialObjectMeta<Secret>| keep_labels(&mut o.metadata),
        (synced.clone(), 4),
        notify.clone(),
    );
    Caches {
        apps,
        leases,
        deployments,
        services,
        secrets,
        synced,
    }
}

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A reflector driven by its own task: every event wakes `notify`; the flag `synced.1`
/// of `synced.0` turns true once the initial list is in the store.
fn cache<K, T>(
    tasks: &mut JoinSet<()>,
    api: Api<K>,
    config: watcher::Config,
    trim: T,
    (synced, index): (Arc<[AtomicBool; 5]>, usize),
    notify: Arc<Notify>,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    T: FnMut(&mut K) + Send + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = reflector::reflector(
        writer,
        watcher(api, config)
            .modify(trim)
            .backoff(WatchBackoff::default()),
    );
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    if matches!(event, watcher::Event::InitDone) {
                        synced[index].store(true, Ordering::Relaxed);
                    }
                    notify.notify_one();
                }
                Ok(None) => return,
                Err(e) => debug!(error = %e, "sharder watch error"),
            }
        }
    });
    store
}

/// One look at every AppService; returns the number of live members.
async fn pass(
    ctx: &Context,
    caches: &Caches,
    liveness: &mut Liveness,
    leading: &watch::Receiver<bool>,
) -> usize {
    let config = ctx.config();
    let ring_name = config.shard_ring.as_str();
    let owner_label = shard_label(ring_name);
    let drain = drain_label(ring_name);
    let leases = caches.leases.state();
    let live = liveness.live(&leases, Instant::now());
    let ring = Ring::new(live);
    for lease in liveness.stale(&leases, Instant::now()) {
        delete_lease(ctx, lease).await;
    }
    ctx.metrics().shard().set_members(ring.len());

    // Children by their controller's uid.
    let mut children: HashMap<String, Vec<ChildMeta>> = HashMap::new();
    let mut add = |kind: ChildKind, meta: &kube::api::ObjectMeta| {
        let Some(uid) = meta
            .owner_references
            .as_ref()
            .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
            .map(|r| r.uid.clone())
        else {
            return;
        };
        children.entry(uid).or_default().push(ChildMeta {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            shard: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(&owner_label))
                .cloned(),
        });
    };
    for d in caches.deployments.state() {
        add(ChildKind::Deployment, &d.metadata);
    }
    for s in caches.services.state() {
        add(ChildKind::Service, &s.metadata);
    }
    for s in caches.secrets.state() {
        add(ChildKind::Secret, &s.metadata);
    }

    let mut work = Vec::new();
    for app in caches.apps.state() {
        let (Some(namespace), Some(name)) =
            (app.metadata.namespace.clone(), app.metadata.name.clone())
        else {
            continue;
        };
        if config.is_excluded(&namespace) {
            continue;
        }
        let labels = app.metadata.labels.clone().unwrap_or_default();
        let owner = labels.get(&owner_label).map(String::as_str);
        let draining = labels.contains_key(&drain);
        let key = ring::key(&namespace, &name);
        let step = step(owner, draining, ring.owner(&key), |m| ring.contains(m));
        let kids = app
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| children.get(uid))
            .cloned()
            .unwrap_or_default();
        match step {
            Step::Idle | Step::AwaitAck => {}
            Step::Keep(owner) => {
                let lagging: Vec<ChildMeta> = kids
                    .into_iter()
                    .filter(|c| c.shard.as_deref() != Some(owner.as_str()))
                    .collect();
                if !lagging.is_empty() {
                    work.push(Work::Children {
                        to: owner,
                        children: lagging,
                    });
                }
            }
            step => work.push(Work::App {
                app,
                step,
                children: kids,
            }),
        }
    }
    if work.is_empty() {
        return ring.len();
    }
    debug!(actions = work.len(), "sharder pass");
    let (owner_label, drain) = (owner_label.as_str(), drain.as_str());
    let done = futures::stream::iter(work)
        .map(|w| async move {
            // Leadership can end during a long pass: stop writing at once.
            if !*leading.borrow() {
                return;
            }
            if let Err(e) = w.run(ctx, owner_label, drain).await {
                debug!(error = %e, "sharder write failed; retried on the next pass");
            }
        })
        .buffer_unordered(CONCURRENCY);
    done.collect::<()>().await;
    ring.len()
}

enum Work {
    Children {
        to: String,
        children: Vec<ChildMeta>,
    },
    App {
        app: Arc<PartialObjectMeta<AppService>>,
        step: Step,
        children: Vec<ChildMeta>,
    },
}

impl Work {
    async fn run(self, ctx: &Context, owner_label: &str, drain: &str) -> Result<(), kube::Error> {
        match self {
            Work::Children { to, children } => {
                relabel_children(ctx, owner_label, &to, &children).await
            }
            Work::App {
                app,
                step,
                children,
            } => {
                let name = app.name_any();
                let namespace = app.namespace().unwrap_or_default();
                let apps: Api<AppService> = Api::namespaced(ctx.client().clone(), &namespace);
                let rv = app.metadata.resource_version.clone();
                match step {
                    Step::Drain => {
                        let patch =
                            json!({"metadata": {"resourceVersion": rv, "labels": {drain: "true"}}});
                        merge(&apps, &name, &patch).await?;
                        debug!(object = %format!("{namespace}/{name}"), "drain asked");
                    }
                    Step::Undrain => {
                        let patch =
                            json!({"metadata": {"resourceVersion": rv, "labels": {drain: null}}});
                        merge(&apps, &name, &patch).await?;
                    }
                    Step::Move { to, from } => {
                        relabel_children(ctx, owner_label, &to, &children).await?;
                        let patch = json!({"metadata": {
                            "resourceVersion": rv,
                            "labels": {owner_label: to, drain: null},
                        }});
                        merge(&apps, &name, &patch).await?;
                        ctx.metrics().shard().moved();
                        info!(object = %format!("{namespace}/{name}"), to = %to, from = ?from, "assigned to shard");
                        let note = match &from {
                            Some(from) => format!("moved from shard {from} to shard {to}"),
                            None => format!("assigned to shard {to}"),
                        };
                        let event = Event {
                            type_: EventType::Normal,
                            reason: "ShardAssigned".into(),
                            note: Some(note),
                            action: "Assign".into(),
                            secondary: None,
                        };
                        crate::report::publish(ctx.recorder(), ctx.metrics(), &*app, &event).await;
                    }
                    Step::Keep(_) | Step::AwaitAck | Step::Idle => {}
                }
                Ok(())
            }
        }
    }
}

async fn merge<K>(api: &Api<K>, name: &str, patch: &serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = PatchParams {
        field_manager: Some(SHARDER_FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch_metadata(name, &params, &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes a member Lease long unchanged, on the condition that it still is the record
/// the sharder saw (a member that came back meanwhile keeps its Lease).
async fn delete_lease(ctx: &Context, lease: &Lease) {
    let api: Api<Lease> = Api::namespaced(ctx.client().clone(), &ctx.config().lease_namespace);
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(&lease.name_any(), &params).await {
        Ok(_) => info!(lease = %lease.name_any(), "deleted the Lease of a member long gone"),
        Err(e) => {
            debug!(lease = %lease.name_any(), error = %e, "could not delete a stale member Lease")
        }
    }
}

/// Labels each child with its new owner, with the resourceVersion the sharder read.
async fn relabel_children(
    ctx: &Context,
    owner_label: &str,
    to: &str,
    children: &[ChildMeta],
) -> Result<(), kube::Error> {
    for child in children.iter().filter(|c| c.shard.as_deref() != Some(to)) {
        let patch = json!({"metadata": {"resourceVersion": child.resource_version, "labels": {owner_label: to}}});
        let client = ctx.client().clone();
        let ns = child.namespace.as_str();
        match child.kind {
            ChildKind::Deployment => {
                merge(
                    &Api::<Deployment>::namespaced(client, ns),
                    &child.name,
                    &patch,
                )
                .await?
            }
            ChildKind::Service => {
                merge(&Api::<Service>::namespaced(client, ns), &child.name, &patch).await?
            }
            ChildKind::Secret => {
                merge(&Api::<Secret>::namespaced(client, ns), &child.name, &patch).await?
            }
        }
    }
    if !children.is_empty() {
        debug!(
            to,
            children = children.len(),
            "children follow their AppService"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, rv: &str, secs: i32) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("ring-shard-{}", holder.unwrap_or("x"))),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn a_member_is_live_while_its_record_changed_within_its_duration_on_our_clock() {
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let a1 = vec![lease(Some("a"), "1", 15)];
        assert_eq!(l.live(&a1, t0), ["a"], "first seen: fresh");
        assert_eq!(l.live(&a1, t0 + Duration::from_secs(14)), ["a"]);
        assert!(
            l.live(&a1, t0 + Duration::from_secs(15)).is_empty(),
            "unchanged for 15 s"
        );
        let a2 = vec![lease(Some("a"), "2", 15)];
        assert_eq!(
            l.live(&a2, t0 + Duration::from_secs(16)),
            ["a"],
            "renewed: live again"
        );
        let released = vec![lease(None, "3", 1)];
        assert!(l.live(&released, t0 + Duration::from_secs(17)).is_empty());
    }

    #[test]
    fn a_lease_unchanged_for_twenty_durations_is_stale() {
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let gone = vec![lease(Some("a"), "1", 15)];
        l.live(&gone, t0);
        assert!(l.stale(&gone, t0 + Duration::from_secs(299)).is_empty());
        assert_eq!(l.stale(&gone, t0 + Duration::from_secs(300)).len(), 1);
        let renewed = vec![lease(Some("a"), "2", 15)];
        l.live(&renewed, t0 + Duration::from_secs(300));
        assert!(l.stale(&renewed, t0 + Duration::from_secs(301)).is_empty());
    }

    #[test]
    fn steps_drain_a_live_owner_and_move_from_a_dead_one() {
        let live = |m: &str| m == "a" || m == "b";
        assert_eq!(
            step(Some("a"), false, Some("a"), live),
            Step::Keep("a".into())
        );
        assert_eq!(step(Some("a"), false, Some("b"), live), Step::Drain);
        assert_eq!(step(Some("a"), true, Some("b"), live), Step::AwaitAck);
        assert_eq!(step(Some("a"), true, Some("a"), live), Step::Undrain);
        assert_eq!(
            step(Some("dead"), false, Some("b"), live),
            Step::Move {
                to: "b".into(),
                from: Some("dead".into())
            }
        );
        // Acknowledged (the owner removed its label) or new: assigned at once.
        assert_eq!(
            step(None, true, Some("b"), live),
            Step::Move {
                to: "b".into(),
                from: None
            }
        );
        assert_eq!(step(None, false, None, live), Step::Idle);
    }
}
