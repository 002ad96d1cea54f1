//! Sharding with real controller processes (`--sharding`, the shipped Lease timings: 15 s
//! lease, 10 s renew deadline, 2 s retry; 10 min resync) on a control plane that writes
//! an audit log. The oracle for "no object written by two shards at once" is the API
//! server's own record: each shard's requests carry `shard/<identity>` in their
//! User-Agent.
//!
//! * A ring divided by namespace buckets (every ring without `--namespace-selector`, one
//!   member or many, with the API server's sharded watch or without): per bucket, every
//!   write of a member falls inside a claim of that member in its Lease, and the claims
//!   under which two members wrote never overlap in time ([`claim_violations`]).
//! * A canary ring (`--namespace-selector`), divided by its sharder's labels: per object,
//!   in the order storage took the writes (the revision each answer carries), the shards
//!   that wrote it may change only across a write of the sharder (a relabel:
//!   `fieldManager=appservice-sharder`, [`interleavings`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use common::AppService;
use common::names::{LEASE_NAME, drain_label, shard_label};
use harness::{ControlPlane, Options, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use support::binary::Binary;
use support::{app, create, init};

const RING: &str = common::names::DEFAULT_SHARD_RING;
const LEASE: Duration = Duration::from_secs(15);

/// A shard is a controller process.
type Shard = Binary;

/// A controller process at its shipped defaults, with sharding on, scoped by `scope`
/// (`--watch-namespace` and `--lease-namespace`, or a ring's flags).
fn spawn_shard(
    kubeconfig: &Path,
    scope: &[&str],
    identity: &str,
    dir: &Path,
) -> anyhow::Result<Shard> {
    let mut flags = scope.to_vec();
    flags.push("--sharding");
    support::binary::spawn(kubeconfig, identity, dir, &flags)
}

fn tails(shards: &[&Shard]) -> String {
    shards
        .iter()
        .map(|s| s.log_tail(40))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Who owns each AppService (its shard label), once every AppService is owned by one of
/// `live`, none is draining, and its Deployment and Service carry the same label.
async fn settled(
    apps: &Api<AppService>,
    deployments: &Api<Deployment>,
    services: &Api<Service>,
    live: &[&str],
    expected: usize,
) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let (owner, drain) = (shard_label(RING), drain_label(RING));
    let list = apps.list(&ListParams::default()).await?;
    if list.items.len() != expected {
        return Ok(None);
    }
    let children = |labels: &BTreeMap<String, String>| labels.get(&owner).cloned();
    let deps: HashMap<String, Option<String>> = deployments
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|d| (d.name_any(), children(d.labels())))
        .collect();
    let svcs: HashMap<String, Option<String>> = services
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|s| (s.name_any(), children(s.labels())))
        .collect();
    let ring = controller::shard::ring::Ring::new(live.iter().copied());
    let mut owners = BTreeMap::new();
    for a in &list.items {
        let labels = a.labels();
        let Some(o) = labels.get(&owner) else {
            return Ok(None);
        };
        let name = a.name_any();
        // Where the ring puts it: the sharder has seen exactly these members.
        let placed = ring.owner(&controller::shard::ring::key(
            &a.namespace().unwrap_or_default(),
            &name,
        ));
        if placed != Some(o.as_str()) || labels.contains_key(&drain) {
            return Ok(None);
        }
        if deps.get(&name) != Some(&Some(o.clone())) || svcs.get(&name) != Some(&Some(o.clone())) {
            return Ok(None);
        }
        owners.insert(name, o.clone());
    }
    Ok(Some(owners))
}

/// Every AppService's status is for its current generation.
async fn statuses_current(apps: &Api<AppService>) -> anyhow::Result<bool> {
    let list = apps.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .all(|a| a.status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation))
}

/// Edits AppServices (their replicas) one after another until stopped: the load under
/// which shards come and go. Every edit changes the spec (each pass over the list moves
/// every replicas to the next of 1, 2, 3), so every edit is a new generation some shard
/// must write for. Bounded: at most `max` edits.
fn writer(
    apps: Vec<(Api<AppService>, String)>,
    stop: Arc<AtomicBool>,
    edits: Arc<AtomicU64>,
    max: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i: u64 = 0;
        let len = apps.len().max(1) as u64;
        while !stop.load(Ordering::Relaxed) && i < max {
            let Some((api, name)) = apps.get((i % len) as usize) else {
                break;
            };
            let replicas = 1 + ((i / len) % 3) as i32;
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            if api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                edits.fetch_add(1, Ordering::Relaxed);
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    })
}

/// One write the audit log recorded.
#[derive(Debug, Clone)]
struct Write {
    object: String,
    /// `Some(identity)` for a shard's write, `None` for the sharder's relabel.
    shard: Option<String>,
}

/// Waits until the writer has made `more` edits beyond `now`: each phase runs under load.
async fn under_load(edits: &AtomicU64, more: u64) -> anyhow::Result<()> {
    let target = edits.load(Ordering::Relaxed) + more;
    eventually("the writer's edits", Duration::from_secs(60), || async {
        Ok::<_, harness::poll::Failure>((edits.load(Ordering::Relaxed) >= target).then_some(()))
    })
    .await?;
    Ok(())
}

/// The successful writes of shards and of the sharder, in the order storage took them:
/// by the revision each answer carries (`metadata.resourceVersion`, the etcd revision of
/// the write; one object's revisions grow with each change). The audit log's own order is
/// the order the answers were completed, which is not it: the sharder's relabel can be
/// stored, reach the new shard's watch and be followed by the new shard's write before
/// the relabel's answer is complete. A write answered without a revision (a Status)
/// keeps its place after the writes completed before it; equal revisions (a write that
/// changed nothing answers with the object as it was) keep the log's order.
fn writes(events: &[serde_json::Value]) -> Vec<Write> {
    let mut last = 0;
    let mut recorded: Vec<(u64, Write)> = events
        .iter()
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c))
        })
        .filter(|e| e["objectRef"]["resource"] != "leases")
        .filter_map(|e| {
            let r = &e["objectRef"];
            let name = r["name"].as_str().filter(|n| !n.is_empty())?;
            let object = format!(
                "{}/{}/{}/{name}",
                r["apiGroup"].as_str().unwrap_or(""),
                r["resource"].as_str().unwrap_or(""),
                r["namespace"].as_str().unwrap_or("")
            );
            let revision = e["responseObject"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(last);
            last = last.max(revision);
            let uri = e["requestURI"].as_str().unwrap_or("");
            let ua = e["userAgent"].as_str().unwrap_or("");
            let shard = ua.split_once("shard/").map(|(_, id)| id.to_owned());
            let relabel = uri.contains("fieldManager=appservice-sharder");
            let write = if relabel {
                Write {
                    object,
                    shard: None,
                }
            } else {
                Write {
                    object,
                    shard: Some(shard?),
                }
            };
            Some((revision, write))
        })
        .collect();
    recorded.sort_by_key(|(revision, _)| *revision);
    recorded.into_iter().map(|(_, w)| w).collect()
}

/// The oracle: per object, the shard that writes it changes only across a write of the
/// sharder. Returns each violation (object, the earlier writer, the later one).
fn interleavings(writes: &[Write]) -> Vec<(String, String, String)> {
    #[derive(Default)]
    struct State {
        writer: Option<String>,
        handed_over: bool,
    }
    let mut state: HashMap<&str, State> = HashMap::new();
    let mut violations = Vec::new();
    for w in writes {
        let st = state.entry(w.object.as_str()).or_default();
        match &w.shard {
            None => st.handed_over = true,
            Some(id) => {
                if let Some(before) = &st.writer
                    && before != id
                    && !st.handed_over
                {
                    violations.push((w.object.clone(), before.clone(), id.clone()));
                }
                st.writer = Some(id.clone());
                st.handed_over = false;
            }
        }
    }
    violations
}

/// One audit event of a successful write of `app`, answered at `revision`.
fn recorded(app: &str, shard: Option<&str>, revision: Option<u64>) -> serde_json::Value {
    let (manager, agent) = match shard {
        Some(id) => (
            "appservice-controller",
            format!("appservice-controller/0 shard/{id}"),
        ),
        None => (
            "appservice-sharder",
            "appservice-controller/0 shard/x".to_owned(),
        ),
    };
    serde_json::json!({
        "stage": "ResponseComplete",
        "responseStatus": {"code": 200},
        "objectRef": {"apiGroup": "platform.example.com", "resource": "appservices",
                      "namespace": "ns", "name": app},
        "requestURI": format!("/apis/platform.example.com/v1beta1/namespaces/ns/appservices/{app}?fieldManager={manager}"),
        "userAgent": agent,
        "responseObject": revision.map(|r| serde_json::json!({"metadata": {"resourceVersion": r.to_string()}})),
    })
}

#[test]
fn the_oracle_orders_writes_as_storage_took_them() {
    // The relabel (revision 20) is answered after the new owner's write that followed it
    // (21): in the log's order b wrote before the handover, in storage's it did not.
    let log = [
        recorded("x", Some("a"), Some(10)),
        recorded("x", Some("b"), Some(21)),
        recorded("x", None, Some(20)),
    ];
    assert!(interleavings(&writes(&log)).is_empty());
    // The same three in storage's order with b before the relabel: a violation.
    let log = [
        recorded("x", Some("a"), Some(10)),
        recorded("x", Some("b"), Some(19)),
        recorded("x", None, Some(20)),
    ];
    assert_eq!(
        interleavings(&writes(&log)),
        [(
            "platform.example.com/appservices/ns/x".to_owned(),
            "a".to_owned(),
            "b".to_owned()
        )]
    );
    // An answer without a revision (a Status) stays after what was completed before it:
    // here after the relabel, not before a's write.
    let log = [
        recorded("x", Some("a"), Some(10)),
        recorded("x", None, Some(20)),
        recorded("x", Some("b"), None),
        recorded("x", Some("b"), Some(25)),
    ];
    assert!(interleavings(&writes(&log)).is_empty());
}

