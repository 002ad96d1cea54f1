//! The seam of sharding (the crate `controller_sharding` implements it): which
//! AppServices this replica serves when they are divided among the replicas
//! (`--sharding`). One object answers for the gate of each pass, the check of every write,
//! and what the watches select; the core asks it and never knows how it decides.
//! Without sharding there is no share: the replica serves everything while it leads.
//! What a share runs beside (its membership Lease, following its ring) is
//! [`crate::ring`]'s.

use std::sync::Arc;

use futures::stream::BoxStream;
use tokio::sync::watch;

/// What this replica's watches select, from one change of its share to the next.
#[derive(Clone)]
pub struct Scope {
    /// Grows with each change: a cache reports which scope it has listed.
    pub generation: u64,
    pub select: Select,
}

/// Which objects a scope's watches keep.
#[derive(Clone)]
pub enum Select {
    /// None: an empty list, then nothing.
    Nothing,
    /// Every object.
    Everything,
    /// The API server selects: `shardSelector=<this>` on every list and watch
    /// (`--sharded-watch`, the alpha gate `ShardedListAndWatch`).
    Server(String),
    /// Everything is watched and the objects of the namespaces this says are kept.
    Namespaces(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl Default for Scope {
    fn default() -> Self {
        Scope {
            generation: 0,
            select: Select::Nothing,
        }
    }
}

/// A replica's share of the AppServices.
pub trait Share: Send + Sync {
    /// Whether a pass may run for an object in `namespace` now.
    fn serves(&self, namespace: &str) -> bool;

    /// `client` with every write to a namespaced object checked against the share right
    /// before it is sent, and counted while in flight so the share is let go only between
    /// writes. Writes in `own` (the operator's namespace) pass.
    fn bound(self: Arc<Self>, client: kube::Client, own: &str) -> kube::Client;

    /// What the watches select now, and each change of it.
    fn scope(&self) -> watch::Receiver<Scope>;

    /// A cache that follows the scope: passes wait until it has listed.
    fn register(&self, cache: &'static str);

    /// `cache` has listed the scope of `generation`.
    fn listed(&self, cache: &'static str, generation: u64);

    /// Yields each time more becomes servable: every AppService gets a pass then (the
    /// caches held them, but the gate stopped their passes).
    fn gained(&self) -> BoxStream<'static, ()>;
}

/// Completes when this member's membership, once held, lapses: the process must stop
/// (its fence is shut for good). Never completes without sharding.
pub async fn lapsed(mut member: watch::Receiver<bool>) {
    if member.wait_for(|m| *m).await.is_err() || member.wait_for(|m| !*m).await.is_err() {
        std::future::pending::<()>().await;
    }
}
