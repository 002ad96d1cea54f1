//! `appservice_controller_shard_*`: what a shard owns, how objects cross its boundary,
//! and what it shares with the other rings.

use controller_core::metrics::Families;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

telemetry::label_values! {
    /// Which way an AppService crossed this shard's boundary.
    pub enum Direction { In => "in", Out => "out" }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: Direction,
}

/// `appservice_controller_shard_*`, registered through the core's `Metrics::families`.
#[derive(Clone, Default)]
pub struct ShardMetrics {
    objects: Gauge,
    handovers: Family<DirectionLabel, Counter>,
    members: Gauge,
    releases: Counter,
    foreign: Gauge,
}

impl Families for ShardMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "shard_objects",
            "AppServices in this shard's cache (the namespaces of its buckets)",
            self.objects.clone(),
        );
        registry.register(
            "shard_handovers",
            "AppServices that entered (in) or left (out) this shard after its initial list",
            self.handovers.clone(),
        );
        registry.register(
            "shard_ring_members",
            "Live members of the ring, as this member sees them",
            self.members.clone(),
        );
        registry.register(
            "shard_releases",
            "Namespaces this member let go because its ring no longer serves them (they left its selector, or another live ring selects them too)",
            self.releases.clone(),
        );
        registry.register(
            "shard_foreign_objects",
            "AppServices in namespaces this ring selects that another live ring selects too (overlapping selectors): served by neither",
            self.foreign.clone(),
        );
        for &direction in Direction::ALL {
            let _ = self.handovers.get_or_create(&DirectionLabel { direction });
        }
    }
}

impl ShardMetrics {
    pub fn set_objects(&self, n: usize) {
        self.objects.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn objects(&self) -> i64 {
        self.objects.get()
    }

    pub fn handover(&self, direction: Direction) {
        self.handovers
            .get_or_create(&DirectionLabel { direction })
            .inc();
    }

    pub fn handovers(&self, direction: Direction) -> u64 {
        self.handovers
            .get_or_create(&DirectionLabel { direction })
            .get()
    }

    pub fn set_members(&self, n: usize) {
        self.members.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn released(&self) {
        self.releases.inc();
    }

    pub fn releases(&self) -> u64 {
        self.releases.get()
    }

    pub fn set_foreign(&self, n: usize) {
        self.foreign.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
