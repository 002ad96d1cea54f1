//! The caches image verification reads, cluster-wide: the ImagePolicies and the
//! Namespaces' labels (a policy's `namespaceSelector`). Both are streams the controller
//! polls; what they yield wakes AppServices:
//!
//! * a policy created, deleted, or whose generation moved (keys, patterns, mode)
//!   reconciles every AppService (a status write of the policy does not);
//! * a Namespace whose labels changed reconciles the AppServices in it.
//!
//! A 404 from the API server (the ImagePolicy CRD not installed) means no policy exists
//! ([`Stores::not_served`]): AppServices are not kept waiting for a list that cannot come.
//!
//! The first list wakes nothing: every AppService is reconciled at start anyway. A
//! relist after a watch error wakes everything once (changes may have been missed).

use common::AppService;
use common::image_policy::ImagePolicy;
use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Stores, Verifier};

/// Starts the caches of `verifier`, and returns the streams that wake AppServices:
/// `()` for every AppService, or one AppService of a Namespace that changed.
pub fn watch(
    client: &Client,
    verifier: &Arc<Verifier>,
    apps: Store<AppService>,
) -> (
    impl Stream<Item = ()> + Send + 'static,
    impl Stream<Item = ObjectRef<AppService>> + Send + 'static,
) {
    let (policies, policy_writer) = reflector::store();
    let (namespaces, namespace_writer) = reflector::store();
    verifier.set_stores(Stores {
        policies,
        namespaces,
        not_served: AtomicBool::new(false),
    });
    let owner = Arc::clone(verifier);
    let not_served = move |served: bool| {
        if let Some(stores) = owner.stores.get() {
            stores.not_served.store(!served, Ordering::Relaxed);
        }
    };
    let policy_events = reflector::reflector(
        policy_writer,
        watcher::watcher(
            Api::<ImagePolicy>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        ),
    )
    .default_backoff();
    let mut generations: HashMap<String, i64> = HashMap::new();
    let (mut listed, mut missing) = (false, false);
    let policy_changes = policy_events.filter_map(move |event| {
        let changed = match event {
            Ok(Event::Apply(p)) => {
                let generation = p.metadata.generation.unwrap_or_default();
                generations.insert(p.metadata.name.clone().unwrap_or_default(), generation)
                    != Some(generation)
            }
            Ok(Event::Delete(p)) => {
                generations.remove(p.metadata.name.as_deref().unwrap_or_default());
                true
            }
            Ok(Event::Init) => false,
            Ok(Event::InitApply(p)) => {
                generations.insert(
                    p.metadata.name.clone().unwrap_or_default(),
                    p.metadata.generation.unwrap_or_default(),
                );
                false
            }
            Ok(Event::InitDone) => {
                not_served(true);
                // A relist, or the first list of a CRD installed since: what was decided
                // without these policies is decided again.
                let wake = listed || missing;
                (listed, missing) = (true, false);
                wake
            }
            Err(e) => {
                if is_not_found(&e) {
                    not_served(false);
                    missing = true;
                }
                false
            }
        };
        future::ready(changed.then_some(()))
    });

    let namespace_events = reflector::reflector(
        namespace_writer,
        watcher::watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        ),
    )
    .default_backoff();
    let mut labels: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    let namespace_changes = namespace_events
        .filter_map(move |event| {
            let changed = match event {
                Ok(Event::Apply(ns)) => changed_labels(&mut labels, &ns),
                Ok(Event::InitApply(ns)) => {
                    let _ = changed_labels(&mut labels, &ns);
                    None
                }
                _ => None,
            };
            future::ready(changed)
        })
        .flat_map(move |namespace: String| {
            let apps: Vec<ObjectRef<AppService>> = apps
                .state()
                .iter()
                .filter(|a| a.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .map(|a| ObjectRef::from_obj(&**a))
                .collect();
            futures::stream::iter(apps)
        });
    (policy_changes, namespace_changes)
}

/// Whether a watch error is the API server not serving the resource at all.
fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => controller_core::error::is_not_found(e),
        _ => false,
    }
}

/// The namespace's name when its labels differ from what was seen last.
fn changed_labels(
    seen: &mut HashMap<String, BTreeMap<String, String>>,
    ns: &PartialObjectMeta<Namespace>,
) -> Option<String> {
    let name = ns.metadata.name.clone()?;
    let now = ns.metadata.labels.clone().unwrap_or_default();
    match seen.insert(name.clone(), now.clone()) {
        Some(before) if before == now => None,
        _ => Some(name),
    }
}
