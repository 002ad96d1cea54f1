//! The sharder of a canary ring (`--namespace-selector`; every other ring divides by
//! namespace buckets, [`super::claims`]): run by the holder of the ring's leader Lease,
//! it decides which live shard owns each AppService and says so with the label
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
//!
//! A pass looks at the AppServices that had an event (their own or a child's) since the
//! last pass, and at every AppService when the live members of a ring changed, after a
//! relist or a namespace's event, and at least once per retry period (time alone moves
//! a Lease past its expiry): work in proportion to what changed, while the shard
//! converges thousands of AppServices whose events never stop.
//!
//! Rings side by side (`--namespace-selector`, a canary release): each release is its
//! own ring, and owns the AppServices of the namespaces its selector matches. The
//! exclusion rests on the labels, not on the selectors being complementary:
//! * a ring assigns an AppService only if no other ring's shard or drain label is on it;
//! * an AppService of ours whose namespace stops matching is drained as above, then
//!   released: our label leaves the children first and the AppService last (one write
//!   with the resourceVersion read), after which the other ring may take it;
//! * an AppService carrying our label and a live other ring's is released by us (never
//!   both: the two rings then meet on a clean object, and the resourceVersion decides);
//! * a ring none of whose member Leases has been live for twice the lease duration on
//!   our clock is dead (its release uninstalled or down): its labels are removed in the
//!   same writes that add ours. Its shards' fences closed long before.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::AppService;
use common::names::{
    DRAIN_LABEL_PREFIX, LABEL_MANAGED_BY, LABEL_SHARD_RING, MANAGED_BY, SHARD_LABEL_PREFIX,
    drain_label, shard_label,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
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

/// The pause before a pass that a change woke: at least 100 ms (it gathers a burst of
/// events), and at least this many times the last pass's reading of the caches (a full
/// pass visits every AppService and child): without it a ring of 20,000 AppServices, whose
/// events never stop while it converges, kept the sharder busy for most of a core,
/// taken from the API server on a small machine. Never longer than the retry period,
/// which bounds how late a Lease's expiry is seen anyway.
const PAUSE_PER_PASS: u32 = 4;

/// The pause before the next pass woken by a change, after a pass whose reading of the
/// caches took `read` (see [`PAUSE_PER_PASS`]).
fn pause_after(read: Duration, retry_period: Duration) -> Duration {
    (read * PAUSE_PER_PASS)
        .max(Duration::from_millis(100))
        .min(retry_period.max(Duration::from_millis(100)))
}

/// What the sharder remembers of a member Lease's record, as leader.rs does of the
/// leader Lease: when it was last seen to change, on this clock.
#[derive(Debug)]
struct Seen {
    resource_version: Option<String>,
    since: Instant,
}

/// A live member of a ring: the ring (its Lease's `platform.example.com/shard-ring`
/// label), where its Lease is, and who holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub ring: String,
    pub namespace: String,
    pub holder: String,
}

/// The members, of every ring the sharder sees, whose Lease record changed within its
/// lease duration on this clock; a released Lease (no holder) is no member.
#[derive(Debug, Default)]
pub struct Liveness {
    /// By `namespace/name` of the Lease.
    seen: HashMap<String, Seen>,
}

fn lease_key(lease: &Lease) -> String {
    format!(
        "{}/{}",
        lease.namespace().unwrap_or_default(),
        lease.name_any()
    )
}

impl Liveness {
    /// The live members among `leases`, at `now`.
    pub fn live(&mut self, leases: &[Arc<Lease>], now: Instant) -> Vec<Member> {
        let mut live = Vec::new();
        let mut present = Vec::new();
        for lease in leases {
            let key = lease_key(lease);
            present.push(key.clone());
            let rv = lease.metadata.resource_version.clone();
            let seen = self.seen.entry(key).or_insert_with(|| Seen {
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
            let Some(ring) = lease.labels().get(LABEL_SHARD_RING).cloned() else {
                continue;
            };
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            if now.saturating_duration_since(seen.since) < duration {
                live.push(Member {
                    ring,
                    namespace: lease.namespace().unwrap_or_default(),
                    holder,
                });
            }
        }
        self.seen.retain(|key, _| present.contains(key));
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
                    .get(&lease_key(lease))
                    .is_some_and(|s| now.saturating_duration_since(s.since) >= after)
            })
            .map(|l| &**l)
            .collect()
    }
}

/// When each other ring last had a live member, on this clock, within this term: a ring
/// with none for `grace` (the lease duration; its members' Leases had expired already,
/// so about twice the lease duration after its last renewal) is dead, and its
/// AppServices in our namespaces are ours to take.
#[derive(Debug)]
pub struct Peers {
    since: Instant,
    last_live: HashMap<String, Instant>,
}

impl Peers {
    pub fn new(now: Instant) -> Self {
        Peers {
            since: now,
            last_live: HashMap::new(),
        }
    }

    pub fn saw(&mut self, members: &[Member], now: Instant) {
        for m in members {
            self.last_live.insert(m.ring.clone(), now);
        }
    }

    pub fn dead(&self, ring: &str, now: Instant, grace: Duration) -> bool {
        let last = self.last_live.get(ring).copied().unwrap_or(self.since);
        now.saturating_duration_since(last.max(self.since)) >= grace
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
    /// Label children, then the AppService, with the new owner; the labels of the dead
    /// rings in `takeover` go in the same writes.
    Move {
        to: String,
        from: Option<String>,
        takeover: BTreeSet<String>,
    },
    /// Not ours any more (its namespace is not selected, or a live other ring holds it
    /// too) and its owner acknowledged or is dead: our label leaves the children, then
    /// the AppService.
    Release { from: Option<String> },
    /// Held by another live ring, in a namespace we select: left to it.
    Foreign(String),
    /// No live member, or its namespace not known yet: nothing to do.
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
            takeover: BTreeSet::new(),
        },
    }
}

