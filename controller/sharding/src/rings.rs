//! Which namespaces a ring may serve beside the other rings: two releases split the
//! namespaces by a label on the Namespace (`--namespace-selector`, a canary release and
//! its main one), and a namespace relabelled from one to the other is handed over with
//! no two writers, through the rings' member Leases alone. Nothing is written on the
//! objects.
//!
//! Each member publishes in its Lease
//!
//! * [`SELECTOR`]: its ring's selector (none: every namespace, as an older release or a
//!   ring without a selector);
//! * [`SEEN`]: the newest Namespace resourceVersion it has processed, published only
//!   after it has let go, with no write in flight, of every namespace its ring may no
//!   longer serve at that point.
//!
//! A member *admits* a namespace (its passes and writes may touch it, within the buckets
//! its own ring gives it) only while its own selector matches it and no live member of
//! another ring has a selector that matches it; and it takes a namespace it did not serve
//! only once every live member of every other ring has published a [`SEEN`] at or past
//! the namespace's resourceVersion, so whoever served it before has let it go. Two rings
//! whose selectors overlap both leave the overlap alone: safe, and counted
//! (`appservice_controller_shard_foreign_objects`). A member whose Lease expired counts
//! no more; its fence ([`super::fence`]) shut its writes before that.
//!
//! Whose Leases count is a trust question: a tenant who can write a Lease in their own
//! namespace must not stop every ring by publishing an overlapping selector. So only the
//! Leases of the namespaces the admin names (`--peer-lease-namespaces`, and always the
//! member's own lease namespace) are read.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use common::namespace_selector::NamespaceSelector;

/// The annotation of a member's Lease that carries its ring's namespace selector.
pub const SELECTOR: &str = "shard.platform.example.com/namespace-selector";

/// The annotation of a member's Lease that carries the newest Namespace
/// resourceVersion it has processed (see the module's documentation).
pub const SEEN: &str = "shard.platform.example.com/namespaces-seen";

/// The annotations a member's Lease carries for the rings: its selector, and `seen`.
pub fn annotations(selector: Option<&NamespaceSelector>, seen: u64) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([(SEEN.to_owned(), seen.to_string())]);
    if let Some(s) = selector {
        a.insert(SELECTOR.to_owned(), s.to_string());
    }
    a
}

/// What a live member of another ring says in its Lease.
#[derive(Clone, Debug, PartialEq)]
pub struct Word {
    /// The namespaces it may serve: `None` for every namespace (it says none, or says
    /// one that does not parse).
    pub selector: Option<NamespaceSelector>,
    /// The newest Namespace resourceVersion it has processed (0: it says none).
    pub seen: u64,
}

impl Word {
    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }
}

/// What a Lease says for the rings.
pub fn word_of(lease: &Lease) -> Word {
    let annotations = lease.annotations();
    let selector = annotations.get(SELECTOR).and_then(|text| {
        NamespaceSelector::parse(text)
            .inspect_err(|e| {
                tracing::warn!(lease = %lease.name_any(), error = %e, "unreadable namespace selector: taken as every namespace");
            })
            .ok()
    });
    let seen = annotations
        .get(SEEN)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Word { selector, seen }
}

/// One Namespace as the decision needs it.
#[derive(Clone, Debug)]
pub struct NamespaceView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its resourceVersion; one that is not a number never lets the namespace be taken
    /// while another ring is live.
    pub version: Option<u64>,
}

/// The namespaces a member may serve, and those it may not because another ring's
/// selector matches them too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    pub admitted: BTreeSet<String>,
    pub contested: BTreeSet<String>,
}

/// The decision (see the module's documentation): `own` is this ring's selector,
/// `others` what every live member of another ring says, `serving` what this member
/// serves now.
pub fn decide(
    own: Option<&NamespaceSelector>,
    namespaces: &[NamespaceView],
    others: &[Word],
    serving: &BTreeSet<String>,
) -> Admission {
    let mut decision = Admission::default();
    for ns in namespaces {
        if !own.is_none_or(|s| s.matches(&ns.labels)) {
            continue;
        }
        if others.iter().any(|w| w.selects(&ns.labels)) {
            decision.contested.insert(ns.name.clone());
            continue;
        }
        let released_by_all = others
            .iter()
            .all(|w| ns.version.is_some_and(|v| w.seen >= v));
        if serving.contains(&ns.name) || released_by_all {
            decision.admitted.insert(ns.name.clone());
        }
    }
    decision
}