async fn leader(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt(LEASE_NAME)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// An error as `eventually` keeps it.
fn failure(e: impl Into<anyhow::Error>) -> Box<dyn std::error::Error + Send + Sync> {
    e.into().into()
}

/// One namespace of AppServices, the ring's Leases in a namespace of their own.
struct World {
    _namespace: harness::TestNamespace,
    _lease_namespace: harness::TestNamespace,
    cp: ControlPlane,
    ns: String,
    lease_ns: String,
    apps: Api<AppService>,
    deployments: Api<Deployment>,
    services: Api<Service>,
    leases: Api<Lease>,
    dir: tempfile::TempDir,
}

async fn world() -> anyhow::Result<World> {
    init();
    let cp = ControlPlane::start(Options::plain().with_audit_log()).await?;
    let namespace = cp.namespace().await?;
    let lease_namespace = cp.namespace_with_prefix("leases").await?;
    let ns = namespace.to_string();
    let lease_ns = lease_namespace.to_string();
    let client = cp.client();
    Ok(World {
        _namespace: namespace,
        _lease_namespace: lease_namespace,
        apps: Api::namespaced(client.clone(), &ns),
        deployments: Api::namespaced(client.clone(), &ns),
        services: Api::namespaced(client.clone(), &ns),
        leases: Api::namespaced(client, &lease_ns),
        ns,
        lease_ns,
        cp,
        dir: tempfile::tempdir()?,
    })
}

impl World {
    /// A member of a canary ring whose selector matches the test's namespace: divided
    /// by labels.
    fn spawn(&self, identity: &str) -> anyhow::Result<Shard> {
        self.spawn_with(identity, &["--namespace-selector", EVERY_NAMESPACE])
    }

    /// A member of a ring without a selector: divided by namespace buckets.
    fn spawn_bucketed(&self, identity: &str) -> anyhow::Result<Shard> {
        self.spawn_with(identity, &[])
    }

    /// Once every AppService's status is for its generation and its Deployment has its
    /// replicas, and the live members' Leases claim exactly what the ring gives each:
    /// who serves the test's namespace.
    async fn converged_by_buckets(
        &self,
        live: &[&str],
        timeout: Duration,
        shards: &[&Shard],
    ) -> anyhow::Result<String> {
        eventually(
            &format!("claimed by {live:?} and converged"),
            timeout,
            || async {
                let ring = controller::shard::ring::Ring::new(live.iter().copied());
                let mut serving = None;
                for id in live {
                    let claimed = self
                        .leases
                        .get_opt(&common::names::shard_lease_name(RING, id))
                        .await
                        .map_err(failure)?
                        .and_then(|l| l.annotations().get(ANNOTATION).cloned())
                        .and_then(|v| Buckets::from_hex(&v));
                    if claimed != Some(assigned(&ring, id)) {
                        return Ok(None);
                    }
                    if assigned(&ring, id).contains_namespace(&self.ns) {
                        serving = Some((*id).to_owned());
                    }
                }
                for a in self
                    .apps
                    .list(&ListParams::default())
                    .await
                    .map_err(failure)?
                {
                    let current = a.status.as_ref().and_then(|s| s.observed_generation)
                        == a.metadata.generation;
                    let replicas = self
                        .deployments
                        .get_opt(&a.name_any())
                        .await
                        .map_err(failure)?
                        .map(|d| d.spec)
                        .and_then(|s| s.replicas);
                    if !current || replicas != a.spec.replicas {
                        return Ok(None);
                    }
                }
                Ok(serving)
            },
        )
        .await
        .with_context(|| tails(shards))
    }

    /// Sets the replicas of the AppService `held`.
    async fn edit_held(&self, replicas: i32) -> anyhow::Result<()> {
        let edit = serde_json::json!({"spec": {"replicas": replicas}});
        self.apps
            .patch(HELD, &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        Ok(())
    }

    /// Waits until `held`'s status is for its generation and its Deployment has
    /// `replicas`.
    async fn held_converged(&self, replicas: i32) -> anyhow::Result<()> {
        eventually(
            &format!("held converged with {replicas} replicas"),
            Duration::from_secs(120),
            || async {
                let app = self.apps.get(HELD).await.map_err(failure)?;
                let d = self.deployments.get(HELD).await.map_err(failure)?;
                let current = app.status.as_ref().and_then(|s| s.observed_generation)
                    == app.metadata.generation;
                Ok((current && d.spec.replicas == Some(replicas)).then_some(()))
            },
        )
        .await?;
        Ok(())
    }

    /// A shard with `extra` flags.
    fn spawn_with(&self, identity: &str, extra: &[&str]) -> anyhow::Result<Shard> {
        let mut scope = vec![
            "--watch-namespace",
            &self.ns,
            "--lease-namespace",
            &self.lease_ns,
        ];
        scope.extend_from_slice(extra);
        spawn_shard(self.cp.kubeconfig_path(), &scope, identity, self.dir.path())
    }

    async fn settle(
        &self,
        live: &[&str],
        n: usize,
        timeout: Duration,
        shards: &[&Shard],
    ) -> anyhow::Result<BTreeMap<String, String>> {
        eventually(&format!("owned by {live:?}"), timeout, || async {
            settled(&self.apps, &self.deployments, &self.services, live, n)
                .await
                .map_err(failure)
        })
        .await
        .with_context(|| tails(shards))
    }
}

/// How many AppServices changed owner between two settled states, and whether each move
/// went only to `added` or from `removed`.
fn moves(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    added: Option<&str>,
    removed: Option<&str>,
) -> usize {
    let mut moved = 0;
    for (name, was) in before {
        let now = &after[name];
        if now != was {
            moved += 1;
            assert!(
                added.is_some_and(|a| a == now) || removed.is_some_and(|r| r == was),
                "{name} moved {was} → {now}, neither to the shard added ({added:?}) nor from the one removed ({removed:?})"
            );
        }
    }
    moved
}

fn owned_by(owners: &BTreeMap<String, String>) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for o in owners.values() {
        *counts.entry(o.as_str()).or_default() += 1;
    }
    counts
}

#[tokio::test]
async fn one_two_three_two_shards_under_edits_never_write_an_object_at_once() -> anyhow::Result<()>
{
    let w = world().await?;
    const N: usize = 64;
    let names: Vec<String> = (0..N).map(|i| format!("app-{i:02}")).collect();
    let s0 = w.spawn("shard-0")?;
    for name in &names {
        create(&w.apps, &app(name, "nginx:1.27", 1)).await?;
    }
    let t = Instant::now();
    let one = w
        .settle(&["shard-0"], N, Duration::from_secs(120), &[&s0])
        .await?;
    eprintln!("1 shard: settled in {:?}", t.elapsed());
    // First assignments are said by the label alone, with no Event each.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(w.cp.client(), &w.ns);
    let first: Vec<_> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ShardAssigned"))
        .collect();
    assert!(first.is_empty(), "Events for first assignments: {first:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let edits = Arc::new(AtomicU64::new(0));
    let editing = writer(
        names.iter().map(|n| (w.apps.clone(), n.clone())).collect(),
        stop.clone(),
        edits.clone(),
        4000,
    );

    under_load(&edits, 20).await?;
    let s1 = w.spawn("shard-1")?;
    let t = Instant::now();
    let two = w
        .settle(
            &["shard-0", "shard-1"],
            N,
            Duration::from_secs(120),
            &[&s0, &s1],
        )
        .await?;
    let moved_12 = moves(&one, &two, Some("shard-1"), None);
    eprintln!(
        "1→2: settled in {:?}, moved {moved_12} of {N}, owned {:?}",
        t.elapsed(),
        owned_by(&two)
    );

    under_load(&edits, 20).await?;
    let s2 = w.spawn("shard-2")?;
    let t = Instant::now();
    let three = w
        .settle(
            &["shard-0", "shard-1", "shard-2"],
            N,
            Duration::from_secs(120),
            &[&s0, &s1, &s2],
        )
        .await?;
    let moved_23 = moves(&two, &three, Some("shard-2"), None);
    eprintln!(
        "2→3: settled in {:?}, moved {moved_23} of {N}, owned {:?}",
        t.elapsed(),
        owned_by(&three)
    );

    under_load(&edits, 20).await?;
    // 3→2: a shard that is not the sharder stops (SIGTERM: it releases its Lease).
    let lead = leader(&w.leases).await?;
    let (gone, mut stays) = {
        let mut all = vec![s0, s1, s2];
        let i = all
            .iter()
            .position(|s| Some(&s.identity) != lead.as_ref())
            .unwrap();
        let gone = all.remove(i);
        (gone, all)
    };
    gone.signal("TERM")?;
    let mut gone = gone;
    let status = tokio::time::timeout(Duration::from_secs(40), gone.child.wait())
        .await
        .context("the stopped shard did not exit")??;
    assert!(status.success(), "{status}: {}", gone.log_tail(40));
    let live: Vec<&str> = stays.iter().map(|s| s.identity.as_str()).collect();
    let t = Instant::now();
    let back = w
        .settle(&live, N, Duration::from_secs(120), &[&stays[0], &stays[1]])
        .await?;
    let moved_32 = moves(&three, &back, None, Some(&gone.identity));
    eprintln!(
        "3→2 ({} left): settled in {:?}, moved {moved_32} of {N}, owned {:?}",
        gone.identity,
        t.elapsed(),
        owned_by(&back)
    );

    under_load(&edits, 20).await?;
    stop.store(true, Ordering::Relaxed);
    editing.await?;
    eventually("every status current", Duration::from_secs(120), || async {
        statuses_current(&w.apps)
            .await
            .map(|done| done.then_some(()))
            .map_err(failure)
    })
    .await
    .with_context(|| tails(&[&stays[0], &stays[1]]))?;
    w.settle(&live, N, Duration::from_secs(30), &[&stays[0], &stays[1]])
        .await?;
    eprintln!("edits made: {}", edits.load(Ordering::Relaxed));

    // Near 1/N moved per change: 1/2 of N, then 1/3, then the third that left.
    let near = |moved: usize, fair: f64| (moved as f64 - fair).abs() <= N as f64 * 0.2;
    assert!(near(moved_12, N as f64 / 2.0), "1→2 moved {moved_12}");
    assert!(near(moved_23, N as f64 / 3.0), "2→3 moved {moved_23}");
    assert_eq!(
        moved_32,
        three.values().filter(|o| **o == gone.identity).count(),
        "3→2 moves exactly the leaving shard's objects"
    );

    // The moves were announced on the AppServices they moved.
    let announced: std::collections::BTreeSet<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ShardAssigned"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    let moved: std::collections::BTreeSet<String> = [(&one, &two), (&two, &three), (&three, &back)]
        .iter()
        .flat_map(|(before, after)| {
            before
                .iter()
                .filter(|(name, was)| after.get(*name) != Some(*was))
                .map(|(name, _)| name.clone())
        })
        .collect();
    eprintln!(
        "ShardAssigned Events on {} AppServices; {} moved between settled states",
        announced.len(),
        moved.len()
    );
    let silent: Vec<&String> = moved.difference(&announced).collect();
    assert!(
        silent.is_empty(),
        "moved without a ShardAssigned Event: {silent:?}"
    );

    // The oracle, on what the API server recorded.
    let events = w.cp.audit_events()?;
    let recorded = writes(&events);
    let by_shard = recorded.iter().filter(|w| w.shard.is_some()).count();
    let by_sharder = recorded.len() - by_shard;
    eprintln!("audit: {by_shard} shard writes, {by_sharder} sharder relabels");
    assert!(by_shard > N, "the shards' writes are in the audit log");
    assert!(
        by_sharder > 0,
        "the sharder's relabels are in the audit log"
    );
    let bad = interleavings(&recorded);
    assert!(
        bad.is_empty(),
        "objects written by two shards at once: {bad:?}"
    );

    // And the oracle can fail: two identities writing one object with no handover.
    let forger = |id: &str| -> anyhow::Result<Api<AppService>> {
        let mut config = w.cp.admin_config();
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(&controller::client::shard_user_agent(
                "appservice-controller",
                id,
            ))?,
        ));
        Ok(Api::namespaced(kube::Client::try_from(config)?, &w.ns))
    };
    let (x, y) = (forger("rogue-x")?, forger("rogue-y")?);
    for (i, api) in [&x, &y, &x].iter().enumerate() {
        let patch = serde_json::json!({"metadata": {"annotations": {"rogue": i.to_string()}}});
        api.patch("app-00", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let caught = interleavings(&writes(&w.cp.audit_events()?));
    assert!(
        caught
            .iter()
            .any(|(o, a, b)| o.ends_with("/app-00") && a == "rogue-x" && b == "rogue-y"),
        "the oracle misses a deliberate interleaving: {caught:?}"
    );
    for s in &mut stays {
        s.signal("TERM")?;
        let _ = tokio::time::timeout(Duration::from_secs(40), s.child.wait()).await;
    }
    Ok(())
}

/// SIGKILLs `victim` (no release) and measures, per AppService it owned in `before`, how
/// long until another shard owns it: (p50, max, how many).
async fn kill_and_measure(
    w: &World,
    victim: Shard,
    before: &BTreeMap<String, String>,
    shards: &[Shard],
) -> anyhow::Result<(Duration, Duration, usize)> {
    let victim_id = victim.identity.clone();
    let victims: Vec<String> = before
        .iter()
        .filter(|(_, o)| **o == victim_id)
        .map(|(n, _)| n.clone())
        .collect();
    anyhow::ensure!(!victims.is_empty(), "{victim_id} owned nothing");
    let killed = Instant::now();
    victim.signal("KILL")?;
    drop(victim);
    let mut gaps: HashMap<String, Duration> = HashMap::new();
    let owner = shard_label(RING);
    // Polled by hand: each AppService's own moment of takeover is the measure.
    let deadline = killed + Duration::from_secs(90);
    while gaps.len() < victims.len() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the killed shard's AppServices not taken over within 90 s ({} of {}): {}",
            gaps.len(),
            victims.len(),
            tails(&shards.iter().collect::<Vec<_>>())
        );
        for a in w.apps.list(&ListParams::default()).await?.items {
            let name = a.name_any();
            if victims.contains(&name)
                && !gaps.contains_key(&name)
                && a.labels().get(&owner).is_some_and(|o| *o != victim_id)
            {
                gaps.insert(name, killed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut g: Vec<Duration> = gaps.values().copied().collect();
    Ok((percentile(&mut g, 50), percentile(&mut g, 100), g.len()))
}

/// Percentile `p` (0..=100) of `xs`, sorted in place.
fn percentile(xs: &mut [Duration], p: usize) -> Duration {
    xs.sort();
    xs[(xs.len() - 1) * p / 100]
}

#[tokio::test]
async fn a_killed_shard_is_taken_over_and_a_frozen_one_writes_nothing_after_it_resumes()
-> anyhow::Result<()> {
    let w = world().await?;
    const N: usize = 36;
    let names: Vec<String> = (0..N).map(|i| format!("app-{i:02}")).collect();
    let mut shards = vec![
        w.spawn("shard-a")?,
        w.spawn("shard-b")?,
        w.spawn("shard-c")?,
    ];
    for name in &names {
        create(&w.apps, &app(name, "nginx:1.27", 1)).await?;
    }
    let ids = ["shard-a", "shard-b", "shard-c"];
    let refs: Vec<&Shard> = shards.iter().collect();
    let before = w.settle(&ids, N, Duration::from_secs(120), &refs).await?;
    let lead = leader(&w.leases).await?.context("no leader")?;

    // SIGKILL a shard that is not the sharder: no release; its objects move once its
    // Lease has expired on the sharder's clock.
    let victim_i = shards.iter().position(|s| s.identity != lead).unwrap();
    let victim = shards.remove(victim_i);
    let victim_id = victim.identity.clone();
    let (p50, max, taken) = kill_and_measure(&w, victim, &before, &shards).await?;
    eprintln!("SIGKILL {victim_id}: {taken} objects taken over, gap p50 {p50:?} max {max:?}");
    assert!(max <= LEASE * 2, "taken over within 2× the lease: {max:?}");
    assert!(
        max >= LEASE - Duration::from_secs(2),
        "not before the Lease expired: {max:?}"
    );
    let live: Vec<&str> = shards.iter().map(|s| s.identity.as_str()).collect();
    let refs: Vec<&Shard> = shards.iter().collect();
    let two = w.settle(&live, N, Duration::from_secs(60), &refs).await?;

    // SIGSTOP the shard that is not the sharder past its lease, edit its objects while
    // it is frozen, then SIGCONT: it must write nothing, and leave.
    let frozen_i = shards.iter().position(|s| s.identity != lead).unwrap();
    let frozen_id = shards[frozen_i].identity.clone();
    let its: Vec<String> = two
        .iter()
        .filter(|(_, o)| **o == frozen_id)
        .map(|(n, _)| n.clone())
        .collect();
    anyhow::ensure!(!its.is_empty(), "{frozen_id} owned nothing");
    shards[frozen_i].signal("STOP")?;
    let stopped_at = SystemTime::now();
    for (i, name) in its.iter().enumerate() {
        let patch = serde_json::json!({"spec": {"replicas": 2 + (i % 2) as i32}});
        w.apps
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let others: Vec<&str> = live.iter().copied().filter(|i| *i != frozen_id).collect();
    let refs: Vec<&Shard> = shards.iter().collect();
    let t = Instant::now();
    w.settle(&others, N, Duration::from_secs(90), &refs).await?;
    eprintln!(
        "SIGSTOP {frozen_id}: its {} objects moved after {:?}",
        its.len(),
        t.elapsed()
    );
    // Well past the lease on every clock, then resume.
    tokio::time::sleep(Duration::from_secs(3)).await;
    shards[frozen_i].signal("CONT")?;
    let resumed_at = SystemTime::now();
    let status = tokio::time::timeout(Duration::from_secs(30), shards[frozen_i].child.wait())
        .await
        .context("the resumed shard did not stop")??;
    assert!(!status.success(), "a lapsed shard exits with an error");
    let log = std::fs::read_to_string(&shards[frozen_i].log)?;
    assert!(
        log.contains("membership Lease lapsed"),
        "{}",
        shards[frozen_i].log_tail(40)
    );
    eprintln!(
        "SIGCONT: {} writes the fence refused after resuming",
        log.matches("shard fence closed").count()
    );
    eventually("every status current", Duration::from_secs(60), || async {
        statuses_current(&w.apps)
            .await
            .map(|done| done.then_some(()))
            .map_err(failure)
    })
    .await?;

    let events = w.cp.audit_events()?;
    let stopped = k8s_openapi::jiff::Timestamp::try_from(stopped_at)?;
    let after_freeze: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| {
            e["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.ends_with(&format!("shard/{frozen_id}")))
        })
        .filter(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t > stopped)
        })
        .collect();
    eprintln!(
        "SIGCONT after {:?} frozen: {} write requests from {frozen_id} after the freeze",
        resumed_at.duration_since(stopped_at).unwrap_or_default(),
        after_freeze.len()
    );
    assert!(
        after_freeze.is_empty(),
        "the frozen shard wrote after it resumed: {after_freeze:?}"
    );
    let bad = interleavings(&writes(&events));
    assert!(
        bad.is_empty(),
        "objects written by two shards at once: {bad:?}"
    );
    for s in &mut shards {
        let _ = s.signal("TERM");
        let _ = tokio::time::timeout(Duration::from_secs(40), s.child.wait()).await;
    }
    Ok(())
}

/// The shard that runs the sharder (the leader) is SIGKILLed: another replica must win
/// the leader Lease (after it expires) and then see the dead member's Lease expire on its
/// own clock, so its objects move within about twice the lease duration.
#[tokio::test]
async fn a_killed_sharder_is_replaced_and_its_objects_taken_over() -> anyhow::Result<()> {
    let w = world().await?;
    const N: usize = 30;
    let mut shards = vec![
        w.spawn("shard-a")?,
        w.spawn("shard-b")?,
        w.spawn("shard-c")?,
    ];
    for i in 0..N {
        create(&w.apps, &app(&format!("app-{i:02}"), "nginx:1.27", 1)).await?;
    }
    let ids = ["shard-a", "shard-b", "shard-c"];
    let refs: Vec<&Shard> = shards.iter().collect();
    let before = w.settle(&ids, N, Duration::from_secs(120), &refs).await?;
    let lead = leader(&w.leases).await?.context("no leader")?;
    let i = shards.iter().position(|s| s.identity == lead).unwrap();
    let victim = shards.remove(i);
    let (p50, max, taken) = kill_and_measure(&w, victim, &before, &shards).await?;
    eprintln!(
        "SIGKILL of the sharder {lead}: {taken} objects taken over, gap p50 {p50:?} max {max:?}"
    );
    assert!(
        max <= LEASE * 2 + Duration::from_secs(5),
        "taken over within about 2× the lease: {max:?}"
    );
    let live: Vec<&str> = shards.iter().map(|s| s.identity.as_str()).collect();
    let refs: Vec<&Shard> = shards.iter().collect();
    w.settle(&live, N, Duration::from_secs(60), &refs).await?;
    let new_leader = leader(&w.leases).await?;
    assert!(
        new_leader.as_deref().is_some_and(|l| live.contains(&l)),
        "{new_leader:?}"
    );
    eventually("every status current", Duration::from_secs(60), || async {
        statuses_current(&w.apps)
            .await
            .map(|done| done.then_some(()))
            .map_err(failure)
    })
    .await?;
    let bad = interleavings(&writes(&w.cp.audit_events()?));
    assert!(
        bad.is_empty(),
        "objects written by two shards at once: {bad:?}"
    );
    for s in &mut shards {
        let _ = s.signal("TERM");
        let _ = tokio::time::timeout(Duration::from_secs(40), s.child.wait()).await;
    }
    Ok(())
}

/// The fence in the client path, against the real API server: open after a renewal, a
/// write goes out; past the renew deadline (10 s, the shipped default) counted from the
/// renewal's send, the write is refused without being sent, as the audit log shows.
#[tokio::test]
async fn the_fence_refuses_a_write_without_sending_it() -> anyhow::Result<()> {
    let w = world().await?;
    create(&w.apps, &app("fenced", "nginx:1.27", 1)).await?;
    let deadline = Duration::from_secs(10);
    let fence = controller::shard::Fence::default();
    let mut config = w.cp.admin_config();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&controller::client::shard_user_agent(
            "appservice-controller",
            "fenced-shard",
        ))?,
    ));
    let client = controller::shard::fenced(kube::Client::try_from(config)?, fence.clone());
    let apps: Api<AppService> = Api::namespaced(client, &w.ns);
    let patch = |v: &str| serde_json::json!({"metadata": {"annotations": {"fence": v}}});
    let params = PatchParams::default();

    // Not a member yet: refused.
    let refused = apps
        .patch("fenced", &params, &Patch::Merge(&patch("0")))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    // Renewed just now: the write goes out; reads are never fenced.
    let now = tokio::time::Instant::now();
    fence.renewed(now, deadline, now);
    apps.patch("fenced", &params, &Patch::Merge(&patch("1")))
        .await?;
    // A shard whose last renewal was sent 11 s ago (frozen since): shut, for good.
    let lapsed = controller::shard::Fence::default();
    let stale = now
        .checked_sub(Duration::from_secs(11))
        .context("clock too young")?;
    lapsed.renewed(stale, deadline, stale);
    let mut config = w.cp.admin_config();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&controller::client::shard_user_agent(
            "appservice-controller",
            "lapsed-shard",
        ))?,
    ));
    let lapsed_apps: Api<AppService> = Api::namespaced(
        controller::shard::fenced(kube::Client::try_from(config)?, lapsed.clone()),
        &w.ns,
    );
    assert!(lapsed_apps.get("fenced").await.is_ok(), "reads pass");
    let refused = lapsed_apps
        .patch("fenced", &params, &Patch::Merge(&patch("2")))
        .await;
    let message = match &refused {
        Err(kube::Error::Service(e)) => e.to_string(),
        other => format!("{other:?}"),
    };
    assert!(message.contains("shard fence closed"), "{message}");
    // A renewal that succeeds after the lapse does not reopen it.
    let later = tokio::time::Instant::now();
    lapsed.renewed(later, deadline, later);
    assert!(
        lapsed_apps
            .patch("fenced", &params, &Patch::Merge(&patch("3")))
            .await
            .is_err()
    );

    let live = w.apps.get("fenced").await?;
    assert_eq!(
        live.annotations().get("fence").map(String::as_str),
        Some("1"),
        "only the write made while the fence was open landed"
    );
    let sent_by_lapsed =
        w.cp.audit_events()?
            .iter()
            .filter(|e| {
                e["userAgent"]
                    .as_str()
                    .is_some_and(|ua| ua.ends_with("shard/lapsed-shard"))
            })
            .count();
    assert_eq!(
        sent_by_lapsed, 0,
        "a fenced write never reaches the API server"
    );
    Ok(())
}

