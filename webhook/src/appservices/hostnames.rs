//! Which AppService holds each host name of `spec.expose.hostnames`, cluster-wide.
//!
//! A host name sends the requests of the shared Gateway to one AppService, so in a
//! cluster shared by tenants it belongs to one AppService only: the webhook refuses a
//! write claiming a host name another AppService holds ([`crate::admission`]). The index
//! lives next to the cached objects and changes with them: an entry's claims are added
//! when it is, released when it is replaced or deleted, and a re-list builds a new index
//! with its new contents, swapped in at once. It covers every cached AppService, those
//! kept by name only included: its host names are read from the watched object (at most
//! [`MAX_EXPOSE_HOSTNAMES`] of at most [`MAX_SUBDOMAIN_LEN`] bytes, the CRD's bounds)
//! without keeping the object. Each change and each lookup costs O(the object's host
//! names); a host name is one string shared by its index slot and every entry claiming it.
//!
//! Two AppServices can claim one host name: both created within the watch's lag, or
//! before the webhook judged host names. Then the oldest by `creationTimestamp` holds it
//! (ties: the namespace, then the name, in byte order), as the controller decides for the
//! HTTPRoutes (`ExposureConflict` for the others); the holder's own writes pass, the
//! others' are refused while they keep claiming it. Deleting the holder frees the host
//! name for the next claimant, or for anyone, when the watch delivers the deletion.

use std::collections::HashMap;
use std::sync::Arc;

use common::limits::{MAX_EXPOSE_HOSTNAMES, MAX_SUBDOMAIN_LEN};
use jiff::Timestamp;
use serde_json::Value;

use super::Key;

/// An AppService claiming host names. The order is who holds a host name first: the
/// oldest, then by namespace and name.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Claimant {
    created: Timestamp,
    key: Key,
}

/// The host names one cached AppService claims, kept in its entry so that exactly these
/// are released when it is replaced or deleted.
#[derive(Debug)]
pub(super) struct Claims {
    claimant: Arc<Claimant>,
    hostnames: Box<[Arc<str>]>,
}

/// Bytes an index slot costs besides its strings (the map's slot and spare capacity).
const SLOT_OVERHEAD: usize = 2 * std::mem::size_of::<(Arc<str>, Vec<Arc<Claimant>>)>();
/// The reference counts an `Arc` allocates before its value.
const ARC_OVERHEAD: usize = 2 * std::mem::size_of::<usize>();

impl Claims {
    /// What these claims cost, in the entry and in the index (counted in full for each
    /// claimant, though a host name claimed twice is stored once).
    pub(super) fn bytes(&self) -> usize {
        let key = &self.claimant.key;
        let claimant =
            ARC_OVERHEAD + std::mem::size_of::<Claimant>() + key.namespace.len() + key.name.len();
        let hostnames: usize = self
            .hostnames
            .iter()
            .map(|host| {
                std::mem::size_of::<Arc<str>>()
                    + ARC_OVERHEAD
                    + host.len()
                    + SLOT_OVERHEAD
                    + std::mem::size_of::<Arc<Claimant>>()
            })
            .sum();
        std::mem::size_of::<Self>() + claimant + hostnames
    }
}

/// Host name → the AppServices claiming it, the holder first.
#[derive(Debug, Default)]
pub(super) struct HostIndex {
    hosts: HashMap<Arc<str>, Vec<Arc<Claimant>>>,
}

