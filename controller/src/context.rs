//! The one shared context of reconcile, error policy and the ops server.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{AppService, AppServiceStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::config::Config;
use crate::error::BackoffPolicy;
use crate::external::External;
use crate::metrics::Metrics;
use crate::status::Clock;
use crate::view::{DeploymentView, ServiceView};

/// Initial-list completion of the caches, set from their watch streams.
#[derive(Debug, Default)]
pub struct CacheSync {
    pub appservices: AtomicBool,
    pub deployments: AtomicBool,
    pub services: AtomicBool,
    pub other_deployments: AtomicBool,
    pub other_services: AtomicBool,
}

impl CacheSync {
    pub fn all(&self) -> bool {
        [
            &self.appservices,
            &self.deployments,
            &self.services,
            &self.other_deployments,
            &self.other_services,
        ]
        .iter()
        .all(|f| f.load(Ordering::Relaxed))
    }
}

/// The watch caches reconcile reads from.
pub struct Caches {
    /// Our children (labelled `managed-by=appservice-operator`).
    pub deployments: Store<DeploymentView>,
    pub services: Store<ServiceView>,
    /// The names of Deployments and Services without that label.
    pub other_deployments: Store<PartialObjectMeta<Deployment>>,
    pub other_services: Store<PartialObjectMeta<Service>>,
}

pub struct Context {
    pub client: Client,
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub clock: Box<dyn Clock>,
    /// External resources behind the finalizer.
    pub external: Arc<dyn External>,
    /// Caches of our children (labelled `managed-by=appservice-operator`), as views.
    pub deployments: Store<DeploymentView>,
    pub services: Store<ServiceView>,
    /// The names of Deployments and Services without that label.
    pub other_deployments: Store<PartialObjectMeta<Deployment>>,
    pub other_services: Store<PartialObjectMeta<Service>>,
    /// True while this replica may reconcile.
    pub leading: watch::Receiver<bool>,
    /// Which caches have completed their initial list.
    pub synced: Arc<CacheSync>,
    pub backoff_policy: BackoffPolicy,
    /// Consecutive failures per object; cleared by a successful reconcile.
    failures: Mutex<HashMap<ObjectRef<AppService>, u32>>,
    /// Per object, the last status we wrote and the resourceVersion it was written over.
    written: Mutex<HashMap<ObjectRef<AppService>, (String, AppServiceStatus)>>,
    /// Children we created that our caches have not shown yet (kind, namespace, name).
    created: Mutex<HashSet<ChildKey>>,
}

/// A child of a kind (`"Deployment"`, `"Service"`) in a namespace, by name.
pub type ChildKey = (&'static str, String, String);

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        config: Config,
        recorder: Recorder,
        clock: Box<dyn Clock>,
        metrics: Arc<Metrics>,
        external: Arc<dyn External>,
        caches: Caches,
        leading: watch::Receiver<bool>,
        synced: Arc<CacheSync>,
    ) -> Self {
        Context {
            client,
            config,
            metrics,
            recorder,
            clock,
            external,
            deployments: caches.deployments,
            services: caches.services,
            other_deployments: caches.other_deployments,
            other_services: caches.other_services,
            leading,
            synced,
            backoff_policy: BackoffPolicy::default(),
            failures: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            created: Mutex::new(HashSet::new()),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Every cache has completed its initial list (what `/readyz` reports).
    pub fn is_ready(&self) -> bool {
        self.synced.all()
    }

    /// Records a failure of `key`; returns how many failures preceded it.
    pub fn record_failure(&self, key: &ObjectRef<AppService>) -> u32 {
        let Ok(mut map) = self.failures.lock() else {
            return 0;
        };
        let n = map.entry(key.clone()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// The status we last wrote for `key`, if the cached object (at `resource_version`)
    /// is still the one that write replaced, i.e. the cache has not caught up yet.
    pub fn status_written_over(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) -> Option<AppServiceStatus> {
        let mut map = self.written.lock().ok()?;
        match map.get(key) {
            Some((base, status)) if Some(base.as_str()) == resource_version => Some(status.clone()),
            Some(_) => {
                // The cache moved past our write: the live status is authoritative again.
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Forgets the status we wrote for `key` if the cached object (at
    /// `resource_version`) has moved past the one that write replaced.
    pub fn drop_stale_status_write(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) {
        if let Ok(mut map) = self.written.lock()
            && map
                .get(key)
                .is_some_and(|(base, _)| Some(base.as_str()) != resource_version)
        {
            map.remove(key);
        }
    }

    /// Records that `status` was written over the object at `resource_version`.
    pub fn remember_status_write(
        &self,
        key: ObjectRef<AppService>,
        resource_version: String,
        status: AppServiceStatus,
    ) {
        if let Ok(mut map) = self.written.lock() {
            map.insert(key, (resource_version, status));
        }
    }

    /// Forgets everything about `key` (it is gone).
    pub fn forget(&self, key: &ObjectRef<AppService>) {
        self.reset_failures(key);
        if let Ok(mut map) = self.written.lock() {
            map.remove(key);
        }
        if let Ok(mut set) = self.created.lock() {
            let namespace = key.namespace.as_deref().unwrap_or_default();
            set.retain(|(_, ns, name)| !(ns == namespace && *name == key.name));
        }
    }

    /// Records that we created `child`: until the cache shows it, a miss in the cache
    /// means "not seen yet", not "absent" (creating it again would fail with 409).
    pub fn created(&self, child: ChildKey) {
        if let Ok(mut set) = self.created.lock() {
            set.insert(child);
        }
    }

    /// Whether we created `child` and the cache has not shown it yet.
    pub fn awaiting(&self, child: &ChildKey) -> bool {
        self.created.lock().is_ok_and(|set| set.contains(child))
    }

    /// The cache shows `child` (or the API server says it is gone): stop awaiting it.
    pub fn seen(&self, child: &ChildKey) {
        if let Ok(mut set) = self.created.lock()
            && !set.is_empty()
        {
            set.remove(child);
        }
    }

    /// Forgets the failures of `key` (after a success, or when it is gone).
    pub fn reset_failures(&self, key: &ObjectRef<AppService>) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
        }
    }
}