/// The shard and drain labels on an object, as one ring reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    /// Our ring's shard label.
    pub owner: Option<String>,
    /// Our ring's drain label.
    pub draining: bool,
    /// The other rings with a shard or drain label on it.
    pub foreign: BTreeSet<String>,
}

impl Claims {
    pub fn of(labels: &BTreeMap<String, String>, ring: &str) -> Claims {
        let mut claims = Claims::default();
        for (key, value) in labels {
            let (other, is_owner) = if let Some(r) = key.strip_prefix(SHARD_LABEL_PREFIX) {
                (r, true)
            } else if let Some(r) = key.strip_prefix(DRAIN_LABEL_PREFIX) {
                (r, false)
            } else {
                continue;
            };
            if other != ring {
                claims.foreign.insert(other.to_owned());
            } else if is_owner {
                claims.owner = Some(value.clone());
            } else {
                claims.draining = true;
            }
        }
        claims
    }

    fn ours(&self) -> bool {
        self.owner.is_some() || self.draining
    }
}

/// The step for an AppService with `claims`, whose namespace our selector matches
/// (`selected`; `None`: the namespace is not known yet), placed on `target` by our ring,
/// with `live` telling whether a member of our ring is live and `dead_ring` whether an
/// other ring is dead.
pub fn decide(
    claims: &Claims,
    selected: Option<bool>,
    target: Option<&str>,
    live: impl Fn(&str) -> bool,
    dead_ring: impl Fn(&str) -> bool,
) -> Step {
    let Some(selected) = selected else {
        return Step::Idle;
    };
    let live_other = claims.foreign.iter().find(|r| !dead_ring(r));
    if !selected || (claims.ours() && live_other.is_some()) {
        return match claims.owner.as_deref() {
            Some(o) if live(o) && !claims.draining => Step::Drain,
            Some(o) if live(o) => Step::AwaitAck,
            _ if claims.ours() => Step::Release {
                from: claims.owner.clone(),
            },
            _ => Step::Idle,
        };
    }
    if let Some(other) = live_other {
        return Step::Foreign(other.clone());
    }
    let base = step(claims.owner.as_deref(), claims.draining, target, live);
    if claims.foreign.is_empty() {
        return base;
    }
    // Only dead rings' labels besides ours: they go with our next write.
    match base {
        Step::Keep(o) => Step::Move {
            to: o.clone(),
            from: Some(o),
            takeover: claims.foreign.clone(),
        },
        Step::Move { to, from, .. } => Step::Move {
            to,
            from,
            takeover: claims.foreign.clone(),
        },
        other => other,
    }
}

/// A child as the sharder keeps it: which kind, its name, its shard and drain labels
/// (of every ring).
#[derive(Clone, Debug)]
struct ChildMeta {
    kind: ChildKind,
    namespace: String,
    name: String,
    resource_version: Option<String>,
    labels: BTreeMap<String, String>,
}

impl ChildMeta {
    /// The child of `meta` and its controller's uid; `None` without a controller.
    fn of(kind: ChildKind, meta: &kube::api::ObjectMeta) -> Option<(String, ChildMeta)> {
        let uid = meta
            .owner_references
            .as_ref()?
            .iter()
            .find(|r| r.controller == Some(true))?
            .uid
            .clone();
        let child = ChildMeta {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            labels: meta.labels.clone().unwrap_or_default(),
        };
        Some((uid, child))
    }

    /// The label changes that make this child carry `want` (key to value, or `None` to
    /// remove), if any.
    fn patch(&self, want: &BTreeMap<String, Option<String>>) -> Option<serde_json::Value> {
        let differs = want.iter().any(|(k, v)| self.labels.get(k) != v.as_ref());
        differs.then(|| {
            json!({"metadata": {
                "resourceVersion": self.resource_version,
                "labels": want,
            }})
        })
    }
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
    /// With `--namespace-selector`: the namespaces' labels.
    namespaces: Option<Store<PartialObjectMeta<Namespace>>>,
    synced: Arc<[AtomicBool; 6]>,
}

impl Caches {
    /// Whether our selector matches the namespace `name`; `None` while it is not in the
    /// cache (being created, or deleted).
    fn selected(&self, ctx: &Context, name: &str) -> Option<bool> {
        let (Some(selector), Some(namespaces)) =
            (&ctx.config().namespace_selector, &self.namespaces)
        else {
            return Some(true);
        };
        let ns = namespaces.get(&reflector::ObjectRef::new(name))?;
        Some(selector.matches(ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
    }
}

/// What a watch event can change about the sharder's decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Affects {
    /// The AppService `namespace/name` (its own event, or one of its children's).
    App(String, String),
    /// Possibly any AppService: a relist, a namespace's labels.
    All,
    /// Nothing by itself: a Lease renewed (a change of the ring is seen in the pass,
    /// which compares the members), a child without an AppService controller.
    Nothing,
}

/// The AppServices whose decision may have changed since the last pass, gathered by the
/// caches' tasks: a pass looks at these only, unless everything may have changed. At
/// most one entry per AppService in the cache.
#[derive(Debug, Default)]
struct Changes {
    dirty: Mutex<Dirty>,
}

#[derive(Debug, Default)]
struct Dirty {
    all: bool,
    apps: HashSet<(String, String)>,
}

impl Changes {
    fn mark(&self, affects: Affects) {
        let mut dirty = self.dirty.lock().unwrap_or_else(PoisonError::into_inner);
        match affects {
            Affects::App(namespace, name) if !dirty.all => {
                dirty.apps.insert((namespace, name));
            }
            Affects::App(..) | Affects::Nothing => {}
            Affects::All => {
                dirty.all = true;
                dirty.apps = HashSet::new();
            }
        }
    }

