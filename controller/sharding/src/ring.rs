//! Which live shard owns an object: rendezvous (highest-random-weight) hashing of the
//! object's `namespace/name` over the members' identities. Pure; every replica and every
//! release must compute the same answer, so the hash is fixed and written down here:
//!
//! * `fnv1a64(bytes)`: FNV-1a, 64 bit (offset basis `0xcbf29ce484222325`, prime
//!   `0x100000001b3`);
//! * `mix(x)`: the MurmurHash3 64-bit finaliser (`x ^= x >> 33; x *= 0xff51afd7ed558ccd;
//!   x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33`), because FNV alone spreads
//!   inputs that differ only in their last bytes badly;
//! * the weight of member `m` for key `k` is `mix(fnv1a64(k) ^ mix(fnv1a64(m)))`; the
//!   member with the highest weight owns `k`, a tie going to the smaller identity.
//!
//! Removing a member moves exactly the keys it owned (each to its next-highest member);
//! adding one moves to it only the keys it now wins, about 1/N of them: a consistent hash
//! without virtual nodes. The golden values in the tests hold the function fixed.

/// FNV-1a, 64 bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The MurmurHash3 64-bit finaliser: every input bit affects every output bit.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The key an AppService is placed by.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The weight of `member` for `key`.
pub fn weight(key: &str, member: &str) -> u64 {
    mix(fnv1a64(key.as_bytes()) ^ mix(fnv1a64(member.as_bytes())))
}

/// The live members of one ring, ready to place keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    /// Each member's identity with `mix(fnv1a64(identity))`, sorted by identity.
    members: Vec<(String, u64)>,
}

impl Ring {
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<(String, u64)> = members
            .into_iter()
            .map(Into::into)
            .map(|m: String| {
                let h = mix(fnv1a64(m.as_bytes()));
                (m, h)
            })
            .collect();
        members.sort();
        members.dedup_by(|a, b| a.0 == b.0);
        Ring { members }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn contains(&self, member: &str) -> bool {
        self.members.iter().any(|(m, _)| m == member)
    }

    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|(m, _)| m.as_str())
    }

    /// The owner of `key`; `None` when the ring is empty.
    pub fn owner(&self, key: &str) -> Option<&str> {
        let k = fnv1a64(key.as_bytes());
        let mut best: Option<(&str, u64)> = None;
        // Members are sorted by identity, so on a tie the first (smaller) one stays.
        for (m, h) in &self.members {
            let w = mix(k ^ h);
            if best.is_none_or(|(_, bw)| w > bw) {
                best = Some((m.as_str(), w));
            }
        }
        best.map(|(m, _)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| key(&format!("team-{}", i % 37), &format!("app-{i}")))
            .collect()
    }

    fn members(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("appservice-controller-{i}"))
            .collect()
    }

    #[test]
    fn the_hash_is_the_documented_one() {
        // FNV-1a 64 reference values.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(mix(0), 0);
        assert_eq!(weight("team-a/web", "shard-0"), GOLDEN_WEIGHT);
    }

    /// Computed independently (a Python transcription of the definition above).
    const GOLDEN_WEIGHT: u64 = 0x9f48_6782_e4ab_fa00;

    #[test]
    fn golden_assignments_do_not_change_between_releases() {
        let ring = Ring::new(["shard-0", "shard-1", "shard-2"]);
        let got: Vec<&str> = GOLDEN_KEYS.iter().map(|k| ring.owner(k).unwrap()).collect();
        assert_eq!(got, GOLDEN_OWNERS);
    }

    const GOLDEN_KEYS: [&str; 6] = [
        "team-a/web",
        "team-a/api",
        "team-b/web",
        "default/db",
        "payments/ledger",
        "x/y",
    ];
    const GOLDEN_OWNERS: [&str; 6] = [
        "shard-1", "shard-1", "shard-0", "shard-0", "shard-2", "shard-0",
    ];

    #[test]
    fn an_empty_ring_owns_nothing_and_order_and_duplicates_do_not_matter() {
        assert_eq!(Ring::new(Vec::<String>::new()).owner("a/b"), None);
        let a = Ring::new(["b", "a", "c", "a"]);
        let b = Ring::new(["c", "b", "a"]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 3);
        for k in keys(200) {
            assert_eq!(a.owner(&k), b.owner(&k));
        }
    }

    #[test]
    fn keys_are_balanced_within_a_few_percent_for_one_to_eight_members() {
        let keys = keys(10_000);
        for n in 1..=8 {
            let ring = Ring::new(members(n));
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for k in &keys {
                *counts.entry(ring.owner(k).unwrap()).or_default() += 1;
            }
            assert_eq!(counts.len(), n, "every member owns some keys");
            let fair = keys.len() as f64 / n as f64;
            for (m, c) in &counts {
                let off = (*c as f64 - fair).abs() / keys.len() as f64;
                assert!(
                    off < 0.03,
                    "{n} members: {m} owns {c} of {} (fair {fair:.0})",
                    keys.len()
                );
            }
        }
    }

    #[test]
    fn adding_or_removing_a_member_moves_about_one_nth_and_only_to_or_from_it() {
        let keys = keys(10_000);
        for n in 1..=7 {
            let before = Ring::new(members(n));
            let mut grown = members(n);
            let added = format!("appservice-controller-{n}");
            grown.push(added.clone());
            let after = Ring::new(grown);
            let mut moved = 0;
            for k in &keys {
                let (b, a) = (before.owner(k).unwrap(), after.owner(k).unwrap());
                if a != b {
                    moved += 1;
                    assert_eq!(a, added, "a key moves only to the member added");
                }
            }
            let share = moved as f64 / keys.len() as f64;
            let fair = 1.0 / (n + 1) as f64;
            assert!(
                (share - fair).abs() < 0.03,
                "{n}→{}: moved {share:.3}, fair {fair:.3}",
                n + 1
            );
            // The reverse: removing it moves exactly the keys it owned back.
            for k in &keys {
                let (a, b) = (after.owner(k).unwrap(), before.owner(k).unwrap());
                if a != added {
                    assert_eq!(a, b, "a key of a remaining member stays");
                }
            }
        }
    }
}
