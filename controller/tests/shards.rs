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
//! * Rings split by namespace selectors (`--namespace-selector`, a canary release beside
//!   the main one): per object, in the order storage took the writes (the revision each
//!   answer carries), once the ring its namespace's labels give it to has written it, no
//!   other ring writes it until the labels change again ([`ring_interleavings`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use common::AppService;
use common::names::{drain_label, shard_label};
use harness::{ControlPlane, Options, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
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

/// One write of a shard the audit log recorded.
#[derive(Debug, Clone)]
struct Write {
    object: String,
    /// The shard's identity.
    shard: String,
    /// The revision storage gave it (see [`writes`]).
    revision: u64,
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

/// The successful writes of shards, in the order storage took them: by the revision each
/// answer carries (`metadata.resourceVersion`, the etcd revision of the write; one
/// object's revisions grow with each change). The audit log's own order is the order the
/// answers were completed, which is not it: a namespace's relabel can be stored, reach
/// the new ring's watch and be followed by its write before the relabel's answer is
/// complete. A write answered without a revision (a Status) keeps its place after the
/// writes completed before it; equal revisions (a write that changed nothing answers with
/// the object as it was) keep the log's order.
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
            let shard = shard_of(e)?;
            Some((
                revision,
                Write {
                    object,
                    shard,
                    revision,
                },
            ))
        })
        .collect();
    recorded.sort_by_key(|(revision, _)| *revision);
    recorded.into_iter().map(|(_, w)| w).collect()
}

/// The oracle across rings. `epochs` are the revisions at which the namespace's labels
/// changed, each with the ring they give it to (the first at revision 0), and `ring_of`
/// names a shard's ring. Per object, in storage's order: within an epoch, writes of other
/// rings (the previous owner finishing) may come first, but once the epoch's ring has
/// written the object, no other ring writes it until the next epoch. Returns each
/// violation.
fn ring_interleavings(
    writes: &[Write],
    epochs: &[(u64, &str)],
    ring_of: impl Fn(&str) -> String,
) -> Vec<String> {
    let epoch = |revision: u64| {
        epochs
            .iter()
            .rposition(|(from, _)| *from < revision)
            .unwrap_or(0)
    };
    // Per object: the epoch last seen, and whether its ring has written in it.
    let mut state: HashMap<&str, (usize, bool)> = HashMap::new();
    let mut violations = Vec::new();
    for w in writes {
        let e = epoch(w.revision);
        let st = state.entry(w.object.as_str()).or_insert((e, false));
        if st.0 != e {
            *st = (e, false);
        }
        let owner = epochs.get(e).map_or("", |(_, r)| *r);
        let ring = ring_of(&w.shard);
        if ring == owner {
            st.1 = true;
        } else if st.1 {
            violations.push(format!(
                "{} written by {} ({ring}) at revision {} after {owner} had written it in the epoch from revision {}",
                w.object, w.shard, w.revision, epochs[e].0
            ));
        }
    }
    violations
}

fn recorded(app: &str, shard: &str, revision: Option<u64>) -> serde_json::Value {
    serde_json::json!({
        "stage": "ResponseComplete",
        "responseStatus": {"code": 200},
        "objectRef": {"apiGroup": "platform.example.com", "resource": "appservices",
                      "namespace": "ns", "name": app},
        "requestURI": format!("/apis/platform.example.com/v1beta1/namespaces/ns/appservices/{app}"),
        "userAgent": format!("appservice-controller/0 shard/{shard}"),
        "responseObject": revision.map(|r| serde_json::json!({"metadata": {"resourceVersion": r.to_string()}})),
    })
}