    /// What changed since the last call, and forgets it.
    fn take(&self) -> Dirty {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Which AppServices a pass looks at.
#[derive(Debug)]
enum Scope {
    /// Every one: after a relist, a change of a ring's members or of the namespaces, and
    /// at least once per retry period (time alone moves a Lease past its expiry, or
    /// another ring past its grace).
    All,
    /// Those of `namespace/name` only: nothing else changed since the last pass.
    Apps(HashSet<(String, String)>),
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
        let mut state = PassState {
            liveness: Liveness::default(),
            peers: Peers::new(Instant::now()),
            members: None,
            last_full: None,
        };
        lead(&ctx, &mut state, &leading, &stop).await;
        info!("sharder stopped");
    }
}

/// Leads with one set of caches, until `stop` or the end of leadership.
async fn lead(
    ctx: &Arc<Context>,
    state: &mut PassState,
    leading: &watch::Receiver<bool>,
    stop: &watch::Receiver<bool>,
) {
    let (mut leading, mut stop) = (leading.clone(), stop.clone());
    let mut tasks = JoinSet::new();
    let notify = Arc::new(Notify::new());
    let changes = Arc::new(Changes::default());
    let caches = start_caches(ctx, &mut tasks, &notify, &changes);
    // Everything is new to these caches.
    state.members = None;
    let mut announced_members = usize::MAX;
    let mut last_read = Duration::ZERO;
    loop {
        if *stop.borrow() || !*leading.borrow() {
            break;
        }
        if caches.synced.iter().all(|f| f.load(Ordering::Relaxed)) {
            // Taken before the pass reads the caches: what changes during it is
            // looked at by the next one.
            let dirty = changes.take();
            let due = state
                .last_full
                .is_none_or(|t| t.elapsed() >= ctx.config().retry_period);
            let scope = if dirty.all || due {
                Scope::All
            } else {
                Scope::Apps(dirty.apps)
            };
            let (members, read) = pass(ctx, &caches, state, scope, &leading).await;
            last_read = read;
            if members != announced_members {
                info!(members, "ring members");
                announced_members = members;
            }
        }
        // Changes wake the next pass soon (after a pause that gathers a burst of events
        // and keeps the passes' share of a core small); the retry period bounds how
        // late a Lease's expiry is seen.
        tokio::select! {
            _ = notify.notified() => {
                tokio::time::sleep(pause_after(last_read, ctx.config().retry_period)).await;
            }
            _ = tokio::time::sleep(ctx.config().retry_period) => {}
            _ = leading.changed() => {}
            _ = stop.changed() => {}
        }
    }
    tasks.abort_all();
}

/// What the sharder keeps of an object's metadata: its identity, its controller
/// reference and every ring's shard and drain labels (a ring's claims are read from all).
fn keep_labels(meta: &mut kube::api::ObjectMeta) {
    let labels = meta.labels.take().unwrap_or_default();
    let kept: BTreeMap<String, String> = labels
        .into_iter()
        .filter(|(k, _)| k.starts_with(SHARD_LABEL_PREFIX) || k.starts_with(DRAIN_LABEL_PREFIX))
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

/// Starts the sharder's caches: every AppService and every child of ours, their labels
/// only.
fn start_caches(
    ctx: &Context,
    tasks: &mut JoinSet<()>,
    notify: &Arc<Notify>,
    changes: &Arc<Changes>,
) -> Caches {
    let config = ctx.config();
    let client = ctx.client();
    let synced: Arc<[AtomicBool; 6]> = Arc::new(Default::default());
    let ns = config.watch_namespace.clone();
    let child_labels = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
    let children = watcher::Config::default()
        .labels(&child_labels)
        .any_semantic();
    let apps = cache::<PartialObjectMeta<AppService>, _>(
        tasks,
        api(client, ns.as_deref()),
        watcher::Config::default().any_semantic(),
        |o: &mut PartialObjectMeta<AppService>| keep_labels(&mut o.metadata),
        (synced.clone(), 0),
        OnEvent {
            notify: notify.clone(),
            changes: changes.clone(),
            affects: |o| {
                Affects::App(
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default(),
                )
            },
        },
    );
    // The member Leases of every ring (other releases' rings are in their own
    // namespaces): whether another ring is alive decides whether its AppServices may be
    // taken. Scoped to one namespace, only the rings whose Leases are in ours.
    let leases = cache::<Lease, _>(
        tasks,
        match &ns {
            None => Api::all(client.clone()),
            Some(_) => Api::namespaced(client.clone(), &config.lease_namespace),
        },
        watcher::Config::default()
            .labels(LABEL_SHARD_RING)
            .any_semantic(),
        |l: &mut Lease| l.metadata.managed_fields = None,
        (synced.clone(), 1),
        OnEvent {
            notify: notify.clone(),
            changes: changes.clone(),
            affects: |_| Affects::Nothing,
        },
    );
    let deployments = cache::<PartialObjectMeta<Deployment>, _>(
        tasks,
        api(client, ns.as_deref()),
        children.clone(),
        |o: &mut PartialObjectMeta<Deployment>| keep_labels(&mut o.metadata),
        (synced.clone(), 2),
        OnEvent {
            notify: notify.clone(),
            changes: changes.clone(),
            affects: |o| child_affects(&o.metadata),
        },
    );
    let services = cache::<PartialObjectMeta<Service>, _>(
        tasks,
        api(client, ns.as_deref()),
        children.clone(),
        |o: &mut PartialObjectMeta<Service>| keep_labels(&mut o.metadata),
        (synced.clone(), 3),
        OnEvent {
            notify: notify.clone(),
            changes: changes.clone(),
            affects: |o| child_affects(&o.metadata),
        },
    );
    let secrets = cache::<PartialObjectMeta<Secret>, _>(
        tasks,
        api(client, ns.as_deref()),
        children,
        |o: &mut PartialObjectMeta<Secret>| keep_labels(&mut o.metadata),
        (synced.clone(), 4),
        OnEvent {
            notify: notify.clone(),
            changes: changes.clone(),
            affects: |o| child_affects(&o.metadata),
        },
    );
    // Namespaces' labels, with a selector only (one namespace when scoped).
    let namespaces = if config.namespace_selector.is_some() {
        let watch = match &ns {
            None => watcher::Config::default(),
            Some(one) => watcher::Config::default().fields(&format!("metadata.name={one}")),
        };
        Some(cache::<PartialObjectMeta<Namespace>, _>(
            tasks,
            Api::all(client.clone()),
            watch.any_semantic(),
            |o: &mut PartialObjectMeta<Namespace>| {
                o.metadata = kube::api::ObjectMeta {
                    name: o.metadata.name.take(),
                    labels: o.metadata.labels.take(),
                    ..kube::api::ObjectMeta::default()
                };
            },
            (synced.clone(), 5),
            OnEvent {
                notify: notify.clone(),
                changes: changes.clone(),
                affects: |_| Affects::All,
            },
        ))
    } else {
        synced[5].store(true, Ordering::Relaxed);
        None
    };
    Caches {
        apps,
        leases,
        deployments,
        services,
        secrets,
        namespaces,
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

/// What a cache's task does on each event: wake `notify`, and mark in `changes` what
/// the object `affects`.
struct OnEvent<K> {
    notify: Arc<Notify>,
    changes: Arc<Changes>,
    affects: fn(&K) -> Affects,
}

/// The AppService a child's event concerns: its controller's, if that is one.
fn child_affects(meta: &kube::api::ObjectMeta) -> Affects {
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == AppService::kind(&()));
    match owner {
        Some(owner) => Affects::App(
            meta.namespace.clone().unwrap_or_default(),
            owner.name.clone(),
        ),
        None => Affects::Nothing,
    }
}

/// A reflector driven by its own task, doing `on_event` on each event (a relist affects
/// everything); the flag `synced.1` of `synced.0` turns true once the initial list is in
/// the store.
fn cache<K, T>(
    tasks: &mut JoinSet<()>,
    api: Api<K>,
    config: watcher::Config,
    trim: T,
    (synced, index): (Arc<[AtomicBool; 6]>, usize),
    on_event: OnEvent<K>,
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
    let OnEvent {
        notify,
        changes,
        affects,
    } = on_event;
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
                    match &event {
                        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                            changes.mark(affects(o));
                        }
                        watcher::Event::Init | watcher::Event::InitApply(_) => {}
                        watcher::Event::InitDone => {
                            changes.mark(Affects::All);
                            synced[index].store(true, Ordering::Relaxed);
                        }
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

/// What the sharder carries from one pass to the next within a leadership term.
struct PassState {
    liveness: Liveness,
    peers: Peers,
    /// The live members (of every ring, sorted) the last pass saw: when they change,
    /// the pass looks at every AppService.
    members: Option<Vec<Member>>,
    /// When the last pass that looked at every AppService started.
    last_full: Option<Instant>,
}

/// One look at the AppServices of `scope` (at every one when the members of a ring
/// changed); returns the number of live members of our ring and how long reading the
/// caches took.
async fn pass(
    ctx: &Context,
    caches: &Caches,
    state: &mut PassState,
    scope: Scope,
    leading: &watch::Receiver<bool>,
) -> (usize, Duration) {
    let started = Instant::now();
    let config = ctx.config();
    let ring_name = config.shard_ring.as_str();
    let owner_label = shard_label(ring_name);
    let drain = drain_label(ring_name);
    let leases = caches.leases.state();
    let now = Instant::now();
    let mut members = state.liveness.live(&leases, now);
    members.sort();
    let scope = if state.members.as_ref() == Some(&members) {
        scope
    } else {
        Scope::All
    };
    let full = matches!(scope, Scope::All);
    if full {
        state.last_full = Some(started);
    }
    let is_ours =
        |ring: &str, namespace: &str| ring == ring_name && namespace == config.lease_namespace;
    let ring = Ring::new(
        members
            .iter()
            .filter(|m| is_ours(&m.ring, &m.namespace))
            .map(|m| m.holder.clone()),
    );
    state.peers.saw(&members, now);
    state.members = Some(members);
    let ours: Vec<Arc<Lease>> = leases
        .iter()
        .filter(|l| {
            is_ours(
                l.labels().get(LABEL_SHARD_RING).map_or("", String::as_str),
                &l.namespace().unwrap_or_default(),
            )
        })
        .cloned()
        .collect();
    for lease in state.liveness.stale(&ours, now) {
        delete_lease(ctx, lease).await;
    }
    ctx.metrics().shard().set_members(ring.len());
    let peers = &state.peers;
    let dead_ring = |r: &str| r != ring_name && peers.dead(r, now, config.lease_duration);

    let (apps, children) = match scope {
        Scope::All => (caches.apps.state(), all_children(caches)),
        Scope::Apps(keys) => {
            let apps: Vec<_> = keys
                .iter()
                .filter_map(|(namespace, name)| caches.apps.get(&at(name, namespace)))
                .collect();
            let children = children_of(caches, &apps);
            (apps, children)
        }
    };

    let mut work = Vec::new();
    let mut foreign = 0usize;
    for app in apps {
        let (Some(namespace), Some(name)) =
            (app.metadata.namespace.clone(), app.metadata.name.clone())
        else {
            continue;
        };
        if config.is_excluded(&namespace) {
            continue;
        }
        let claims = Claims::of(
            app.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            ring_name,
        );
        let key = ring::key(&namespace, &name);
        let step = decide(
            &claims,
            caches.selected(ctx, &namespace),
            ring.owner(&key),
            |m| ring.contains(m),
            dead_ring,
        );
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
                // Ours alone: the children carry our label and no other ring's.
                let want = labels_for(&owner_label, Some(&owner), &kids, ring_name);
                let lagging = lagging(kids, &want);
                if !lagging.is_empty() {
                    work.push(Work::Children {
                        want,
                        children: lagging,
                    });
                }
            }
            Step::Foreign(_) => {
                foreign += 1;
                // Never touch the other ring's labels; only take ours off the children.
                let want = BTreeMap::from([(owner_label.clone(), None)]);
                let lagging = lagging(kids, &want);
                if !lagging.is_empty() {
                    work.push(Work::Children {
                        want,
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
    // Counted over every AppService only.
    if full {
        ctx.metrics().shard().set_foreign(foreign);
    }
    let read = started.elapsed();
    if work.is_empty() {
        return (ring.len(), read);
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
    (ring.len(), read)
}

/// Every child in the caches, by its controller's uid.
fn all_children(caches: &Caches) -> HashMap<String, Vec<ChildMeta>> {
    let mut children: HashMap<String, Vec<ChildMeta>> = HashMap::new();
    let mut add = |kind, meta: &kube::api::ObjectMeta| {
        if let Some((uid, child)) = ChildMeta::of(kind, meta) {
            children.entry(uid).or_default().push(child);
        }
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
    children
}

/// The children of `apps` in the caches, by their controller's uid: found by the names
/// the controller gives them, so without reading every child.
fn children_of(
    caches: &Caches,
    apps: &[Arc<PartialObjectMeta<AppService>>],
) -> HashMap<String, Vec<ChildMeta>> {
    use common::names::{
        canary_deployment_name, database_secret_name, deployment_name, service_name,
    };
    let mut children: HashMap<String, Vec<ChildMeta>> = HashMap::new();
    let mut add = |kind, meta: Option<&kube::api::ObjectMeta>| {
        if let Some((uid, child)) = meta.and_then(|m| ChildMeta::of(kind, m)) {
            children.entry(uid).or_default().push(child);
        }
    };
    for app in apps {
        let (Some(namespace), Some(name)) = (&app.metadata.namespace, &app.metadata.name) else {
            continue;
        };
        for deployment in [deployment_name(name), canary_deployment_name(name)] {
            let d = caches.deployments.get(&at(&deployment, namespace));
            add(ChildKind::Deployment, d.as_ref().map(|d| &d.metadata));
        }
        let s = caches.services.get(&at(&service_name(name), namespace));
        add(ChildKind::Service, s.as_ref().map(|s| &s.metadata));
        let s = caches
            .secrets
            .get(&at(&database_secret_name(name), namespace));
        add(ChildKind::Secret, s.as_ref().map(|s| &s.metadata));
    }
    children
}

/// The cache key of `namespace/name`.
fn at<K: Resource<DynamicType = ()>>(name: &str, namespace: &str) -> reflector::ObjectRef<K> {
    reflector::ObjectRef::new(name).within(namespace)
}

/// The labels children of an AppService owned by `owner` (or by no one of ours) carry:
/// ours set (or removed), and every other ring's shard or drain label found on `kids`
/// removed. Use only where no live other ring holds the AppService.
fn labels_for(
    owner_label: &str,
    owner: Option<&str>,
    kids: &[ChildMeta],
    ring: &str,
) -> BTreeMap<String, Option<String>> {
    let mut want: BTreeMap<String, Option<String>> =
        BTreeMap::from([(owner_label.to_owned(), owner.map(str::to_owned))]);
    for kid in kids {
        for other in Claims::of(&kid.labels, ring).foreign {
            want.insert(shard_label(&other), None);
            want.insert(drain_label(&other), None);
        }
    }
    want
}

fn lagging(kids: Vec<ChildMeta>, want: &BTreeMap<String, Option<String>>) -> Vec<ChildMeta> {
    kids.into_iter()
        .filter(|c| c.patch(want).is_some())
        .collect()
}

enum Work {
    Children {
        want: BTreeMap<String, Option<String>>,
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
            Work::Children { want, children } => relabel_children(ctx, &want, &children).await,
            Work::App {
                app,
                step,
                children,
            } => {
                let name = app.name_any();
                let namespace = app.namespace().unwrap_or_default();
                let apps: Api<AppService> = Api::namespaced(ctx.client().clone(), &namespace);
                let rv = app.metadata.resource_version.clone();
                let ring = ctx.config().shard_ring.as_str();
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
                    Step::Move { to, from, takeover } => {
                        let mut want = labels_for(owner_label, Some(&to), &children, ring);
                        relabel_children(ctx, &want, &children).await?;
                        want.insert(drain.to_owned(), None);
                        for other in &takeover {
                            want.insert(shard_label(other), None);
                            want.insert(drain_label(other), None);
                        }
                        let patch = json!({"metadata": {"resourceVersion": rv, "labels": want}});
                        merge(&apps, &name, &patch).await?;
                        ctx.metrics().shard().moved();
                        // A first assignment (no owner before, nothing drained) is said by
                        // the label alone: an Event for each new AppService would double
                        // the API writes of a burst of creates. Handovers are announced.
                        let drained = app.labels().contains_key(drain);
                        let note = match (&from, takeover.is_empty()) {
                            (_, false) => Some(format!(
                                "taken over by shard {to} of ring {ring} from ring(s) {} (no live member)",
                                takeover.iter().cloned().collect::<Vec<_>>().join(", ")
                            )),
                            (Some(from), true) => {
                                Some(format!("moved from shard {from} to shard {to}"))
                            }
                            (None, true) if drained => {
                                Some(format!("handed over to shard {to} after a drain"))
                            }
                            (None, true) => None,
                        };
                        match note {
                            Some(note) => {
                                info!(object = %format!("{namespace}/{name}"), to = %to, from = ?from, taken_from_rings = ?takeover, "moved to shard");
                                announce(ctx, &app, "ShardAssigned", "Assign", note).await;
                            }
                            None => {
                                debug!(object = %format!("{namespace}/{name}"), to = %to, "assigned to shard")
                            }
                        }
                    }
                    Step::Release { from } => {
                        let want = BTreeMap::from([(owner_label.to_owned(), None)]);
                        relabel_children(ctx, &want, &children).await?;
                        let patch = json!({"metadata": {
                            "resourceVersion": rv,
                            "labels": {owner_label: null, drain: null},
                        }});
                        merge(&apps, &name, &patch).await?;
                        ctx.metrics().shard().released();
                        info!(object = %format!("{namespace}/{name}"), from = ?from, "released by this ring");
                        let note = format!(
                            "released by ring {ring}: its namespace is not selected by this ring, or another ring holds it"
                        );
                        announce(ctx, &app, "ShardReleased", "Release", note).await;
                    }
                    Step::Keep(_) | Step::AwaitAck | Step::Idle | Step::Foreign(_) => {}
                }
                Ok(())
            }
        }
    }
}

async fn announce(
    ctx: &Context,
    app: &PartialObjectMeta<AppService>,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    crate::report::publish(ctx.recorder(), ctx.metrics(), app, &event).await;
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

/// Gives each child the labels `want` (a value, or `None` to remove), with the
/// resourceVersion the sharder read.
async fn relabel_children(
    ctx: &Context,
    want: &BTreeMap<String, Option<String>>,
    children: &[ChildMeta],
) -> Result<(), kube::Error> {
    let mut changed = 0usize;
    for child in children {
        let Some(patch) = child.patch(want) else {
            continue;
        };
        changed += 1;
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
    if changed > 0 {
        debug!(
            ?want,
            children = changed,
            "children follow their AppService"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, rv: &str, secs: i32) -> Arc<Lease> {
        ring_lease("ring", holder, rv, secs)
    }

    fn ring_lease(ring: &str, holder: Option<&str>, rv: &str, secs: i32) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{ring}-shard-{}", holder.unwrap_or("x"))),
                namespace: Some(format!("{ring}-system")),
                resource_version: Some(rv.into()),
                labels: Some(BTreeMap::from([(
                    LABEL_SHARD_RING.to_owned(),
                    ring.to_owned(),
                )])),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
        })
    }

    fn holders(members: Vec<Member>) -> Vec<String> {
        members.into_iter().map(|m| m.holder).collect()
    }

    #[test]
    fn a_member_is_live_while_its_record_changed_within_its_duration_on_our_clock() {
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let a1 = vec![lease(Some("a"), "1", 15)];
        assert_eq!(holders(l.live(&a1, t0)), ["a"], "first seen: fresh");
        assert_eq!(holders(l.live(&a1, t0 + Duration::from_secs(14))), ["a"]);
        assert!(
            l.live(&a1, t0 + Duration::from_secs(15)).is_empty(),
            "unchanged for 15 s"
        );
        let a2 = vec![lease(Some("a"), "2", 15)];
        assert_eq!(
            holders(l.live(&a2, t0 + Duration::from_secs(16))),
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
                from: Some("dead".into()),
                takeover: BTreeSet::new(),
            }
        );
        // Acknowledged (the owner removed its label) or new: assigned at once.
        assert_eq!(
            step(None, true, Some("b"), live),
            Step::Move {
                to: "b".into(),
                from: None,
                takeover: BTreeSet::new(),
            }
        );
        assert_eq!(step(None, false, None, live), Step::Idle);
    }

    fn claims(pairs: &[(&str, &str)]) -> Claims {
        let labels: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Claims::of(&labels, "main")
    }

    #[test]
    fn claims_tell_our_ring_from_the_others() {
        let c = claims(&[
            ("shard.platform.example.com/main", "m-0"),
            ("drain.shard.platform.example.com/main", "true"),
            ("shard.platform.example.com/canary", "c-0"),
            ("drain.shard.platform.example.com/old", "true"),
            ("app", "x"),
        ]);
        assert_eq!(c.owner.as_deref(), Some("m-0"));
        assert!(c.draining);
        assert_eq!(
            c.foreign.iter().map(String::as_str).collect::<Vec<_>>(),
            ["canary", "old"]
        );
        assert_eq!(claims(&[("app", "x")]), Claims::default());
    }

    #[test]
    fn a_namespace_leaving_the_selector_is_drained_then_released() {
        let live = |m: &str| m == "m-0";
        let never_dead = |_: &str| false;
        let owned = claims(&[("shard.platform.example.com/main", "m-0")]);
        assert_eq!(
            decide(&owned, Some(false), Some("m-0"), live, never_dead),
            Step::Drain
        );
        let asked = claims(&[
            ("shard.platform.example.com/main", "m-0"),
            ("drain.shard.platform.example.com/main", "true"),
        ]);
        assert_eq!(
            decide(&asked, Some(false), Some("m-0"), live, never_dead),
            Step::AwaitAck
        );
        let acked = claims(&[("drain.shard.platform.example.com/main", "true")]);
        assert_eq!(
            decide(&acked, Some(false), Some("m-0"), live, never_dead),
            Step::Release { from: None }
        );
        // A dead owner cannot answer: released directly (its fence closed).
        let dead_owner = claims(&[("shard.platform.example.com/main", "gone")]);
        assert_eq!(
            decide(&dead_owner, Some(false), Some("m-0"), live, never_dead),
            Step::Release {
                from: Some("gone".into())
            }
        );
        // Nothing of ours on it: nothing to do.
        assert_eq!(
            decide(
                &Claims::default(),
                Some(false),
                Some("m-0"),
                live,
                never_dead
            ),
            Step::Idle
        );
        // A namespace not known yet: wait.
        assert_eq!(
            decide(&owned, None, Some("m-0"), live, never_dead),
            Step::Idle
        );
    }

    #[test]
    fn a_live_other_rings_object_is_never_taken_and_a_dead_rings_is() {
        let live = |m: &str| m == "m-0";
        let other = claims(&[("shard.platform.example.com/canary", "c-0")]);
        assert_eq!(
            decide(&other, Some(true), Some("m-0"), live, |_| false),
            Step::Foreign("canary".into())
        );
        // Still releasing it (only its drain label left): still its.
        let releasing = claims(&[("drain.shard.platform.example.com/canary", "true")]);
        assert_eq!(
            decide(&releasing, Some(true), Some("m-0"), live, |_| false),
            Step::Foreign("canary".into())
        );
        assert_eq!(
            decide(&other, Some(true), Some("m-0"), live, |r| r == "canary"),
            Step::Move {
                to: "m-0".into(),
                from: None,
                takeover: BTreeSet::from(["canary".to_owned()]),
            }
        );
        // Ours and a live other ring's at once: we let go (never both).
        let both = claims(&[
            ("shard.platform.example.com/main", "m-0"),
            ("shard.platform.example.com/canary", "c-0"),
        ]);
        assert_eq!(
            decide(&both, Some(true), Some("m-0"), live, |_| false),
            Step::Drain
        );
        // Ours and a dead ring's: its label goes with a relabel to our owner.
        assert_eq!(
            decide(&both, Some(true), Some("m-0"), live, |r| r == "canary"),
            Step::Move {
                to: "m-0".into(),
                from: Some("m-0".into()),
                takeover: BTreeSet::from(["canary".to_owned()]),
            }
        );
        // Selected and clean: the ring's own rules.
        assert_eq!(
            decide(&Claims::default(), Some(true), Some("m-0"), live, |_| false),
            Step::Move {
                to: "m-0".into(),
                from: None,
                takeover: BTreeSet::new()
            }
        );
    }

    #[test]
    fn the_pause_between_passes_grows_with_their_cost_within_bounds() {
        let retry = Duration::from_secs(2);
        let ms = Duration::from_millis;
        assert_eq!(
            pause_after(Duration::ZERO, retry),
            ms(100),
            "a burst is gathered"
        );
        assert_eq!(pause_after(ms(10), retry), ms(100));
        // A pass that reads for 150 ms is followed by 600 ms: at most a fifth of a core.
        assert_eq!(pause_after(ms(150), retry), ms(600));
        assert_eq!(
            pause_after(ms(900), retry),
            retry,
            "never past the retry period"
        );
        assert_eq!(pause_after(ms(900), ms(10)), ms(100));
    }

    #[test]
    fn a_ring_is_dead_once_no_member_was_live_for_the_grace_within_this_term() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(15);
        let mut peers = Peers::new(t0);
        assert!(
            !peers.dead("canary", t0 + Duration::from_secs(14), grace),
            "not before the grace from the term's start"
        );
        assert!(
            peers.dead("canary", t0 + grace, grace),
            "never seen: dead after the grace"
        );
        let member = Member {
            ring: "canary".into(),
            namespace: "c".into(),
            holder: "c-0".into(),
        };
        peers.saw(&[member], t0 + Duration::from_secs(20));
        assert!(!peers.dead("canary", t0 + Duration::from_secs(34), grace));
        assert!(peers.dead("canary", t0 + Duration::from_secs(35), grace));
    }

    #[test]
    fn members_are_told_apart_by_ring_and_lease_namespace() {
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let leases = vec![
            ring_lease("main", Some("m-0"), "1", 15),
            ring_lease("canary", Some("c-0"), "1", 15),
        ];
        let live = l.live(&leases, t0);
        assert_eq!(
            live,
            [
                Member {
                    ring: "main".into(),
                    namespace: "main-system".into(),
                    holder: "m-0".into()
                },
                Member {
                    ring: "canary".into(),
                    namespace: "canary-system".into(),
                    holder: "c-0".into()
                },
            ]
        );
    }

    #[test]
    fn a_child_patch_names_only_the_labels_that_differ() {
        let kid = ChildMeta {
            kind: ChildKind::Service,
            namespace: "ns".into(),
            name: "web".into(),
            resource_version: Some("7".into()),
            labels: BTreeMap::from([
                (
                    "shard.platform.example.com/main".to_owned(),
                    "m-0".to_owned(),
                ),
                (
                    "shard.platform.example.com/canary".to_owned(),
                    "c-0".to_owned(),
                ),
            ]),
        };
        let keep = BTreeMap::from([(
            "shard.platform.example.com/main".to_owned(),
            Some("m-0".to_owned()),
        )]);
        assert_eq!(kid.patch(&keep), None);
        let want = labels_for(
            "shard.platform.example.com/main",
            Some("m-0"),
            std::slice::from_ref(&kid),
            "main",
        );
        let patch = kid.patch(&want).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7", "labels": {
                "shard.platform.example.com/main": "m-0",
                "shard.platform.example.com/canary": null,
                "drain.shard.platform.example.com/canary": null,
            }}})
        );
    }

    fn meta(
        namespace: &str,
        name: &str,
        owner: Option<(&str, &str, &str)>,
    ) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            resource_version: Some("1".into()),
            owner_references: owner.map(|(kind, name, uid)| {
                vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "platform.example.com/v1beta1".into(),
                        kind: kind.into(),
                        name: name.into(),
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    },
                ]
            }),
            ..Default::default()
        }
    }

    fn app_key(namespace: &str, name: &str) -> (String, String) {
        (namespace.to_owned(), name.to_owned())
    }

    #[test]
    fn changes_gather_the_appservices_until_everything_changed() {
        let changes = Changes::default();
        changes.mark(Affects::App("ns".into(), "a".into()));
        changes.mark(Affects::App("ns".into(), "b".into()));
        changes.mark(Affects::App("ns".into(), "a".into()));
        changes.mark(Affects::Nothing);
        let dirty = changes.take();
        assert!(!dirty.all);
        assert_eq!(
            dirty.apps,
            HashSet::from([app_key("ns", "a"), app_key("ns", "b")])
        );
        // Taken: forgotten.
        let dirty = changes.take();
        assert!(!dirty.all && dirty.apps.is_empty());
        // Everything: the single AppServices are not kept besides.
        changes.mark(Affects::App("ns".into(), "a".into()));
        changes.mark(Affects::All);
        changes.mark(Affects::App("ns".into(), "c".into()));
        let dirty = changes.take();
        assert!(dirty.all);
        assert!(dirty.apps.is_empty());
    }

    #[test]
    fn a_child_event_concerns_the_appservice_that_controls_it() {
        let kind = AppService::kind(&());
        assert_eq!(
            child_affects(&meta("ns", "web", Some((kind.as_ref(), "web", "u1")))),
            Affects::App("ns".into(), "web".into())
        );
        assert_eq!(
            child_affects(&meta("ns", "web", Some(("ReplicaSet", "web", "u1")))),
            Affects::Nothing
        );
        assert_eq!(child_affects(&meta("ns", "web", None)), Affects::Nothing);
        let mut not_controller = meta("ns", "web", Some((kind.as_ref(), "web", "u1")));
        if let Some(refs) = not_controller.owner_references.as_mut() {
            refs[0].controller = None;
        }
        assert_eq!(child_affects(&not_controller), Affects::Nothing);
    }

    /// A store holding `objects`.
    fn store<K>(objects: Vec<K>) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(o));
        }
        store
    }

    fn partial<K: Resource<DynamicType = ()>>(meta: kube::api::ObjectMeta) -> PartialObjectMeta<K> {
        use kube::api::PartialObjectMetaExt as _;
        meta.into_request_partial::<K>()
    }

    /// What an incremental pass finds of an AppService's children by their names is
    /// what a full pass finds by their controller's uid: the same children, and no
    /// foreign object of the same name.
    #[test]
    fn children_found_by_name_are_the_children_found_by_uid() {
        use common::names::{
            canary_deployment_name, database_secret_name, deployment_name, service_name,
        };
        let kind = AppService::kind(&());
        let owned =
            |name: &str, app: &str, uid: &str| meta("ns", name, Some((kind.as_ref(), app, uid)));
        let apps = store(vec![
            partial::<AppService>(meta("ns", "web", None)),
            partial::<AppService>(meta("ns", "db", None)),
        ]);
        let with_uid = |name: &str, uid: &str| {
            apps.get(&at(name, "ns")).map(|a| {
                let mut a = (*a).clone();
                a.metadata.uid = Some(uid.into());
                Arc::new(a)
            })
        };
        let (web, db) = (
            with_uid("web", "uid-web").unwrap(),
            with_uid("db", "uid-db").unwrap(),
        );
        let caches = Caches {
            apps: apps.clone(),
            leases: store(Vec::<Lease>::new()),
            deployments: store(vec![
                partial::<Deployment>(owned(&deployment_name("web"), "web", "uid-web")),
                partial::<Deployment>(owned(&canary_deployment_name("web"), "web", "uid-web")),
                // Someone else's, of the name of db's Deployment.
                partial::<Deployment>(meta("ns", &deployment_name("db"), None)),
            ]),
            services: store(vec![
                partial::<Service>(owned(&service_name("web"), "web", "uid-web")),
                partial::<Service>(owned(&service_name("db"), "db", "uid-db")),
            ]),
            secrets: store(vec![partial::<Secret>(owned(
                &database_secret_name("db"),
                "db",
                "uid-db",
            ))]),
            namespaces: None,
            synced: Arc::new(Default::default()),
        };
        let names = |m: &HashMap<String, Vec<ChildMeta>>, uid: &str| {
            let mut kids: Vec<String> = m
                .get(uid)
                .into_iter()
                .flatten()
                .map(|c| format!("{:?}/{}", c.kind, c.name))
                .collect();
            kids.sort();
            kids
        };
        let by_uid = all_children(&caches);
        let by_name = children_of(&caches, &[web, db]);
        for uid in ["uid-web", "uid-db"] {
            assert_eq!(names(&by_name, uid), names(&by_uid, uid), "{uid}");
        }
        assert_eq!(
            names(&by_name, "uid-web"),
            ["Deployment/web", "Deployment/web-canary", "Service/web"]
        );
        assert_eq!(
            names(&by_name, "uid-db"),
            ["Secret/db-database", "Service/db"]
        );
    }
}
