//! The server-side sharded watch (`--sharded-watch`, Kubernetes' alpha gate
//! `ShardedListAndWatch`, KEP-5866): the API server filters lists and watches by a hash
//! range of a field, so a shard receives only its own objects without any label on them.
//!
//! The API server hashes with 64-bit FNV-1a ([`super::ring::fnv1a64`]) and supports only
//! `object.metadata.uid` and `object.metadata.namespace`. A child has its own uid, so only
//! the namespace keeps an AppService, its Deployments, Service and Secret on one shard: we
//! shard by namespace. The hash space is cut into [`BUCKETS`] equal buckets (the top six
//! bits of the namespace's hash); each bucket is placed on the ring by the same rendezvous
//! hash as the label mode ([`super::ring::Ring`], key `bucket/<i>`), so a member joining
//! or leaving moves about 1/N of the buckets. Pure.

use super::ring::{Ring, fnv1a64};

/// How many buckets the hash space is cut into: a power of two, at most 64 (a `u64`).
/// 64 keeps the selector at most 32 ranges long.
pub const BUCKETS: u32 = 64;
const SHIFT: u32 = 64 - BUCKETS.trailing_zeros();
/// The field the API server hashes.
pub const FIELD: &str = "object.metadata.namespace";

/// The bucket of a namespace.
pub fn bucket(namespace: &str) -> u32 {
    // The top bits: a shift by SHIFT (58) leaves 0..BUCKETS.
    u32::try_from(fnv1a64(namespace.as_bytes()) >> SHIFT).unwrap_or(0)
}

/// A set of buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Buckets(u64);

impl Buckets {
    pub const NONE: Buckets = Buckets(0);
    /// Every bucket: the whole hash space.
    pub const ALL: Buckets = Buckets(if BUCKETS == 64 {
        u64::MAX
    } else {
        (1 << BUCKETS) - 1
    });

    pub fn contains(self, bucket: u32) -> bool {
        bucket < BUCKETS && self.0 & (1 << bucket) != 0
    }

    pub fn contains_namespace(self, namespace: &str) -> bool {
        self.contains(bucket(namespace))
    }

    #[must_use]
    pub fn with(self, bucket: u32) -> Buckets {
        if bucket < BUCKETS {
            Buckets(self.0 | (1 << bucket))
        } else {
            self
        }
    }

    #[must_use]
    pub fn union(self, other: Buckets) -> Buckets {
        Buckets(self.0 | other.0)
    }

    #[must_use]
    pub fn intersection(self, other: Buckets) -> Buckets {
        Buckets(self.0 & other.0)
    }