impl HostIndex {
    /// Records that `key`, created at `created`, claims `hostnames`; returns what its
    /// entry keeps to release them ([`Self::release`]), `None` for no host name.
    pub(super) fn claim(
        &mut self,
        key: &Key,
        created: Timestamp,
        hostnames: Vec<String>,
    ) -> Option<Box<Claims>> {
        if hostnames.is_empty() {
            return None;
        }
        let claimant = Arc::new(Claimant {
            created,
            key: key.clone(),
        });
        let mut claimed = Vec::with_capacity(hostnames.len());
        for host in hostnames {
            let shared = match self.hosts.get_key_value(host.as_str()) {
                Some((shared, _)) => shared.clone(),
                None => Arc::from(host),
            };
            // One claimant but after a race: no room for more until then.
            let claimants = self
                .hosts
                .entry(shared.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            // A host name listed twice (the CRD refuses it) is claimed once.
            if let Err(at) = claimants.binary_search(&claimant) {
                claimants.insert(at, claimant.clone());
                claimed.push(shared);
            }
        }
        Some(Box::new(Claims {
            claimant,
            hostnames: claimed.into_boxed_slice(),
        }))
    }

    /// Releases what [`Self::claim`] recorded; a host name nobody claims any more leaves.
    pub(super) fn release(&mut self, claims: &Claims) {
        for host in &claims.hostnames {
            let Some(claimants) = self.hosts.get_mut(&**host) else {
                continue;
            };
            if let Ok(at) = claimants.binary_search(&claims.claimant) {
                claimants.remove(at);
            }
            if claimants.is_empty() {
                self.hosts.remove(&**host);
            }
        }
    }

    /// The AppService holding `host`, when one claims it.
    pub(super) fn holder(&self, host: &str) -> Option<&Key> {
        self.hosts
            .get(host)
            .and_then(|claimants| claimants.first())
            .map(|claimant| &claimant.key)
    }

    /// How many host names are claimed.
    pub(super) fn len(&self) -> usize {
        self.hosts.len()
    }
}

/// The host names a watched object (the hub version) claims: `spec.expose.hostnames`,
/// within the CRD's bounds (an entry that could not be stored is skipped, not kept).
pub(super) fn hostnames_of(data: &Value) -> Vec<String> {
    let Some(list) = data
        .pointer("/spec/expose/hostnames")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(Value::as_str)
        .filter(|host| !host.is_empty() && host.len() <= MAX_SUBDOMAIN_LEN)
        .take(MAX_EXPOSE_HOSTNAMES)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{AppServiceCache, DEFAULT_CACHE_BYTES};
    use super::*;
    use kube::api::DynamicObject;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    /// An AppService `namespace/name` exposing `hosts`, created `created` seconds after the
    /// epoch, with an env list of `env` entries (to make it large).
    fn exposing(namespace: &str, name: &str, hosts: &[&str], created: i64) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1",
                         "creationTimestamp": Timestamp::from_second(created).unwrap().to_string()},
            "spec": {"image": "nginx:1.27", "ports": [{"name": "http", "port": 8080}]}
        });
        if !hosts.is_empty() {
            object["spec"]["expose"] = json!({"hostnames": hosts});
        }
        serde_json::from_value(object).unwrap()
    }

    fn holder(cache: &AppServiceCache, host: &str) -> Option<String> {
        cache
            .holder(host)
            .map(|(namespace, name)| format!("{namespace}/{name}"))
    }

    #[test]
    fn host_names_follow_their_appservices() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let mut relist = None;
        cache.handle(
            Event::Apply(exposing(
                "team-a",
                "shop",
                &["shop.example.com", "a.example.com"],
                10,
            )),
            &mut relist,
        );
        assert_eq!(
            holder(&cache, "shop.example.com").as_deref(),
            Some("team-a/shop")
        );
        assert_eq!(
            holder(&cache, "a.example.com").as_deref(),
            Some("team-a/shop")
        );
        assert_eq!(holder(&cache, "b.example.com"), None);
        // The same object drops a host name and adds another.
        cache.handle(
            Event::Apply(exposing(
                "team-a",
                "shop",
                &["shop.example.com", "c.example.com"],
                10,
            )),
            &mut relist,
        );
        assert_eq!(holder(&cache, "a.example.com"), None);
        assert_eq!(
            holder(&cache, "c.example.com").as_deref(),
            Some("team-a/shop")
        );
        // A host name moves: released by one object, claimed by another.
        cache.handle(
            Event::Apply(exposing("team-a", "shop", &["c.example.com"], 10)),
            &mut relist,
        );
        cache.handle(
            Event::Apply(exposing("team-b", "store", &["shop.example.com"], 20)),
            &mut relist,
        );
        assert_eq!(
            holder(&cache, "shop.example.com").as_deref(),
            Some("team-b/store")
        );
        // Deleted: its host names are free.
        cache.handle(
            Event::Delete(exposing("team-b", "store", &["shop.example.com"], 20)),
            &mut relist,
        );
        assert_eq!(holder(&cache, "shop.example.com"), None);
        assert_eq!(
            holder(&cache, "c.example.com").as_deref(),
            Some("team-a/shop")
        );
        // An object without expose claims nothing, and removing expose releases all.
        cache.handle(
            Event::Apply(exposing("team-a", "shop", &[], 10)),
            &mut relist,
        );
        assert_eq!(holder(&cache, "c.example.com"), None);
        assert_eq!(cache.read().hosts.len(), 0);
    }

    #[test]
    fn the_oldest_claimant_holds_a_host_name_until_it_goes() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let mut relist = None;
        // Both admitted within the watch's lag: the younger arrives first.
        for object in [
            exposing("team-b", "b", &["shop.example.com"], 20),
            exposing("team-a", "a", &["shop.example.com"], 10),
            exposing("team-c", "c", &["shop.example.com"], 20),
        ] {
            cache.handle(Event::Apply(object), &mut relist);
        }
        assert_eq!(
            holder(&cache, "shop.example.com").as_deref(),
            Some("team-a/a")
        );
        cache.handle(
            Event::Delete(exposing("team-a", "a", &["shop.example.com"], 10)),
            &mut relist,
        );
        // A tie in age: by namespace.
        assert_eq!(
            holder(&cache, "shop.example.com").as_deref(),
            Some("team-b/b")
        );
        cache.handle(
            Event::Apply(exposing("team-b", "b", &["other.example.com"], 20)),
            &mut relist,
        );
        assert_eq!(
            holder(&cache, "shop.example.com").as_deref(),
            Some("team-c/c")
        );
    }

    #[test]
    fn a_relist_replaces_the_index_when_complete() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let mut relist = None;
        cache.handle(Event::Init, &mut relist);
        cache.handle(
            Event::InitApply(exposing("team-a", "a", &["a.example.com"], 10)),
            &mut relist,
        );
        assert_eq!(holder(&cache, "a.example.com"), None, "not before done");
        cache.handle(Event::InitDone, &mut relist);
        assert_eq!(holder(&cache, "a.example.com").as_deref(), Some("team-a/a"));
        // `a` was deleted while the watch was down; `b` appeared.
        cache.handle(Event::Init, &mut relist);
        cache.handle(
            Event::InitApply(exposing("team-b", "b", &["b.example.com"], 10)),
            &mut relist,
        );
        assert_eq!(holder(&cache, "a.example.com").as_deref(), Some("team-a/a"));
        assert_eq!(holder(&cache, "b.example.com"), None);
        cache.handle(Event::InitDone, &mut relist);
        assert_eq!(holder(&cache, "a.example.com"), None);
        assert_eq!(holder(&cache, "b.example.com").as_deref(), Some("team-b/b"));
    }

    #[test]
    fn objects_kept_by_name_only_keep_their_host_names() {
        // Too large to keep: 1000 env entries.
        let mut big = exposing("team-a", "big", &["big.example.com"], 10);
        big.data["spec"]["env"] = (0..1000)
            .map(|i| json!({"name": format!("VAR_{i}"), "value": "x".repeat(90)}))
            .collect();
        // Over the budget of a small cache.
        let small = AppServiceCache::new(1024);
        small.apply(big);
        small.apply(exposing("team-b", "late", &["late.example.com"], 10));
        assert!(matches!(
            small.lookup("team-a", "big", "1"),
            super::super::Lookup::TooLarge(_)
        ));
        assert!(matches!(
            small.lookup("team-b", "late", "1"),
            super::super::Lookup::OverBudget { .. }
        ));
        assert_eq!(
            holder(&small, "big.example.com").as_deref(),
            Some("team-a/big")
        );
        assert_eq!(
            holder(&small, "late.example.com").as_deref(),
            Some("team-b/late")
        );
    }

    #[test]
    fn held_elsewhere_names_positions_and_holders_but_not_the_object_itself() {
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        cache.apply(exposing(
            "team-a",
            "a",
            &["a.example.com", "both.example.com"],
            10,
        ));
        let hosts = ["new.example.com", "a.example.com", "both.example.com"].map(String::from);
        let taken = cache.held_elsewhere("team-b", "b", &hosts);
        let got: Vec<_> = taken
            .iter()
            .map(|t| (t.index, t.holder_namespace.as_str(), t.holder_name.as_str()))
            .collect();
        assert_eq!(got, [(1, "team-a", "a"), (2, "team-a", "a")]);
        // Its own host names, and the same name in another namespace is another object.
        assert!(cache.held_elsewhere("team-a", "a", &hosts).is_empty());
        assert_eq!(cache.held_elsewhere("team-b", "a", &hosts).len(), 2);
    }

    #[test]
    fn host_names_are_read_within_the_crd_bounds() {
        let long = "a".repeat(MAX_SUBDOMAIN_LEN + 1);
        let hosts: Vec<Value> = (0..40)
            .map(|i| json!(format!("h{i}.example.com")))
            .chain([json!(7), json!(""), json!(long)])
            .collect();
        let data = json!({"spec": {"expose": {"hostnames": hosts}}});
        let read = hostnames_of(&data);
        assert_eq!(read.len(), MAX_EXPOSE_HOSTNAMES);
        assert_eq!(read[0], "h0.example.com");
        assert!(hostnames_of(&json!({"spec": {"expose": {"hostnames": "x"}}})).is_empty());
        assert!(hostnames_of(&json!({"spec": {}})).is_empty());
    }

    /// Many AppServices at the bound: every host name has its holder, each lookup and
    /// change touches only the object's host names, and deleting every object leaves an
    /// empty index and gives back every byte.
    #[test]
    fn many_appservices_at_the_bound() {
        const N: usize = 2_000;
        let cache = AppServiceCache::new(DEFAULT_CACHE_BYTES);
        let hosts = |i: usize| -> Vec<String> {
            (0..MAX_EXPOSE_HOSTNAMES)
                .map(|h| format!("h{h}.app-{i}.{}", "x".repeat(200)))
                .collect()
        };
        let object = |i: usize| {
            let names = hosts(i);
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            exposing(&format!("team-{}", i % 50), &format!("app-{i}"), &names, 10)
        };
        let before = cache.bytes();
        for i in 0..N {
            cache.apply(object(i));
        }
        assert_eq!(cache.read().hosts.len(), N * MAX_EXPOSE_HOSTNAMES);
        for i in (0..N).step_by(97) {
            let owner = (format!("team-{}", i % 50), format!("app-{i}"));
            for host in hosts(i) {
                assert_eq!(cache.holder(&host), Some(owner.clone()));
            }
            assert!(
                cache
                    .held_elsewhere(&owner.0, &owner.1, &hosts(i))
                    .is_empty()
            );
            assert_eq!(
                cache.held_elsewhere("intruder", "x", &hosts(i)).len(),
                MAX_EXPOSE_HOSTNAMES
            );
        }
        // The cache counts what the index holds: at least the host names themselves.
        let per_object = (cache.bytes() - before) / N;
        assert!(per_object > MAX_EXPOSE_HOSTNAMES * 200, "{per_object}");
        let mut relist = None;
        for i in 0..N {
            cache.handle(Event::Delete(object(i)), &mut relist);
        }
        assert_eq!(cache.read().hosts.len(), 0);
        assert_eq!(cache.bytes(), before);
    }
}
