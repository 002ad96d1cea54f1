//! Which members are live, from their Leases alone: a member is live while its Lease has
//! a holder and its record changed within the lease duration on this process's clock (as
//! the leader election counts it), so no two clocks are compared. What each Lease says
//! besides (the buckets it claims, the namespaces its ring selects) rides along as `T`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// One Lease as last observed.
#[derive(Debug, Clone)]
struct Record<T> {
    holder: Option<String>,
    version: Option<String>,
    /// When this process saw the record change last.
    since: Instant,
    said: T,
}

/// The Leases of other members, by a key (the Lease's namespace and name), and since
/// when each was seen unchanged.
#[derive(Debug)]
pub struct Liveness<T> {
    by_key: HashMap<String, Record<T>>,
}

impl<T> Default for Liveness<T> {
    fn default() -> Self {
        Liveness {
            by_key: HashMap::new(),
        }
    }
}

/// One Lease to observe: its key, holder, resourceVersion, and what it says.
pub struct Observed<T> {
    pub key: String,
    pub holder: Option<String>,
    pub version: Option<String>,
    pub said: T,
}

impl<T> Liveness<T> {
    /// Replaces what is known by `leases`, all observed at `now`: a record whose version
    /// did not change keeps the time it was first seen with it.
    pub fn observe(&mut self, leases: impl IntoIterator<Item = Observed<T>>, now: Instant) {
        let mut seen = HashMap::new();
        for l in leases {
            let since = match self.by_key.get(&l.key) {
                Some(r) if r.version == l.version => r.since,
                _ => now,
            };
            seen.insert(
                l.key,
                Record {
                    holder: l.holder.filter(|h| !h.is_empty()),
                    version: l.version,
                    since,
                    said: l.said,
                },
            );
        }
        self.by_key = seen;
    }

    /// The live members at `now`: their holder identity and what their Lease says.
    pub fn live(&self, lease_duration: Duration, now: Instant) -> Vec<(&str, &T)> {
        self.by_key
            .values()
            .filter(|r| now.duration_since(r.since) < lease_duration)
            .filter_map(|r| r.holder.as_deref().map(|h| (h, &r.said)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key: &str, holder: Option<&str>, version: &str, said: u32) -> Observed<u32> {
        Observed {
            key: key.into(),
            holder: holder.map(Into::into),
            version: Some(version.into()),
            said,
        }
    }

    #[test]
    fn a_member_whose_record_stopped_changing_is_dead() {
        let d = Duration::from_secs(15);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.observe([lease("b", Some("b"), "1", 3)], t0);
        assert_eq!(l.live(d, t0 + Duration::from_secs(14)), vec![("b", &3)]);
        // Unchanged since t0, observed again later: dead after a lease duration.
        l.observe(
            [lease("b", Some("b"), "1", 3)],
            t0 + Duration::from_secs(10),
        );
        assert!(l.live(d, t0 + Duration::from_secs(15)).is_empty());
        // Renewed: live again, counted from when the change was seen.
        l.observe(
            [lease("b", Some("b"), "2", 4)],
            t0 + Duration::from_secs(16),
        );
        assert_eq!(l.live(d, t0 + Duration::from_secs(30)), vec![("b", &4)]);
        // Released (no holder, or an empty one): not a member.
        l.observe([lease("b", None, "3", 4)], t0 + Duration::from_secs(31));
        assert!(l.live(d, t0 + Duration::from_secs(31)).is_empty());
        l.observe([lease("b", Some(""), "4", 4)], t0 + Duration::from_secs(32));
        assert!(l.live(d, t0 + Duration::from_secs(32)).is_empty());
        // Gone from the list: forgotten.
        l.observe([], t0 + Duration::from_secs(33));
        assert!(l.live(d, t0 + Duration::from_secs(33)).is_empty());
    }
}