#[test]
fn the_ring_oracle_orders_writes_as_storage_took_them() {
    let ring_of = |id: &str| id.split('-').next().unwrap_or("").to_owned();
    // The namespace moved to the canary at revision 20. main-0 finished a write at 21
    // after the canary's at 22 was answered: in the log's order main wrote after the
    // canary, in storage's it did not.
    let epochs = [(0, "main"), (20, "canary")];
    let log = [
        recorded("x", "main-0", Some(10)),
        recorded("x", "canary-0", Some(22)),
        recorded("x", "main-0", Some(21)),
    ];
    assert!(ring_interleavings(&writes(&log), &epochs, ring_of).is_empty());
    // main after the canary in storage's order: a violation.
    let log = [
        recorded("x", "main-0", Some(10)),
        recorded("x", "canary-0", Some(22)),
        recorded("x", "main-1", Some(23)),
    ];
    let bad = ring_interleavings(&writes(&log), &epochs, ring_of);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("main-1"), "{bad:?}");
    // Back to main at 30: the canary finishing first is fine, after main it is not.
    let epochs = [(0, "main"), (20, "canary"), (30, "main")];
    let log = [
        recorded("x", "canary-0", Some(22)),
        recorded("x", "canary-0", Some(31)),
        recorded("x", "main-0", Some(32)),
        recorded("x", "canary-0", None),
    ];
    let bad = ring_interleavings(&writes(&log), &epochs, ring_of);
    assert_eq!(
        bad.len(),
        1,
        "an answer without a revision stays in its place: {bad:?}"
    );
    // Another object is judged on its own.
    let log = [
        recorded("x", "main-0", Some(10)),
        recorded("y", "canary-0", Some(11)),
    ];
    assert_eq!(
        ring_interleavings(&writes(&log), &[(0, "main")], ring_of).len(),
        0,
        "y's ring never wrote it in the epoch: the canary may (a previous owner finishing)"
    );
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
        leases: Api::namespaced(client, &lease_ns),
        ns,
        lease_ns,
        cp,
        dir: tempfile::tempdir()?,
    })
}

impl World {
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
                let ring = controller::sharding::ring::Ring::new(live.iter().copied());
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
}

/// The fence in the client path, against the real API server: open after a renewal, a
/// write goes out; past the renew deadline (10 s, the shipped default) counted from the
/// renewal's send, the write is refused without being sent, as the audit log shows.
#[tokio::test]
async fn the_fence_refuses_a_write_without_sending_it() -> anyhow::Result<()> {
    let w = world().await?;
    create(&w.apps, &app("fenced", "nginx:1.27", 1)).await?;
    let deadline = Duration::from_secs(10);
    let fence = controller::fence::Fence::default();
    let mut config = w.cp.admin_config();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&controller::client::shard_user_agent(
            "appservice-controller",
            "fenced-shard",
        ))?,
    ));
    let client = controller::fence::fenced(kube::Client::try_from(config)?, fence.clone());
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
    let lapsed = controller::fence::Fence::default();
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
        controller::fence::fenced(kube::Client::try_from(config)?, lapsed.clone()),
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

/// One ring of the split: its name, its lease namespace, its selector, and where the
/// other ring's member Leases are.
struct RingOf {
    name: &'static str,
    lease_namespace: String,
    selector: &'static str,
    peers: String,
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
                "--peer-lease-namespaces",
                &self.peers,
            ],
            identity,
            w.dir.path(),
        )
    }
}

/// The ring of a shard in the split tests: its identity's prefix (`main-0`: `main`).
fn ring_of(identity: &str) -> String {
    identity.split('-').next().unwrap_or_default().to_owned()
}

/// The selectors of the split.
const MAIN: &str = "operator-upgrade!=canary";
const CANARY: &str = "operator-upgrade=canary";

/// Moves `ns` to the canary (or back) and returns the revision of the change.
async fn label_namespace(client: &kube::Client, ns: &str, canary: bool) -> anyhow::Result<u64> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let value = canary.then_some("canary");
    let patch = serde_json::json!({"metadata": {"labels": {"operator-upgrade": value}}});
    let changed = namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    changed
        .resource_version()
        .and_then(|v| v.parse().ok())
        .context("the Namespace's revision")
}

