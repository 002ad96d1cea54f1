//! The other rings as one member sees them, and the claims task's step between the rings
//! ([`super::rings`] decides): the member Leases of every ring in the lease namespace and
//! the `--peer-lease-namespaces`, the Namespaces' labels, and what this member has said
//! it has seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::AppService;
use common::names::LABEL_SHARD_RING;
use controller_core::context::Context;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::liveness::{Liveness, Observed};
use super::rings::{self, NamespaceView, Word};
use super::served::Served;

/// What the watches of [`Rings`] report: an error, if any.
pub(super) type Events =
    futures::stream::SelectAll<futures::stream::BoxStream<'static, Option<watcher::Error>>>;

/// The Leases of every ring in `namespace`, followed.
type Followed = (
    reflector::Store<Lease>,
    futures::stream::BoxStream<'static, Option<watcher::Error>>,
);

fn follow_leases(client: &kube::Client, namespace: &str) -> Followed {
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(
            leases_in(client, namespace),
            watcher::Config::default().labels(LABEL_SHARD_RING),
        )
        .default_backoff(),
    )
    .touched_objects()
    .map(Result::err)
    .boxed();
    (store, stream)
}

/// The Leases of `namespace`; of every namespace for [`EVERY_NAMESPACE`].
fn leases_in(client: &kube::Client, namespace: &str) -> Api<Lease> {
    if namespace == EVERY_NAMESPACE {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

/// `--peer-lease-namespaces '*'`: the member Leases of every namespace count. Any
/// namespace's writer of Leases can then keep a ring out of the namespaces it names.
pub const EVERY_NAMESPACE: &str = "*";

/// The rings' side of the task: what the other rings say, what this member has seen.
pub(super) struct Rings {
    /// Where the member Leases of every ring are read.
    namespaces: Vec<String>,
    leases: Vec<reflector::Store<Lease>>,
    others: Liveness<Word>,
    names: reflector::Store<PartialObjectMeta<Namespace>>,
    /// The newest Namespace resourceVersion processed; published once let go of.
    pub(super) seen: u64,
    /// When `seen` was last put in the Lease.
    published_at: Option<Instant>,
    /// The namespaces another live ring selects too, as last reported.
    contested: BTreeSet<String>,
}

impl Rings {
    /// Starts following the Leases and the Namespaces; `Events` must be polled.
    pub(super) fn follow(
        client: &kube::Client,
        config: &controller_core::config::Config,
    ) -> (Rings, Events) {
        let namespaces: BTreeSet<String> = config
            .peer_lease_namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .chain([config.lease_namespace.clone()])
            .collect();
        // Every namespace's watch holds the lease namespace's Leases too.
        let namespaces = if namespaces.contains(EVERY_NAMESPACE) {
            BTreeSet::from([EVERY_NAMESPACE.to_owned()])
        } else {
            namespaces
        };
        let (mut stores, mut streams) = (Vec::new(), Vec::new());
        for ns in &namespaces {
            let (store, stream) = follow_leases(client, ns);
            stores.push(store);
            streams.push(stream);
        }
        let (names, writer) = reflector::store();
        streams.push(
            reflector::reflector(
                writer,
                watcher(
                    Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                    watcher::Config::default(),
                )
                .default_backoff(),
            )
            .touched_objects()
            .map(Result::err)
            .boxed(),
        );
        let rings = Rings {
            namespaces: namespaces.into_iter().collect(),
            leases: stores,
            others: Liveness::default(),
            names,
            seen: 0,
            published_at: None,
            contested: BTreeSet::new(),
        };
        (rings, futures::stream::select_all(streams))
    }

    /// Whether every watch has listed once.
    pub(super) fn ready(&self) -> bool {
        use futures::FutureExt as _;
        self.leases
            .iter()
            .all(|s| s.wait_until_ready().now_or_never().is_some())
            && self.names.wait_until_ready().now_or_never().is_some()
    }

    /// Observes every Lease now: the other rings' are kept here; the Leases of this
    /// member's own ring are returned (the claims' business).
    pub(super) fn observe(
        &mut self,
        config: &controller_core::config::Config,
        now: Instant,
    ) -> Vec<Arc<Lease>> {
        let leases = self.all_leases();
        self.observe_others(&leases, config, now);
        leases
            .into_iter()
            .filter(|l| Self::own_ring(l, config))
            .collect()
    }

    /// Whether a Lease is a member of this member's own ring.
    fn own_ring(lease: &Lease, config: &controller_core::config::Config) -> bool {
        lease.namespace().as_deref() == Some(config.lease_namespace.as_str())
            && lease.labels().get(LABEL_SHARD_RING) == Some(&config.shard_ring)
    }

    fn observe_others(
        &mut self,
        leases: &[Arc<Lease>],
        config: &controller_core::config::Config,
        now: Instant,
    ) {
        let others = leases
            .iter()
            .filter(|l| !Self::own_ring(l, config))
            .map(|l| Observed {
                key: format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any()),
                holder: l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                version: l.resource_version(),
                said: rings::word_of(l),
            });
        self.others.observe(others, now);
    }

    fn all_leases(&self) -> Vec<Arc<Lease>> {
        self.leases.iter().flat_map(|s| s.state()).collect()
    }

    fn live_others(&self, lease_duration: Duration, now: Instant) -> Vec<Word> {
        self.others
            .live(lease_duration, now)
            .into_iter()
            .map(|(_, w)| w.clone())
            .collect()
    }

    /// A quorum read of every ring's Leases (lists, not the watches' caches), observed
    /// now: what the live members of the other rings say.
    async fn reread(
        &mut self,
        client: &kube::Client,
        config: &controller_core::config::Config,
    ) -> Result<Vec<Word>, kube::Error> {
        let mut fresh = Vec::new();
        for ns in &self.namespaces {
            let list = leases_in(client, ns)
                .list(&ListParams::default().labels(LABEL_SHARD_RING))
                .await?;
            fresh.extend(list.items.into_iter().map(Arc::new));
        }
        let now = Instant::now();
        self.observe_others(&fresh, config, now);
        Ok(self.live_others(config.lease_duration, now))
    }

    fn views(&self) -> Vec<NamespaceView> {
        self.names
            .state()
            .iter()
            .map(|n| NamespaceView {
                name: n.name_any(),
                labels: n.labels().clone(),
                version: n.resource_version().and_then(|v| v.parse().ok()),
            })
            .collect()
    }
}

/// What the step between rings acts on: the claims task's parts.
pub(super) struct Parts<'a> {
    pub ctx: &'a Context,
    pub served: &'a Served,
    pub apps: &'a reflector::Store<AppService>,
    pub wanted: &'a watch::Sender<BTreeMap<String, String>>,
    pub lease_client: &'a kube::Client,
}