    #[must_use]
    pub fn minus(self, other: Buckets) -> Buckets {
        Buckets(self.0 & !other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    pub fn iter(self) -> impl Iterator<Item = u32> {
        (0..BUCKETS).filter(move |b| self.contains(*b))
    }

    /// The form published in a member's Lease: 16 hex digits, bucket 0 the lowest bit.
    pub fn to_hex(self) -> String {
        format!("{:016x}", self.0)
    }

    /// [`Self::to_hex`] read back; `None` for anything else (a hand-edited annotation).
    pub fn from_hex(s: &str) -> Option<Buckets> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(Buckets)
    }

    /// The `shardSelector` of a list or watch that returns exactly the objects in these
    /// buckets: one `shardRange` per run of adjacent buckets, OR'd together; `None` for
    /// no bucket (the API server refuses an empty selector: watch nothing then).
    pub fn selector(self) -> Option<String> {
        let mut terms = Vec::new();
        let mut b = 0;
        while b < BUCKETS {
            if !self.contains(b) {
                b += 1;
                continue;
            }
            let start = b;
            while b < BUCKETS && self.contains(b) {
                b += 1;
            }
            // Exclusive end; the last bucket ends at 2^64, written with 17 digits.
            let lo = u128::from(start) << SHIFT;
            let hi = u128::from(b) << SHIFT;
            terms.push(format!(
                "shardRange({FIELD}, '0x{lo:016x}', '0x{hi:0width$x}')",
                width = if hi > u128::from(u64::MAX) { 17 } else { 16 }
            ));
        }
        (!terms.is_empty()).then(|| terms.join(" || "))
    }
}

/// The buckets `member` owns on `ring` (none if it is not on it).
pub fn assigned(ring: &Ring, member: &str) -> Buckets {
    (0..BUCKETS)
        .filter(|b| ring.owner(&format!("bucket/{b}")) == Some(member))
        .fold(Buckets::NONE, Buckets::with)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_is_the_top_six_bits_of_the_servers_hash() {
        // fnv1a64("ns1") = 0x20fc0b19253e64d5; 0x20 >> 2 = 8.
        assert_eq!(bucket("ns1"), 8);
        assert_eq!(bucket(""), (0xcbf2_9ce4_8422_2325_u64 >> 58) as u32);
        for ns in ["default", "team-a", "kube-system", &"x".repeat(63)] {
            assert!(bucket(ns) < BUCKETS);
        }
    }

    #[test]
    fn selectors_merge_adjacent_buckets_and_cover_the_whole_space() {
        assert_eq!(Buckets::NONE.selector(), None);
        let all = (0..BUCKETS).fold(Buckets::NONE, Buckets::with);
        assert_eq!(
            all.selector().unwrap(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"
        );
        let some = Buckets::NONE.with(0).with(1).with(5).with(63);
        assert_eq!(
            some.selector().unwrap(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0800000000000000') \
             || shardRange(object.metadata.namespace, '0x1400000000000000', '0x1800000000000000') \
             || shardRange(object.metadata.namespace, '0xfc00000000000000', '0x10000000000000000')"
        );
        // The worst case, every other bucket: 32 ranges.
        let alternate = (0..BUCKETS).step_by(2).fold(Buckets::NONE, Buckets::with);
        assert_eq!(
            alternate.selector().unwrap().matches("shardRange").count(),
            32
        );
    }

    #[test]
    fn the_published_form_reads_back_and_refuses_anything_else() {
        let b = Buckets::NONE.with(3).with(40);
        assert_eq!(Buckets::from_hex(&b.to_hex()), Some(b));
        for bad in [
            "",
            "12",
            "zz00000000000000",
            "00000000000000000",
            "+000000000000001",
        ] {
            assert_eq!(Buckets::from_hex(bad), None, "{bad}");
        }
        assert!(!b.contains(64) && b.with(64) == b);
    }

    #[test]
    fn every_bucket_has_one_owner_and_a_new_member_takes_only_its_share() {
        let members = |n: usize| (0..n).map(|i| format!("shard-{i}")).collect::<Vec<_>>();
        for n in 1..=6 {
            let ring = Ring::new(members(n));
            let owned: Vec<Buckets> = members(n).iter().map(|m| assigned(&ring, m)).collect();
            let union = owned.iter().fold(Buckets::NONE, |a, b| a.union(*b));
            assert_eq!(union.len(), BUCKETS, "{n} members cover every bucket");
            assert_eq!(
                owned.iter().map(|b| b.len()).sum::<u32>(),
                BUCKETS,
                "disjoint"
            );
            let grown = Ring::new(members(n + 1));
            let added = format!("shard-{n}");
            let taken = assigned(&grown, &added);
            for (m, before) in members(n).iter().zip(&owned) {
                let after = assigned(&grown, m);
                assert_eq!(after.minus(*before), Buckets::NONE, "{m} gains nothing");
                assert_eq!(
                    before.minus(after).minus(taken),
                    Buckets::NONE,
                    "only to {added}"
                );
            }
            assert!(!taken.is_empty(), "{added} takes some buckets");
        }
        assert_eq!(assigned(&Ring::new(["a"]), "b"), Buckets::NONE);
    }
}