/// The audit log read as it grows: the shards' writes (but their Leases') so far.
struct AuditTail {
    path: std::path::PathBuf,
    offset: u64,
    rest: Vec<u8>,
    events: Vec<serde_json::Value>,
}

impl AuditTail {
    fn new(cp: &ControlPlane) -> Self {
        AuditTail {
            path: cp.audit_log_path(),
            offset: 0,
            rest: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was appended since the last call; a line still being written waits.
    fn read(&mut self) -> anyhow::Result<&[serde_json::Value]> {
        use std::io::{Read as _, Seek as _};
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(std::io::SeekFrom::Start(self.offset))?;
        let mut appended = Vec::new();
        file.read_to_end(&mut appended)?;
        self.offset += appended.len() as u64;
        self.rest.extend(appended);
        while let Some(end) = self.rest.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.rest.drain(..=end).collect();
            let Ok(e) = serde_json::from_slice::<serde_json::Value>(&line) else {
                continue;
            };
            if e["stage"] == "ResponseComplete"
                && e["objectRef"]["resource"] != "leases"
                && shard_of(&e).is_some()
            {
                self.events.push(e);
            }
        }
        Ok(&self.events)
    }
}

/// Waits until every one of the `n` AppServices in `ns` was last written, after
/// `since` (a revision), by a member of `ring`: that ring serves the namespace.
async fn hold(
    client: &kube::Client,
    tail: &mut AuditTail,
    ns: &str,
    ring: &str,
    since: u64,
    secs: u64,
    procs: &[Shard],
) -> anyhow::Result<()> {
    let apps: Api<AppService> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = apps
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|a| a.name_any())
        .collect();
    anyhow::ensure!(names.len() == N_PER_NAMESPACE, "{names:?}");
    let start = Instant::now();
    loop {
        let recorded = writes(tail.read()?);
        let mut last: HashMap<&str, &Write> = HashMap::new();
        for w in &recorded {
            last.insert(w.object.as_str(), w);
        }
        let held = names.iter().all(|name| {
            last.get(format!("platform.example.com/appservices/{ns}/{name}").as_str())
                .is_some_and(|w| w.revision > since && ring_of(&w.shard) == ring)
        });
        if held {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(secs) {
            anyhow::bail!(
                "{ns} not held by {ring} after {secs} s\n{}",
                tails(&procs.iter().collect::<Vec<_>>())
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When a member of `ring` first wrote in `ns` after revision `since`, on the API
/// server's clock.
fn first_write(
    events: &[serde_json::Value],
    ns: &str,
    ring: &str,
    since: u64,
) -> Option<Timestamp> {
    events
        .iter()
        .filter(|e| e["objectRef"]["namespace"] == ns)
        .filter(|e| shard_of(e).is_some_and(|id| ring_of(&id) == ring))
        .filter(|e| {
            e["responseObject"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|r| r > since)
        })
        .filter_map(|e| stamp(e, "requestReceivedTimestamp"))
        .min()
}

/// AppServices in each namespace of the split.
const N_PER_NAMESPACE: usize = 10;

/// Two releases split the namespaces by a label (each its own ring, with complementary
/// selectors, Leases in its own namespace; main reads every namespace's Leases, the
/// canary names main's namespace; both watch every namespace): a namespace moved to the canary and back under continuous edits is
/// handed over each time through the Leases alone, and once more when the canary is
/// SIGKILLed (not before its Lease expired, a lease duration after its last write). Then a ring without a selector joins: every
/// namespace is selected twice, so neither ring serves any, and says so; once it leaves,
/// main serves again. The canary never writes outside its namespace, and on the API
/// server's record no object is written by a ring after the ring its namespace's labels
/// give it to has written it.
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
    // Main names no peer: it reads the Leases of every namespace (`*`, the chart's
    // default for a split); the canary names main's namespace.
    let main = RingOf {
        name: "main",
        lease_namespace: main_system.to_string(),
        selector: MAIN,
        peers: "*".to_owned(),
    };
    let canary = RingOf {
        name: "canary",
        lease_namespace: canary_system.to_string(),
        selector: CANARY,
        peers: main_system.to_string(),
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
    let mut tail = AuditTail::new(&w.cp);
    hold(&client, &mut tail, &a, "main", 0, 120, &procs).await?;
    hold(&client, &mut tail, &b, "main", 0, 120, &procs).await?;

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
            4000,
        )
    });
    under_load(&edits, 10).await?;

    // team-b to the canary, then back, then to the canary again.
    let mut epochs: Vec<(u64, &str)> = vec![(0, "main")];
    for (to_canary, ring) in [(true, "canary"), (false, "main"), (true, "canary")] {
        let changed = label_namespace(&client, &b, to_canary).await?;
        epochs.push((changed, ring));
        let t = Instant::now();
        hold(&client, &mut tail, &b, ring, changed, 90, &procs).await?;
        eprintln!("{b} moved to {ring} in {:?}", t.elapsed());
        under_load(&edits, 10).await?;
    }

    // The canary dies and the namespace comes back: main takes it only once the
    // canary's Lease has expired (it cannot say it let go), never before.
    let mut dead = procs.pop().context("the canary process")?;
    dead.signal("KILL")?;
    let _ = dead.child.wait().await;
    let changed = label_namespace(&client, &b, false).await?;
    epochs.push((changed, "main"));
    hold(&client, &mut tail, &b, "main", changed, 120, &procs).await?;
    let first = first_write(tail.read()?, &b, "main", changed).context("main's first write")?;
    // The canary's last write of its membership Lease (not of the leader Lease it also
    // renews), received before main could have seen it.
    let membership = common::names::shard_lease_name("canary", "canary-0");
    let renewed =
        w.cp.audit_events()?
            .iter()
            .filter(|e| e["objectRef"]["resource"] == "leases" && e["stage"] == "ResponseComplete")
            .filter(|e| e["objectRef"]["name"].as_str() == Some(membership.as_str()))
            .filter(|e| shard_of(e).as_deref() == Some("canary-0"))
            .filter(|e| {
                e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| (200..300).contains(&c))
            })
            .filter_map(|e| stamp(e, "requestReceivedTimestamp"))
            .max()
            .context("the canary's Lease writes")?;
    let gap = first.duration_since(renewed);
    eprintln!("dead canary ring taken over {gap:?} after its last membership Lease write");
    assert!(
        gap >= k8s_openapi::jiff::SignedDuration::try_from(LEASE)?,
        "taken from a ring whose member Lease had not expired yet: {gap:?}"
    );
    under_load(&edits, 10).await?;

    // A release without a selector joins (its Leases where main reads them): it selects
    // every namespace, main too, so neither serves either namespace, and main says so.
    let rogue_shard = spawn_shard(
        w.cp.kubeconfig_path(),
        &[
            "--shard-ring",
            "rogue",
            "--lease-namespace",
            &canary.lease_namespace,
            "--peer-lease-namespaces",
            &main.lease_namespace,
        ],
        "rogue-0",
        w.dir.path(),
    )?;
    let contested = |body: &str| {
        body.lines()
            .find(|l| l.starts_with("appservice_controller_shard_foreign_objects "))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    eventually(
        "main saying its namespaces are selected twice",
        Duration::from_secs(60),
        || async {
            let mut total = 0.0;
            for p in &procs {
                let body = harness::process::http_get(p.ops_port, "/metrics")
                    .await
                    .map_err(failure)?;
                total += contested(&body);
            }
            Ok::<_, harness::poll::Failure>((total >= (2 * N) as f64).then_some(()))
        },
    )
    .await
    .with_context(|| tails(&[&procs[0], &procs[1], &rogue_shard]))?;
    // Once main counts every AppService as contested it has let both namespaces go
    // (it counts after the writes in flight ended): while edits keep coming, nobody
    // writes either namespace until the rogue leaves.
    let contest_from = Timestamp::try_from(SystemTime::now())?;
    under_load(&edits, 20).await?;
    let contest_until = Timestamp::try_from(SystemTime::now())?;
    let mark = writes(tail.read()?)
        .iter()
        .map(|x| x.revision)
        .max()
        .unwrap_or(0);
    let mut rogue_shard = rogue_shard;
    rogue_shard.signal("TERM")?;
    let _ = tokio::time::timeout(Duration::from_secs(40), rogue_shard.child.wait()).await;
    for ns in [&a, &b] {
        hold(&client, &mut tail, ns, "main", mark, 120, &procs).await?;
    }
    let during: Vec<String> = tail
        .read()?
        .iter()
        .filter(|e| {
            let ns = e["objectRef"]["namespace"].as_str().unwrap_or("");
            (ns == a || ns == b)
                && stamp(e, "requestReceivedTimestamp")
                    .is_some_and(|t| contest_from <= t && t <= contest_until)
        })
        .map(|e| format!("{} {}", shard_of(e).unwrap_or_default(), e["requestURI"]))
        .collect();
    assert!(
        during.is_empty(),
        "written while both rings selected the namespaces: {during:#?}"
    );

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

    // The API server's record: no object of team-b written by a ring after the ring its
    // labels gave it to had written it; team-a written by main alone; the canary wrote
    // only in team-b, the rogue nothing.
    let recorded = writes(tail.read()?);
    let in_ns = |ns: &str| -> Vec<Write> {
        recorded
            .iter()
            .filter(|x| x.object.contains(&format!("/{ns}/")))
            .cloned()
            .collect()
    };
    let bad = ring_interleavings(&in_ns(&b), &epochs, ring_of);
    assert!(bad.is_empty(), "written by two rings at once: {bad:#?}");
    let by_others: Vec<Write> = in_ns(&a)
        .into_iter()
        .filter(|x| ring_of(&x.shard) != "main")
        .collect();
    assert!(
        by_others.is_empty(),
        "{a} written outside main: {by_others:?}"
    );
    let canary_writes: Vec<&Write> = recorded
        .iter()
        .filter(|x| ring_of(&x.shard) != "main")
        .collect();
    assert!(
        canary_writes.iter().any(|x| x.shard == "canary-0"),
        "the canary's writes are in the audit log"
    );
    let outside: Vec<&&Write> = canary_writes
        .iter()
        .filter(|x| x.shard != "canary-0" || !x.object.contains(&format!("/{b}/")))
        .collect();
    assert!(
        outside.is_empty(),
        "the canary wrote outside its namespace, or the rogue wrote: {outside:?}"
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

/// What takes the test's namespace from the member alone in the mid-pass tests.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Handover {
    /// The namespace is relabelled for another ring (a canary release).
    Ring,
    /// A second member joins the ring, and the ring gives it the namespace's bucket.
    Buckets,
}

/// The owner "a" (alone in its ring, serving every bucket) has its pass of `held`
/// stopped in the middle, at the write `hold_if` picks (it runs in this process behind a
/// client that holds that request until released: the timing is made, not hoped for),
/// when the namespace is taken from it:
///
/// * `Ring`: the namespace is relabelled for the canary ring, whose member runs. a lets
///   the namespace go at once, but does not say so in its Lease (its `namespaces-seen`
///   stays before the relabel) until the held write is no longer in flight; meanwhile
///   the canary writes nothing there.
/// * `Buckets`: a second member whose share includes the namespace's bucket joins. a lets
///   the bucket go at once, but keeps its claim until the held write is no longer in
///   flight; meanwhile the new member writes nothing there.
///
/// Then the write goes out, and the new owner converges `held` with an edit; the audit
/// log shows no object written by two shards at once.
async fn a_handover_in_the_middle_of_a_pass(
    hold_if: harness::recording::HoldIf,
    handover: Handover,
) -> anyhow::Result<()> {
    let w = world().await?;
    let canary_system = w.cp.namespace_with_prefix("canary-system").await?;
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
    if handover == Handover::Ring {
        a_config.namespace_selector = Some(
            common::namespace_selector::NamespaceSelector::parse(MAIN)
                .map_err(anyhow::Error::msg)?,
        );
        a_config.peer_lease_namespaces = vec![canary_system.to_string()];
    }
    let served = Arc::new(controller::sharding::Served::default());
    let hooks = controller::Hooks {
        share: Some(served.clone() as Arc<dyn controller::ring::Ringed>),
        ..controller::Hooks::default()
    };
    // Held only from the edit on: first a converges everything.
    hold.release();
    let a = support::start_controller_hooks(client, a_config, hooks);
    w.converged_by_buckets(&["a"], Duration::from_secs(120), &[])
        .await?;
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

    let (b, shard_b) = match handover {
        Handover::Buckets => {
            // A second member whose share includes the bucket of the test's namespace.
            let b = (0..1000)
                .map(|i| format!("b-{i}"))
                .find(|b| {
                    let ring = controller::sharding::ring::Ring::new(["a", b.as_str()]);
                    assigned(&ring, b).contains_namespace(&w.ns)
                })
                .context("no identity takes the namespace's bucket")?;
            let shard_b = w.spawn_with(&b, &[])?;
            // a lets the bucket go as soon as it sees b (no pass runs for it any more, no
            // write is sent), but its claim stays until the held write is no longer in
            // flight.
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
            (b, shard_b)
        }
        Handover::Ring => {
            let canary = RingOf {
                name: "canary",
                lease_namespace: canary_system.to_string(),
                selector: CANARY,
                peers: w.lease_ns.clone(),
            };
            let shard_c = canary.spawn(&w, "canary-0")?;
            let changed = label_namespace(&w.cp.client(), &w.ns, true).await?;
            // a lets the namespace go at once (no pass runs for it any more, no write is
            // sent), but says it has seen the relabel only once the held write ended.
            eventually(
                "a letting the namespace go",
                Duration::from_secs(60),
                || async {
                    Ok::<_, harness::poll::Failure>(
                        (!served.admitted().contains(&w.ns)).then_some(()),
                    )
                },
            )
            .await
            .with_context(|| tails(&[&shard_c]))?;
            let a_lease = w
                .leases
                .get(&common::names::shard_lease_name(RING, "a"))
                .await?;
            let seen: u64 = a_lease
                .annotations()
                .get(controller::sharding::rings::SEEN)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            assert!(
                seen < changed,
                "a said it had seen the relabel ({changed}) while its held write is in flight: {seen}"
            );
            ("canary-0".to_owned(), shard_c)
        }
    };
    assert!(!hold.held().is_empty(), "the write is still held");
    let by_b: Vec<Write> = writes(&w.cp.audit_events()?)
        .into_iter()
        .filter(|x| x.shard == b && x.object.contains(&format!("/{}/", w.ns)))
        .collect();
    assert!(by_b.is_empty(), "{b} wrote during a's pass: {by_b:?}");

    // The write goes out, the pass ends, a lets go in its Lease, b converges the edit.
    hold.release();
    if handover == Handover::Buckets {
        let serving = w
            .converged_by_buckets(&["a", &b], Duration::from_secs(120), &[&shard_b])
            .await?;
        assert_eq!(serving, b, "the ring gives {b} the namespace's bucket");
    }
    w.held_converged(2)
        .await
        .with_context(|| tails(&[&shard_b]))?;
    // a's held write may have finished the edit's work before it let go: one more edit,
    // for the new owner.
    w.edit_held(3).await?;
    w.held_converged(3)
        .await
        .with_context(|| tails(&[&shard_b]))?;
    let events = w.cp.audit_events()?;
    let all = writes(&events);
    let in_ns: Vec<&Write> = all
        .iter()
        .filter(|x| x.object.contains(&format!("/{}/", w.ns)))
        .collect();
    assert!(
        in_ns
            .iter()
            .any(|x| x.shard == b && x.object.ends_with(&format!("/{HELD}"))),
        "{b} never wrote {HELD}: the handover was not exercised"
    );
    match handover {
        Handover::Ring => {
            // a never serves the namespace again: each of its writes there came before
            // every one of the canary's, in storage's order.
            let last_a = in_ns
                .iter()
                .filter(|x| x.shard == "a")
                .map(|x| x.revision)
                .max();
            let first_b = in_ns
                .iter()
                .filter(|x| x.shard == b)
                .map(|x| x.revision)
                .min();
            assert!(
                last_a < first_b,
                "a wrote at {last_a:?}, after the canary's first write at {first_b:?}"
            );
        }
        Handover::Buckets => {
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
async fn a_namespace_relabelled_while_its_owner_applies_a_child_moves_after_the_write()
-> anyhow::Result<()> {
    a_handover_in_the_middle_of_a_pass(
        |r| {
            r.method() == http::Method::PATCH
                && r.uri().path().ends_with(&format!("/deployments/{HELD}"))
        },
        Handover::Ring,
    )
    .await
}

#[tokio::test]
async fn a_member_joining_while_the_one_alone_applies_a_child_writes_nothing_until_its_claim_went()
-> anyhow::Result<()> {
    a_handover_in_the_middle_of_a_pass(
        |r| {
            r.method() == http::Method::PATCH
                && r.uri().path().ends_with(&format!("/deployments/{HELD}"))
        },
        Handover::Buckets,
    )
    .await
}

#[tokio::test]
async fn a_namespace_relabelled_while_its_owner_writes_status_moves_after_the_write()
-> anyhow::Result<()> {
    a_handover_in_the_middle_of_a_pass(holds_the_status_write, Handover::Ring).await
}

#[tokio::test]
async fn a_member_joining_while_the_one_alone_writes_status_writes_nothing_until_its_claim_went()
-> anyhow::Result<()> {
    a_handover_in_the_middle_of_a_pass(holds_the_status_write, Handover::Buckets).await
}

fn holds_the_status_write(r: &http::Request<kube::client::Body>) -> bool {
    r.method() == http::Method::PATCH
        && r.uri()
            .path()
            .ends_with(&format!("/appservices/{HELD}/status"))
}

/// The writes in `namespace` (other than Leases) by another member than `member` while
/// `member` claimed the namespace's bucket (from the audit log's
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
        let writer = shard_of(e);
        if writer.is_none() || writer.as_deref() == Some(member) {
            continue;
        }
        let (Some(received), Some(done)) = (
            stamp(e, "requestReceivedTimestamp"),
            stamp(e, "stageTimestamp"),
        ) else {
            continue;
        };
        if spans.iter().any(|s| received < s.until && done > s.from) {
            during.push(format!("{} {} by {writer:?}", e["verb"], e["requestURI"]));
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

use controller::sharding::buckets::{Buckets, assigned, bucket};
use controller::sharding::claims::ANNOTATION;
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
                let ring = controller::sharding::ring::Ring::new(live.iter().copied());
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
        let selected = controller::following::selecting(w.cp.client(), &one.selector().unwrap());
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
    // From here on c runs again. A write c had sent before the stop may reach the API
    // server after `STOP` returned (a busy server reads its sockets late), so the
    // boundary is the resume, not the stop.
    let resumed_at = Timestamp::try_from(SystemTime::now())?;
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
        .filter(|e| stamp(e, "requestReceivedTimestamp").is_some_and(|t| t > resumed_at))
        .collect();
    assert!(
        after_freeze.is_empty(),
        "the frozen shard (stopped at {stopped_at}, resumed at {resumed_at}) wrote after it resumed: {after_freeze:?}"
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