impl Rings {
    /// The rings' step: lets go of the namespaces this ring may no longer serve (and
    /// waits for their writes in flight), then says so in the Lease ([`rings::SEEN`]),
    /// and takes the namespaces it may newly serve once a quorum read confirms it.
    pub(super) async fn step(
        &mut self,
        parts: &Parts<'_>,
        config: &controller_core::config::Config,
        now: Instant,
    ) {
        let views = self.views();
        let own = config.namespace_selector.as_ref();
        let serving = parts.served.admitted();
        let others = self.live_others(config.lease_duration, now);
        let decision = rings::decide(own, &views, &others, &serving);
        let lose: BTreeSet<String> = serving.difference(&decision.admitted).cloned().collect();
        if !lose.is_empty() {
            info!(
                namespaces = ?lose,
                "letting namespaces go: another ring selects them, or ours no longer does"
            );
            parts.served.release_namespaces(&lose).await;
            crate::handed_over(parts.ctx, parts.apps, |ns| lose.contains(ns));
        }
        let contested = parts
            .apps
            .state()
            .iter()
            .filter(|a| {
                decision
                    .contested
                    .contains(&a.namespace().unwrap_or_default())
            })
            .count();
        let metrics = crate::shard_metrics(parts.ctx);
        for _ in &lose {
            metrics.released();
        }
        metrics.set_foreign(contested);
        if decision.contested != self.contested {
            if !decision.contested.is_empty() {
                warn!(namespaces = ?decision.contested, "namespaces another live ring selects too: served by neither");
            }
            self.contested = decision.contested.clone();
        }
        // Everything up to the newest version in `views` is processed: let go of above.
        let seen = self.seen.max(rings::newest(&views));
        let due = self
            .published_at
            .is_none_or(|t| now.duration_since(t) >= config.retry_period);
        if seen != self.seen && due {
            self.seen = seen;
            self.published_at = Some(now);
            parts
                .wanted
                .send_modify(|w| w.extend(rings::annotations(own, seen)));
        }
        let gain: BTreeSet<String> = decision.admitted.difference(&serving).cloned().collect();
        if gain.is_empty() {
            return;
        }
        // Our Lease (with our selector) was written before this read: a ring that starts
        // now sees ours, and we see every ring that started before.
        let fresh = match self.reread(parts.lease_client, config).await {
            Ok(fresh) => fresh,
            Err(e) => {
                warn!(error = %e, "reading the rings' Leases before taking namespaces; not taking them yet");
                return;
            }
        };
        let again = rings::decide(own, &views, &fresh, &serving);
        let won: BTreeSet<String> = gain.intersection(&again.admitted).cloned().collect();
        if !won.is_empty() {
            info!(
                namespaces = won.len(),
                "taking namespaces no other live ring selects"
            );
            parts.served.admit(&won);
        }
    }
}