/// The newest resourceVersion among `namespaces`.
pub fn newest(namespaces: &[NamespaceView]) -> u64 {
    namespaces
        .iter()
        .filter_map(|n| n.version)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str, labels: &[(&str, &str)], version: u64) -> NamespaceView {
        NamespaceView {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            version: Some(version),
        }
    }

    fn sel(text: &str) -> NamespaceSelector {
        NamespaceSelector::parse(text).expect("a selector")
    }

    fn word(selector: Option<&str>, seen: u64) -> Word {
        Word {
            selector: selector.map(sel),
            seen,
        }
    }

    fn names(set: &BTreeSet<String>) -> Vec<&str> {
        set.iter().map(String::as_str).collect()
    }

    const CANARY: &str = "operator-upgrade=canary";
    const MAIN: &str = "operator-upgrade!=canary";

    #[test]
    fn alone_a_ring_serves_what_its_selector_matches_at_once() {
        let spaces = [
            ns("a", &[], 5),
            ns("b", &[("operator-upgrade", "canary")], 9),
        ];
        let none = BTreeSet::new();
        let main = decide(Some(&sel(MAIN)), &spaces, &[], &none);
        assert_eq!(names(&main.admitted), ["a"]);
        let every = decide(None, &spaces, &[], &none);
        assert_eq!(names(&every.admitted), ["a", "b"]);
        assert!(every.contested.is_empty());
    }

    #[test]
    fn a_namespace_is_taken_only_once_every_other_ring_has_seen_its_last_change() {
        // b moved to the canary at version 9: main must have processed 9 first.
        let spaces = [ns("b", &[("operator-upgrade", "canary")], 9)];
        let none = BTreeSet::new();
        for (seen, taken) in [(0, false), (8, false), (9, true), (12, true)] {
            let d = decide(
                Some(&sel(CANARY)),
                &spaces,
                &[word(Some(MAIN), seen), word(Some(MAIN), 100)],
                &none,
            );
            assert_eq!(d.admitted.contains("b"), taken, "main has seen {seen}");
        }
        // Every member of every other ring counts, not just one.
        let d = decide(
            Some(&sel(CANARY)),
            &spaces,
            &[word(Some(MAIN), 100), word(Some(MAIN), 3)],
            &none,
        );
        assert!(d.admitted.is_empty());
        // A version that is not a number is never past anyone's.
        let mut odd = spaces.clone();
        odd[0].version = None;
        let d = decide(Some(&sel(CANARY)), &odd, &[word(Some(MAIN), 100)], &none);
        assert!(d.admitted.is_empty());
    }

    #[test]
    fn a_namespace_served_stays_served_across_unrelated_changes() {
        // a changed (version 50) in a way that keeps it main's: main keeps it even
        // though the canary has not seen 50 yet.
        let spaces = [ns("a", &[("team", "x")], 50)];
        let serving = BTreeSet::from(["a".to_owned()]);
        let d = decide(
            Some(&sel(MAIN)),
            &spaces,
            &[word(Some(CANARY), 10)],
            &serving,
        );
        assert_eq!(names(&d.admitted), ["a"]);
    }

    #[test]
    fn a_namespace_leaving_the_selector_is_let_go_whatever_else_holds() {
        let spaces = [ns("b", &[("operator-upgrade", "canary")], 9)];
        let serving = BTreeSet::from(["b".to_owned()]);
        for others in [vec![], vec![word(Some(CANARY), 0)]] {
            let d = decide(Some(&sel(MAIN)), &spaces, &others, &serving);
            assert!(d.admitted.is_empty(), "{others:?}");
        }
    }

    #[test]
    fn overlapping_selectors_leave_the_overlap_to_nobody_and_say_so() {
        let spaces = [
            ns("a", &[], 5),
            ns("b", &[("operator-upgrade", "canary")], 9),
        ];
        let serving = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        // A ring that says no selector (an older release, or a ring without one) counts
        // as selecting every namespace.
        let d = decide(Some(&sel(MAIN)), &spaces, &[word(None, 100)], &serving);
        assert!(d.admitted.is_empty());
        assert_eq!(names(&d.contested), ["a"]);
        let d = decide(Some(&sel(CANARY)), &spaces, &[word(None, 100)], &serving);
        assert_eq!(names(&d.contested), ["b"]);
        // Two rings that both select `b`.
        let d = decide(None, &spaces, &[word(Some(CANARY), 100)], &serving);
        assert_eq!(names(&d.admitted), ["a"]);
        assert_eq!(names(&d.contested), ["b"]);
    }

    #[test]
    fn a_lease_says_its_selector_and_what_it_has_seen() {
        let mut lease = Lease::default();
        assert_eq!(
            word_of(&lease),
            word(None, 0),
            "says nothing: every namespace"
        );
        lease.metadata.annotations = Some(annotations(Some(&sel(CANARY)), 42));
        assert_eq!(word_of(&lease), word(Some(CANARY), 42));
        lease.metadata.annotations = Some(BTreeMap::from([
            (SELECTOR.to_owned(), "a in (".to_owned()),
            (SEEN.to_owned(), "x".to_owned()),
        ]));
        assert_eq!(
            word_of(&lease),
            word(None, 0),
            "unreadable: every namespace, nothing seen"
        );
        assert_eq!(newest(&[ns("a", &[], 3), ns("b", &[], 7)]), 7);
        assert_eq!(newest(&[]), 0);
    }
}