/// One ring of the split: its name, its lease namespace, its selector.
struct RingOf {
    name: &'static str,
    lease_namespace: String,
    selector: &'static str,
}

impl RingOf {
    /// A member of this ring watching every namespace, as a release runs it.
    fn spawn(&self, w: &World, identity: &str) -> anyhow::Result<Shard> {
        spawn_shard(
            w.cp.kubeconfig_path(),
            &[
                "--shard-ring",
                self.name,
                "--lease-namespace",
                &self.lease_namespace,
                "--namespace-selector",
                self.selector,
            ],
            identity,
            w.dir.path(),
        )
    }
}

/// The shard and drain labels (of any ring) on an object.
fn ring_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| {
            k.starts_with(common::names::SHARD_LABEL_PREFIX)
                || k.starts_with(common::names::DRAIN_LABEL_PREFIX)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether every one of the `n` AppServices in `ns`, and each of their Deployments and
/// Services, carries exactly one ring label: `ring`'s, naming one of `live`.
async fn held_by(
    client: &kube::Client,
    ns: &str,
    ring: &str,
    live: &[&str],
    n: usize,
) -> anyhow::Result<bool> {
    let apps: Api<AppService> = Api::namespaced(client.clone(), ns);
    let list = apps.list(&ListParams::default()).await?.items;
    if list.len() != n {
        return Ok(false);
    }
    let key = shard_label(ring);
    let good = |labels: &BTreeMap<String, String>| {
        let mine = ring_labels(labels);
        mine.len() == 1 && mine.get(&key).is_some_and(|o| live.contains(&o.as_str()))
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let deps = deployments.list(&ListParams::default()).await?.items;
    let svcs = services.list(&ListParams::default()).await?.items;
    Ok(list.iter().all(|a| good(a.labels()))
        && deps.len() == n
        && svcs.len() == n
        && deps.iter().all(|d| good(d.labels()))
        && svcs.iter().all(|s| good(s.labels())))
}

async fn label_namespace(client: &kube::Client, ns: &str, canary: bool) -> anyhow::Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let value = canary.then_some("canary");
    let patch = serde_json::json!({"metadata": {"labels": {"operator-upgrade": value}}});
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits until `ns` is held by `ring` (one of `live`), within `secs`.
async fn hold(
    client: &kube::Client,
    ns: String,
    ring: &'static str,
    live: Vec<&'static str>,
    secs: u64,
    procs: &[Shard],
) -> anyhow::Result<()> {
    eventually(
        &format!("{ns} held by {ring} ({live:?})"),
        Duration::from_secs(secs),
        || {
            let (ns, live) = (ns.clone(), live.clone());
            async move {
                held_by(client, &ns, ring, &live, N_PER_NAMESPACE)
                    .await
                    .map(|ok| ok.then_some(()))
                    .map_err(failure)
            }
        },
    )
    .await
    .with_context(|| tails(&procs.iter().collect::<Vec<_>>()))?;
    Ok(())
}

/// AppServices in each namespace of the split.
const N_PER_NAMESPACE: usize = 10;

/// Two releases split the namespaces by a label (each its own ring, with complementary
/// selectors, Leases in its own namespace, watching every namespace): a namespace moved
/// to the canary and back under continuous edits is handed over each time, and once
/// more when the canary is SIGKILLed (a dead ring's AppServices are taken over by the
/// ring its namespace selects). The canary never writes outside its namespaces, and no
/// object is ever written by two shards at once, on the API server's record.
#[tokio::test]
async fn a_namespace_moved_to_the_canary_ring_and_back_is_handed_over_without_overlap()
-> anyhow::Result<()> {
    let w = world().await?;
    let client = w.cp.client();
    let (main_system, canary_system) = (
        w.cp.namespace_with_prefix("main-system").await?,
        w.cp.namespace_with_prefix("canary-system").await?,
    );
    let (team_a, team_b) = (
        w.cp.namespace_with_prefix("team-a").await?,
        w.cp.namespace_with_prefix("team-b").await?,
    );
    let (a, b) = (team_a.to_string(), team_b.to_string());
    let main = RingOf {
        name: "main",
        lease_namespace: main_system.to_string(),
        selector: "operator-upgrade!=canary",
    };
    let canary = RingOf {
        name: "canary",
        lease_namespace: canary_system.to_string(),
        selector: "operator-upgrade=canary",
    };
    const N: usize = N_PER_NAMESPACE;
    let names: Vec<String> = (0..N).map(|i| format!("app-{i:02}")).collect();
    let mut procs = vec![
        main.spawn(&w, "main-0")?,
        main.spawn(&w, "main-1")?,
        canary.spawn(&w, "canary-0")?,
    ];
    for ns in [&a, &b] {
        let apps: Api<AppService> = Api::namespaced(client.clone(), ns);
        for name in &names {
            create(&apps, &app(name, "nginx:1.27", 1)).await?;
        }
    }
    let mains = ["main-0", "main-1"];
    hold(&client, a.clone(), "main", mains.to_vec(), 120, &procs).await?;
    hold(&client, b.clone(), "main", mains.to_vec(), 120, &procs).await?;

    // Continuous edits in both namespaces from here on.
    let stop = Arc::new(AtomicBool::new(false));
    let edits = Arc::new(AtomicU64::new(0));
    let editors = [&a, &b].map(|ns| {
        writer(
            names
                .iter()
                .map(|n| (Api::namespaced(client.clone(), ns), n.clone()))
                .collect(),
            stop.clone(),
            edits.clone(),
            2000,
        )
    });
    under_load(&edits, 10).await?;

    // team-b to the canary, then back.
    for (to_canary, ring, live) in [
        (true, "canary", vec!["canary-0"]),
        (false, "main", mains.to_vec()),
    ] {
        label_namespace(&client, &b, to_canary).await?;
        let t = Instant::now();
        hold(&client, b.clone(), ring, live, 90, &procs).await?;
        eprintln!("{b} moved to {ring} in {:?}", t.elapsed());
        assert!(
            held_by(&client, &a, "main", &mains, N).await?,
            "{a} stays with main while {b} moves"
        );
        under_load(&edits, 10).await?;
    }

    // To the canary once more, then the canary dies and the namespace comes back: the
    // canary's labels stay behind, and main takes them over once the ring is dead.
    label_namespace(&client, &b, true).await?;
    hold(&client, b.clone(), "canary", vec!["canary-0"], 90, &procs).await?;
    let mut dead = procs.pop().context("the canary process")?;
    dead.signal("KILL")?;
    let _ = dead.child.wait().await;
    let killed = Instant::now();
    label_namespace(&client, &b, false).await?;
    hold(&client, b.clone(), "main", mains.to_vec(), 120, &procs).await?;
    let gap = killed.elapsed();
    eprintln!("dead canary ring taken over after {gap:?}");
    assert!(
        gap >= LEASE,
        "taken from a ring whose member Lease had not expired yet: {gap:?}"
    );

    under_load(&edits, 10).await?;
    stop.store(true, Ordering::Relaxed);
    for e in editors {
        e.await?;
    }
    for ns in [&a, &b] {
        let apps: Api<AppService> = Api::namespaced(client.clone(), ns);
        eventually("every status current", Duration::from_secs(90), || async {
            statuses_current(&apps)
                .await
                .map(|done| done.then_some(()))
                .map_err(failure)
        })
        .await
        .with_context(|| tails(&procs.iter().collect::<Vec<_>>()))?;
    }

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &b);
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    let released = reasons.iter().filter(|r| *r == "ShardReleased").count();
    assert!(
        released >= N,
        "{released} ShardReleased Events in {b} for {N} AppServices"
    );

    // The API server's record: no object written by two shards at once, and the canary
    // wrote only in team-b (and its own lease namespace).
    let audit = w.cp.audit_events()?;
    let recorded = writes(&audit);
    let bad = interleavings(&recorded);
    assert!(
        bad.is_empty(),
        "objects written by two shards at once: {bad:?}"
    );
    let canary_writes: Vec<&Write> = recorded
        .iter()
        .filter(|w| w.shard.as_deref() == Some("canary-0"))
        .collect();
    assert!(
        !canary_writes.is_empty(),
        "the canary's writes are in the audit log"
    );
    let outside: Vec<&&Write> = canary_writes
        .iter()
        .filter(|w| {
            !w.object.contains(&format!("/{b}/"))
                && !w.object.contains(&format!("/{}/", canary.lease_namespace))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "the canary wrote outside its namespaces: {outside:?}"
    );
    eprintln!(
        "audit: {} canary writes, {} writes in all; edits made: {}",
        canary_writes.len(),
        recorded.len(),
        edits.load(Ordering::Relaxed)
    );
    for s in &mut procs {
        let _ = s.signal("TERM");
        let _ = tokio::time::timeout(Duration::from_secs(40), s.child.wait()).await;
    }
    Ok(())
}

/// The AppService whose pass is held in the middle.
const HELD: &str = "held";

/// How the ring of the mid-pass tests divides AppServices.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Alone {
    /// By labels: a canary ring (a namespace selector that matches the test's namespace).
    Labelled,
    /// By namespace buckets: the member alone serves every bucket.
    Buckets,
}

/// The selector of the `Labelled` rings: every namespace not labelled for a canary.
const EVERY_NAMESPACE: &str = "operator-upgrade notin (canary)";

/// A second member joining while the owner's pass of `held` is stopped in the middle, at
/// the write `hold_if` picks (the owner runs in this process behind a client that holds
/// that request until released: the timing is made, not hoped for).
///
/// * `Labelled`: a drain arrives. The pass cannot be acknowledged while it runs, so the
///   sharder must leave `held` with its owner, and hand over the rest of the move
///   meanwhile; once the write goes out and the pass ends, the owner acknowledges and the
///   new shard converges it with the edit.
/// * `Buckets`: the owner served every bucket. It lets the bucket of the test's namespace
///   go at once (the new member is chosen so that the ring gives it that bucket), but
///   keeps its claim until the held write is no longer in flight; meanwhile the new
///   member writes nothing there. Then it takes the bucket and converges `held` with the
///   edit.
///
/// Either way the audit log shows no object written by two shards at once.
async fn a_drain_in_the_middle_of_a_pass(
    hold_if: harness::recording::HoldIf,
    alone: Alone,
) -> anyhow::Result<()> {
    let w = world().await?;
    let others: Vec<String> = (0..6).map(|i| format!("other-{i}")).collect();
    for name in others.iter().map(String::as_str).chain([HELD]) {
        create(&w.apps, &app(name, "nginx:1.27", 1)).await?;
    }
    // The owner "a", in process, with the User-Agent of a shard (for the audit oracle).
    let mut config = w.cp.admin_config();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&controller::client::shard_user_agent(
            "appservice-controller",
            "a",
        ))?,
    ));
    let (client, hold) = harness::holding(kube::Client::try_from(config)?, &w.ns, hold_if);
    let mut a_config = controller::Config::for_namespace(&w.ns);
    a_config.lease_namespace = w.lease_ns.clone();
    a_config.sharding = true;
    a_config.leader_election = true;
    a_config.identity = Some("a".to_owned());
    let extra: &[&str] = match alone {
        Alone::Labelled => {
            a_config.namespace_selector = Some(
                controller::shard::namespaces::NamespaceSelector::parse(EVERY_NAMESPACE)
                    .map_err(anyhow::Error::msg)?,
            );
            &["--namespace-selector", EVERY_NAMESPACE]
        }
        Alone::Buckets => &[],
    };
    let served = Arc::new(controller::shard::served::Served::default());
    let hooks = controller::Hooks {
        served: served.clone(),
        ..controller::Hooks::default()
    };
    // Held only from the edit on: first a converges everything.
    hold.release();
    let a = support::start_controller_hooks(client, a_config, hooks);
    match alone {
        Alone::Labelled => {
            w.settle(&["a"], 7, Duration::from_secs(120), &[]).await?;
        }
        Alone::Buckets => {
            w.converged_by_buckets(&["a"], Duration::from_secs(120), &[])
                .await?;
        }
    }
    eventually("statuses current", Duration::from_secs(60), || async {
        Ok::<_, harness::poll::Failure>(
            statuses_current(&w.apps)
                .await
                .map_err(failure)?
                .then_some(()),
        )
    })
    .await?;
    assert!(
        hold.held().is_empty(),
        "held before the edit: {:?}",
        hold.held()
    );

    // The edit: a's pass of `held` stops at the held write.
    hold.arm();
    w.edit_held(2).await?;
    eventually(
        "the pass of held at its held write",
        Duration::from_secs(60),
        || async { Ok::<_, harness::poll::Failure>((!hold.held().is_empty()).then_some(())) },
    )
    .await?;

    // A second shard whose share includes `held` and at least one other (by buckets: the
    // bucket of the test's namespace).
    let key = |name: &str| controller::shard::ring::key(&w.ns, name);
    let b = (0..1000)
        .map(|i| format!("b-{i}"))
        .find(|b| {
            let ring = controller::shard::ring::Ring::new(["a", b.as_str()]);
            match alone {
                Alone::Labelled => {
                    ring.owner(&key(HELD)) == Some(b.as_str())
                        && others
                            .iter()
                            .any(|o| ring.owner(&key(o)) == Some(b.as_str()))
                }
                Alone::Buckets => assigned(&ring, b).contains_namespace(&w.ns),
            }
        })
        .context("no identity takes held and another")?;
    let ring = controller::shard::ring::Ring::new(["a", b.as_str()]);
    let moving: Vec<&String> = others
        .iter()
        .filter(|o| ring.owner(&key(o)) == Some(b.as_str()))
        .collect();
    let shard_b = w.spawn_with(&b, extra)?;
    let (owner, drain) = (shard_label(RING), drain_label(RING));
    if alone == Alone::Buckets {
        // a lets the bucket go as soon as it sees b (no pass runs for it any more, no
        // write is sent), but its claim stays until the held write is no longer in flight.
        eventually(
            "a letting the bucket go",
            Duration::from_secs(60),
            || async {
                Ok::<_, harness::poll::Failure>(
                    (!served.allowed().contains_namespace(&w.ns)).then_some(()),
                )
            },
        )
        .await
        .with_context(|| tails(&[&shard_b]))?;
        // The claim stands while the held write is in flight: released only after it.
        let a_lease = w
            .leases
            .get(&common::names::shard_lease_name(RING, "a"))
            .await?;
        let claimed = a_lease
            .annotations()
            .get(ANNOTATION)
            .and_then(|v| Buckets::from_hex(v))
            .unwrap_or(Buckets::NONE);
        assert!(
            claimed.contains_namespace(&w.ns),
            "a's claim left while its held write is in flight: {claimed:?}"
        );
        assert!(!hold.held().is_empty(), "the write is still held");
    }
    if alone == Alone::Labelled {
        // The rest of the move is handed over (b owns them and their children) while `held`
        // is drained and waits for its owner.
        eventually(
            "the others moved while held waits",
            Duration::from_secs(120),
            || async {
                for name in &moving {
                    let app = w.apps.get(name).await.map_err(failure)?;
                    let d = w.deployments.get(name).await.map_err(failure)?;
                    let current = app.status.as_ref().and_then(|s| s.observed_generation)
                        == app.metadata.generation;
                    if app.labels().get(&owner) != Some(&b)
                        || d.labels().get(&owner) != Some(&b)
                        || !current
                    {
                        return Ok(None);
                    }
                }
                let held = w.apps.get(HELD).await.map_err(failure)?;
                Ok(held.labels().contains_key(&drain).then_some(()))
            },
        )
        .await
        .with_context(|| tails(&[&shard_b]))?;
        let held = w.apps.get(HELD).await?;
        assert_eq!(
            held.labels().get(&owner).map(String::as_str),
            Some("a"),
            "moved during a's pass"
        );
        let d = w.deployments.get(HELD).await?;
        assert_eq!(
            d.labels().get(&owner).map(String::as_str),
            Some("a"),
            "its Deployment moved during a's pass"
        );
        let by_b: Vec<Write> = writes(&w.cp.audit_events()?)
            .into_iter()
            .filter(|x| {
                x.shard.as_deref() == Some(b.as_str()) && x.object.ends_with(&format!("/{HELD}"))
            })
            .collect();
        assert!(
            by_b.is_empty(),
            "{b} wrote {HELD} during a's pass: {by_b:?}"
        );
    }

    // The write goes out, the pass ends, a acknowledges (or lets its claim go), b
    // converges the edit.
    hold.release();
    match alone {
        Alone::Labelled => {
            w.settle(&["a", &b], 7, Duration::from_secs(120), &[&shard_b])
                .await?;
        }
        Alone::Buckets => {
            let serving = w
                .converged_by_buckets(&["a", &b], Duration::from_secs(120), &[&shard_b])
                .await?;
            assert_eq!(serving, b, "the ring gives {b} the namespace's bucket");
        }
    }
    w.held_converged(2)
        .await
        .with_context(|| tails(&[&shard_b]))?;
    if alone == Alone::Buckets {
        // a's held write may have finished the edit's work before it let go: one more
        // edit, for the new shard.
        w.edit_held(3).await?;
        w.held_converged(3)
            .await
            .with_context(|| tails(&[&shard_b]))?;
    }
    let events = w.cp.audit_events()?;
    let all = writes(&events);
    assert!(
        all.iter()
            .any(|x| x.shard.as_deref() == Some(b.as_str())
                && x.object.ends_with(&format!("/{HELD}"))),
        "{b} never wrote {HELD}: the handover was not exercised"
    );
    match alone {
        Alone::Labelled => {
            let violations = interleavings(&all);
            assert!(
                violations.is_empty(),
                "written by two shards at once: {violations:?}"
            );
        }
        Alone::Buckets => {
            // Nobody else wrote while a claimed the bucket, and every write fell inside
            // its writer's claims.
            let during = writes_during_claims(&events, &w.lease_ns, &w.ns, "a")?;
            assert!(
                during.is_empty(),
                "written while a claimed the bucket: {during:?}"
            );
            let (checked, violations) = claim_violations(&events, &w.lease_ns);
            assert!(checked > 7, "the members' writes are in the audit log");
            assert!(violations.is_empty(), "{violations:#?}");
        }
    }
    a.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_drain_while_the_owner_applies_a_child_waits_for_the_pass() -> anyhow::Result<()> {
    a_drain_in_the_middle_of_a_pass(
        |r| {
            r.method() == http::Method::PATCH
                && r.uri().path().ends_with(&format!("/deployments/{HELD}"))
        },
        Alone::Labelled,
    )
    .await
}

#[tokio::test]
async fn a_member_joining_while_the_one_alone_applies_a_child_writes_nothing_until_its_claim_went()
-> anyhow::Result<()> {
    a_drain_in_the_middle_of_a_pass(
        |r| {
            r.method() == http::Method::PATCH
                && r.uri().path().ends_with(&format!("/deployments/{HELD}"))
        },
        Alone::Buckets,
    )
    .await
}

#[tokio::test]
async fn a_drain_while_the_owner_writes_status_waits_for_the_pass() -> anyhow::Result<()> {
    a_drain_in_the_middle_of_a_pass(holds_the_status_write, Alone::Labelled).await
}

#[tokio::test]
async fn a_member_joining_while_the_one_alone_writes_status_writes_nothing_until_its_claim_went()
-> anyhow::Result<()> {
    a_drain_in_the_middle_of_a_pass(holds_the_status_write, Alone::Buckets).await
}

fn holds_the_status_write(r: &http::Request<kube::client::Body>) -> bool {
    r.method() == http::Method::PATCH
        && r.uri()
            .path()
            .ends_with(&format!("/appservices/{HELD}/status"))
}

/// The writes in `namespace` (other than Leases) by another member than `member`, or by
/// the sharder, while `member` claimed the namespace's bucket (from the audit log's
/// claim spans, the Leases in `lease_ns`); an error if `member` never claimed it.
fn writes_during_claims(
    events: &[serde_json::Value],
    lease_ns: &str,
    namespace: &str,
    member: &str,
) -> anyhow::Result<Vec<String>> {
    let b = bucket(namespace);
    let spans: Vec<ClaimSpan> = claim_spans(events, lease_ns)
        .into_iter()
        .filter(|s| s.member == member && s.bucket == b)
        .collect();
    anyhow::ensure!(
        !spans.is_empty(),
        "{member} never claimed the bucket of {namespace}"
    );
    let mut during = Vec::new();
    for e in events {
        let r = &e["objectRef"];
        if r["resource"] == "leases"
            || r["namespace"] != namespace
            || e["stage"] != "ResponseComplete"
        {
            continue;
        }
        if !matches!(
            e["verb"].as_str(),
            Some("create" | "update" | "patch" | "delete")
        ) {
            continue;
        }
        if !e["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
        {
            continue;
        }
        let uri = e["requestURI"].as_str().unwrap_or("");
        let writer = shard_of(e);
        let sharder = uri.contains("fieldManager=appservice-sharder");
        if writer.is_none() || (writer.as_deref() == Some(member) && !sharder) {
            continue;
        }
        let (Some(received), Some(done)) = (
            stamp(e, "requestReceivedTimestamp"),
            stamp(e, "stageTimestamp"),
        ) else {
            continue;
        };
        if spans.iter().any(|s| received < s.until && done > s.from) {
            during.push(format!("{} {uri} by {writer:?}", e["verb"]));
        }
    }
    Ok(during)
}

// --- Namespace buckets, with the API server's sharded watch (`--sharded-watch`, gate
// `ShardedListAndWatch`) or filtered by the member itself ---
//
// Shards by namespace: each member claims hash buckets in its Lease, and its watches
// follow them. No label marks a handover, so the oracle reads the claims from the audit
// log (Lease writes with their bodies) and requires, per bucket, that every shard's write
// fell inside a claim of that shard, and that the claims under which two shards wrote
// never overlapped in time.

use controller::shard::buckets::{Buckets, assigned, bucket};
use controller::shard::claims::ANNOTATION;
use k8s_openapi::jiff::Timestamp;

const SW_NAMESPACES: usize = 16;
const SW_PER_NAMESPACE: usize = 3;
/// The shipped renew deadline: a member's writes end within it after its last renewal.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

struct ShardedWorld {
    cp: ControlPlane,
    leases: harness::TestNamespace,
    namespaces: Vec<harness::TestNamespace>,
    dir: tempfile::TempDir,
    /// The API server runs the sharded watch and the members use it.
    gate: bool,
}

impl ShardedWorld {
    async fn start(gate: bool) -> anyhow::Result<ShardedWorld> {
        init();
        let options = Options::plain().with_audit_log();
        let options = if gate {
            options.with_sharded_watch()
        } else {
            options
        };
        let cp = ControlPlane::start(options).await?;
        let leases = cp.namespace_with_prefix("sw-leases").await?;
        let mut namespaces = Vec::new();
        for i in 0..SW_NAMESPACES {
            namespaces.push(cp.namespace_with_prefix(&format!("sw{i:02}")).await?);
        }
        Ok(ShardedWorld {
            cp,
            leases,
            namespaces,
            dir: tempfile::tempdir()?,
            gate,
        })
    }

    /// A shard watching every namespace, its Lease in the lease namespace.
    fn spawn(&self, identity: &str) -> anyhow::Result<Shard> {
        let mut flags = vec!["--lease-namespace", self.leases.as_ref()];
        if self.gate {
            flags.push("--sharded-watch");
        }
        spawn_shard(self.cp.kubeconfig_path(), &flags, identity, self.dir.path())
    }

    fn apps(&self) -> Vec<(Api<AppService>, String)> {
        self.namespaces
            .iter()
            .flat_map(|ns| {
                (0..SW_PER_NAMESPACE).map(move |i| {
                    (
                        Api::namespaced(self.cp.client(), ns.as_ref()),
                        format!("app-{i}"),
                    )
                })
            })
            .collect()
    }

    /// Once the live members' Leases claim exactly what the ring gives each (every
    /// bucket claimed once) and every AppService is converged: the claims.
    async fn settle(
        &self,
        live: &[&str],
        timeout: Duration,
        shards: &[&Shard],
    ) -> anyhow::Result<BTreeMap<String, Buckets>> {
        let leases: Api<Lease> = Api::namespaced(self.cp.client(), self.leases.as_ref());
        let apps = self.apps();
        eventually(
            &format!("claimed by {live:?} and converged"),
            timeout,
            || async {
                let ring = controller::shard::ring::Ring::new(live.iter().copied());
                let mut claims = BTreeMap::new();
                for id in live {
                    let lease = leases
                        .get_opt(&common::names::shard_lease_name(RING, id))
                        .await
                        .map_err(failure)?;
                    let claimed = lease
                        .as_ref()
                        .and_then(|l| l.annotations().get(ANNOTATION))
                        .and_then(|v| Buckets::from_hex(v));
                    if claimed != Some(assigned(&ring, id)) {
                        return Ok(None);
                    }
                    claims.insert((*id).to_owned(), assigned(&ring, id));
                }
                for (api, name) in &apps {
                    let app = api.get(name).await.map_err(failure)?;
                    let current = app.status.as_ref().and_then(|s| s.observed_generation)
                        == app.metadata.generation;
                    let deployments: Api<Deployment> =
                        Api::namespaced(self.cp.client(), &app.namespace().unwrap_or_default());
                    let replicas = deployments
                        .get_opt(name)
                        .await
                        .map_err(failure)?
                        .map(|d| d.spec)
                        .and_then(|s| s.replicas);
                    if !current || replicas != app.spec.replicas {
                        return Ok(None);
                    }
                }
                Ok(Some(claims))
            },
        )
        .await
        .with_context(|| tails(shards))
    }

    /// The API server filters by the hash we compute: the AppServices of one bucket are
    /// exactly those of the namespaces in it.
    async fn the_api_server_filters_by_our_hash(&self) -> anyhow::Result<()> {
        let w = self;
        let first = w.namespaces[0].to_string();
        let one = Buckets::NONE.with(bucket(&first));
        let selected = controller::shard::served::selecting(w.cp.client(), one.selector().unwrap());
        let listed: Vec<String> = Api::<AppService>::all(selected)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|a| a.namespace().unwrap_or_default())
            .collect();
        let expected = w
            .namespaces
            .iter()
            .filter(|n| bucket(n.as_ref()) == bucket(&first))
            .count()
            * SW_PER_NAMESPACE;
        assert_eq!(listed.len(), expected, "{listed:?}");
        assert!(
            listed.iter().all(|n| bucket(n) == bucket(&first)),
            "{listed:?}"
        );
        Ok(())
    }
}

fn stamp(e: &serde_json::Value, field: &str) -> Option<Timestamp> {
    e[field].as_str()?.parse().ok()
}

fn shard_of(e: &serde_json::Value) -> Option<String> {
    let ua = e["userAgent"].as_str()?;
    ua.split_once("shard/").map(|(_, id)| id.to_owned())
}

/// A span of time one member claimed one bucket, from the Lease writes the API server
/// recorded: from the end of the write that added it to the start of the one that
/// removed it (or released the Lease); still claimed at the end of the log, until the
/// renew deadline after its last renewal (its fence shut its writes by then).
#[derive(Debug, Clone)]
struct ClaimSpan {
    member: String,
    bucket: u32,
    from: Timestamp,
    until: Timestamp,
}

fn claim_spans(events: &[serde_json::Value], lease_ns: &str) -> Vec<ClaimSpan> {
    let mut by_member: BTreeMap<String, Vec<(Timestamp, Timestamp, Option<Buckets>)>> =
        BTreeMap::new();
    for e in events {
        let r = &e["objectRef"];
        if r["resource"] != "leases" || r["namespace"] != lease_ns {
            continue;
        }
        if !e["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
        {
            continue;
        }
        let (Some(member), Some(received), Some(done)) = (
            shard_of(e),
            stamp(e, "requestReceivedTimestamp"),
            stamp(e, "stageTimestamp"),
        ) else {
            continue;
        };
        if r["name"].as_str() != Some(&common::names::shard_lease_name(RING, &member)) {
            continue;
        }
        let body = &e["requestObject"];
        let held = body["spec"]["holderIdentity"].as_str() == Some(member.as_str());
        let claims = body["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .and_then(Buckets::from_hex)
            .filter(|_| held);
        by_member
            .entry(member)
            .or_default()
            .push((received, done, claims));
    }
    let mut spans = Vec::new();
    for (member, mut writes) in by_member {
        writes.sort_by_key(|w| w.1);
        let last = writes.last().map(|w| w.0);
        let mut open: BTreeMap<u32, Timestamp> = BTreeMap::new();
        for (received, done, claims) in &writes {
            let claims = claims.unwrap_or(Buckets::NONE);
            for b in open.keys().copied().collect::<Vec<_>>() {
                if !claims.contains(b) {
                    let from = open.remove(&b).unwrap();
                    spans.push(ClaimSpan {
                        member: member.clone(),
                        bucket: b,
                        from,
                        until: *received,
                    });
                }
            }
            for b in claims.iter() {
                open.entry(b).or_insert(*done);
            }
        }
        let end = last.unwrap() + RENEW_DEADLINE;
        for (b, from) in open {
            spans.push(ClaimSpan {
                member: member.clone(),
                bucket: b,
                from,
                until: end,
            });
        }
    }
    spans
}

/// The oracle on the API server's record. Returns (writes checked, violations).
fn claim_violations(events: &[serde_json::Value], lease_ns: &str) -> (usize, Vec<String>) {
    let spans = claim_spans(events, lease_ns);
    let mut violations = Vec::new();
    let mut checked = 0;
    // The spans under which each member wrote, per bucket.
    let mut used: BTreeMap<(u32, String), Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
    for e in events {
        let r = &e["objectRef"];
        if r["resource"] == "leases" || e["stage"] != "ResponseComplete" {
            continue;
        }
        if !e["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
        {
            continue;
        }
        let (Some(member), Some(ns), Some(received), Some(done)) = (
            shard_of(e),
            r["namespace"]
                .as_str()
                .filter(|n| !n.is_empty() && *n != lease_ns),
            stamp(e, "requestReceivedTimestamp"),
            stamp(e, "stageTimestamp"),
        ) else {
            continue;
        };
        checked += 1;
        let b = bucket(ns);
        let span = spans
            .iter()
            .find(|s| s.member == member && s.bucket == b && s.from <= received && done <= s.until);
        match span {
            Some(s) => used.entry((b, member)).or_default().push((s.from, s.until)),
            None => violations.push(format!(
                "{member} wrote {}/{ns}/{} at {received} outside its claims on bucket {b}",
                r["resource"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or("")
            )),
        }
    }
    for ((b, x), xs) in &used {
        for ((b2, y), ys) in &used {
            if b != b2 || x >= y {
                continue;
            }
            for (xf, xu) in xs {
                for (yf, yu) in ys {
                    if xf < yu && yf < xu {
                        violations.push(format!(
                            "bucket {b}: {x} wrote under a claim {xf}..{xu} overlapping {y}'s {yf}..{yu}"
                        ));
                    }
                }
            }
        }
    }
    violations.sort();
    violations.dedup();
    (checked, violations)
}

#[tokio::test]
async fn the_sharded_watch_hands_namespaces_over_through_joins_a_kill_and_a_freeze()
-> anyhow::Result<()> {
    namespaces_handed_over_through_joins_a_kill_and_a_freeze(true).await
}

/// The same ring without the API server's gate (every cluster today): each member
/// watches everything and keeps only its buckets' objects.
#[tokio::test]
async fn without_the_gate_members_hand_namespaces_over_through_joins_a_kill_and_a_freeze()
-> anyhow::Result<()> {
    namespaces_handed_over_through_joins_a_kill_and_a_freeze(false).await
}

/// One member, then two and three under continuous edits, one SIGKILLed, one frozen past
/// its lease: the namespaces are handed over each time, the frozen member writes nothing
/// after it resumes, and on the API server's record no bucket was written by two members
/// at once.
async fn namespaces_handed_over_through_joins_a_kill_and_a_freeze(
    gate: bool,
) -> anyhow::Result<()> {
    let w = ShardedWorld::start(gate).await?;
    let lease_ns = w.leases.to_string();
    let apps = w.apps();
    for (api, name) in &apps {
        create(api, &app(name, "nginx:1.27", 1)).await?;
    }
    if gate {
        w.the_api_server_filters_by_our_hash().await?;
    }
    let used: std::collections::BTreeSet<u32> =
        w.namespaces.iter().map(|n| bucket(n.as_ref())).collect();
    eprintln!("{SW_NAMESPACES} namespaces in {} buckets", used.len());

    let a = w.spawn("shard-a")?;
    let t = Instant::now();
    w.settle(&["shard-a"], Duration::from_secs(120), &[&a])
        .await?;
    eprintln!("1 shard: settled in {:?}", t.elapsed());

    let stop = Arc::new(AtomicBool::new(false));
    let edits = Arc::new(AtomicU64::new(0));
    let editor = writer(apps.clone(), stop.clone(), edits.clone(), 4000);

    under_load(&edits, 20).await?;
    let b = w.spawn("shard-b")?;
    let t = Instant::now();
    let two = w
        .settle(&["shard-a", "shard-b"], Duration::from_secs(120), &[&a, &b])
        .await?;
    eprintln!(
        "1→2: settled in {:?}, buckets {:?}",
        t.elapsed(),
        two.values().map(|b| b.len()).collect::<Vec<_>>()
    );

    under_load(&edits, 20).await?;
    let c = w.spawn("shard-c")?;
    let t = Instant::now();
    w.settle(
        &["shard-a", "shard-b", "shard-c"],
        Duration::from_secs(120),
        &[&a, &b, &c],
    )
    .await?;
    eprintln!("2→3: settled in {:?}", t.elapsed());

    // SIGKILL b: no release; its buckets are taken once its Lease expired.
    under_load(&edits, 20).await?;
    let mut b = b;
    b.signal("KILL")?;
    let _ = b.child.wait().await;
    let t = Instant::now();
    w.settle(&["shard-a", "shard-c"], Duration::from_secs(120), &[&a, &c])
        .await?;
    let taken = t.elapsed();
    eprintln!("SIGKILL shard-b: settled in {taken:?}");
    assert!(
        taken <= LEASE * 2 + Duration::from_secs(10),
        "taken over in {taken:?}"
    );

    // SIGSTOP c past its lease: a takes everything; on SIGCONT c writes nothing (its
    // Lease included) and leaves.
    under_load(&edits, 20).await?;
    let mut c = c;
    c.signal("STOP")?;
    let stopped_at = Timestamp::try_from(SystemTime::now())?;
    w.settle(&["shard-a"], Duration::from_secs(120), &[&a])
        .await?;
    c.signal("CONT")?;
    let status = tokio::time::timeout(Duration::from_secs(40), c.child.wait())
        .await
        .context("the resumed shard did not stop")??;
    assert!(!status.success(), "a lapsed shard exits with an error");

    stop.store(true, Ordering::Relaxed);
    editor.await?;
    w.settle(&["shard-a"], Duration::from_secs(120), &[&a])
        .await?;

    let events = w.cp.audit_events()?;
    // Nothing, not even its Lease: a renewal now would claim again the buckets shard-a
    // took meanwhile without writing shard-c's Lease.
    let after_freeze: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| shard_of(e).as_deref() == Some("shard-c"))
        .filter(|e| stamp(e, "requestReceivedTimestamp").is_some_and(|t| t > stopped_at))
        .collect();
    assert!(
        after_freeze.is_empty(),
        "the frozen shard wrote after it resumed: {after_freeze:?}"
    );
    let (checked, violations) = claim_violations(&events, &lease_ns);
    eprintln!("oracle: {checked} shard writes checked against the claims");
    assert!(
        checked > apps.len() * 3,
        "the shards' writes are in the audit log"
    );
    for id in ["shard-b", "shard-c"] {
        assert!(
            events
                .iter()
                .any(|e| e["objectRef"]["resource"] != "leases"
                    && shard_of(e).as_deref() == Some(id)),
            "{id} never wrote: no handover was exercised"
        );
    }
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
    let mut a = a;
    a.signal("TERM")?;
    let _ = tokio::time::timeout(Duration::from_secs(40), a.child.wait()).await;
    Ok(())
}

/// The field manager of a test that puts ring labels on AppServices by hand.
const STAMP: &str = "label-stamp";

/// The ring labels an AppService can be left with: by a member that stopped in the
/// middle of a drain, by a ring that is gone, or by anyone allowed to write labels.
fn label_states() -> Vec<(&'static str, BTreeMap<String, String>)> {
    let (shard, drain) = (shard_label(RING), drain_label(RING));
    let other = "other-ring";
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    vec![
        ("none", labels(&[])),
        ("live", labels(&[(&shard, "shard-0")])),
        ("gone", labels(&[(&shard, "shard-gone")])),
        ("drain", labels(&[(&drain, "true")])),
        (
            "live-drain",
            labels(&[(&shard, "shard-0"), (&drain, "true")]),
        ),
        (
            "gone-drain",
            labels(&[(&shard, "shard-gone"), (&drain, "true")]),
        ),
        ("other-ring", labels(&[(&shard_label(other), "x")])),
        ("other-drain", labels(&[(&drain_label(other), "true")])),
        (
            "both-rings",
            labels(&[(&shard, "shard-gone"), (&shard_label(other), "x")]),
        ),
    ]
}

impl World {
    /// Puts each AppService `<state>` back into its label state, whatever its labels are,
    /// while no pass is in flight (after the world settled, or its members were killed).
    async fn stamp(&self) -> anyhow::Result<()> {
        let keys = [
            shard_label(RING),
            drain_label(RING),
            shard_label("other-ring"),
            drain_label("other-ring"),
        ];
        for (name, labels) in label_states() {
            let mut patch: BTreeMap<String, Option<String>> =
                keys.iter().map(|k| (k.clone(), None)).collect();
            patch.extend(labels.into_iter().map(|(k, v)| (k, Some(v))));
            let patch = serde_json::json!({"metadata": {"labels": patch}});
            let params = PatchParams {
                field_manager: Some(STAMP.to_owned()),
                ..PatchParams::default()
            };
            self.apps
                .patch(name, &params, &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    /// Sets every AppService's replicas to `replicas` and waits until each has converged:
    /// its Deployment has them and its status is for the edit's generation.
    async fn edit_all_and_converge(&self, replicas: i32, shards: &[&Shard]) -> anyhow::Result<()> {
        let edit = serde_json::json!({"spec": {"replicas": replicas}});
        for (name, _) in label_states() {
            self.apps
                .patch(name, &PatchParams::default(), &Patch::Merge(&edit))
                .await?;
        }
        let t = Instant::now();
        eventually(
            &format!("every label state converged to {replicas} replicas"),
            Duration::from_secs(60),
            || async {
                let mut behind = Vec::new();
                for (name, _) in label_states() {
                    let app = self.apps.get(name).await.map_err(failure)?;
                    let d = self.deployments.get_opt(name).await.map_err(failure)?;
                    let current = app.status.as_ref().and_then(|s| s.observed_generation)
                        == app.metadata.generation;
                    if !current || d.and_then(|d| d.spec.replicas) != Some(replicas) {
                        behind.push(name);
                    }
                }
                if behind.is_empty() {
                    Ok(Some(()))
                } else {
                    Err(format!("not converged: {behind:?}").into())
                }
            },
        )
        .await
        .with_context(|| tails(shards))?;
        eprintln!("{replicas} replicas: converged in {:?}", t.elapsed());
        Ok(())
    }
}

/// One member is the same path as N, and labels mean nothing to a ring divided by
/// buckets: whatever ring labels an AppService was left with (a live, gone or unknown
/// member's, a drain label with or without an owner, another ring's, by a member of an
/// older release or by anyone allowed to write labels), its edits converge with one, two
/// and three members, and after three of four are SIGKILLed at once; no bucket is written
/// by two members at once, and no member writes a ring label.
#[tokio::test]
async fn every_label_state_converges_with_one_two_and_three_members_and_after_a_scale_down()
-> anyhow::Result<()> {
    let w = world().await?;
    for (name, labels) in label_states() {
        let mut a = app(name, "nginx:1.27", 1);
        a.metadata.labels = Some(labels);
        create(&w.apps, &a).await?;
    }
    let s0 = w.spawn_bucketed("shard-0")?;
    w.edit_all_and_converge(2, &[&s0]).await?;
    w.converged_by_buckets(&["shard-0"], Duration::from_secs(60), &[&s0])
        .await?;

    w.stamp().await?;
    let s1 = w.spawn_bucketed("shard-1")?;
    w.edit_all_and_converge(3, &[&s0, &s1]).await?;
    let two = ["shard-0", "shard-1"];
    w.converged_by_buckets(&two, Duration::from_secs(60), &[&s0, &s1])
        .await?;

    w.stamp().await?;
    let mut s2 = w.spawn_bucketed("shard-2")?;
    w.edit_all_and_converge(4, &[&s0, &s1, &s2]).await?;
    let three = ["shard-0", "shard-1", "shard-2"];
    w.converged_by_buckets(&three, Duration::from_secs(60), &[&s0, &s1, &s2])
        .await?;

    // Down to one at once: a fourth member joining, then every member but shard-0
    // SIGKILLed (no release: their claims lapse with their Leases).
    w.stamp().await?;
    let mut s3 = w.spawn_bucketed("shard-3")?;
    w.edit_all_and_converge(5, &[&s0, &s1, &s2, &s3]).await?;
    let mut s1 = s1;
    for s in [&mut s1, &mut s2, &mut s3] {
        s.signal("KILL")?;
        s.child.wait().await?;
    }
    w.stamp().await?;
    w.edit_all_and_converge(6, &[&s0]).await?;
    w.converged_by_buckets(&["shard-0"], Duration::from_secs(60), &[&s0])
        .await?;

    let events = w.cp.audit_events()?;
    let (checked, violations) = claim_violations(&events, &w.lease_ns);
    assert!(
        checked > label_states().len() * 5,
        "the members' writes are in the audit log"
    );
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
    // The labels are the test's alone: no member wrote one.
    for (name, labels) in label_states() {
        let live = w.apps.get(name).await?;
        assert_eq!(
            ring_labels(live.labels()),
            labels,
            "{name}: the ring labels are as the test left them"
        );
    }
    let mut s0 = s0;
    let _ = s0.signal("TERM");
    let _ = tokio::time::timeout(Duration::from_secs(40), s0.child.wait()).await;
    Ok(())
}
