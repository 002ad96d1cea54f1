//! The one shared context of reconcile, error policy and the ops server: what a pass
//! reads (client, configuration, caches, leadership) and what the controller remembers
//! between passes (failures, and its own writes: [`crate::own_writes`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use common::{AppService, AppServiceStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::Hooks;
use crate::config::Config;
use crate::error::BackoffPolicy;
use crate::external::External;
use crate::gateway_api::{HttpRoute, ReferenceGrant};
use crate::metrics::Metrics;
use crate::own_writes::OwnWrites;
use crate::status::Clock;
use crate::view::{
    AutoscalerView, BudgetView, CertificateView, DeploymentView, GrantView, IngressView, RouteView,
    ServiceView,
};

/// Initial-list completion of the caches, set from their watch streams.
#[derive(Debug, Default)]
pub struct CacheSync {
    pub appservices: AtomicBool,
    pub deployments: AtomicBool,
    pub services: AtomicBool,
    pub budgets: AtomicBool,
    pub autoscalers: AtomicBool,
    /// Set at start when no Gateway is configured (nothing to list).
    pub routes: AtomicBool,
    pub grants: AtomicBool,
    pub certificates: AtomicBool,
    pub ingresses: AtomicBool,
    pub gateway: AtomicBool,
    pub other_deployments: AtomicBool,
    pub other_services: AtomicBool,
    pub other_budgets: AtomicBool,
    pub other_autoscalers: AtomicBool,
    pub other_routes: AtomicBool,
    pub other_grants: AtomicBool,
    pub other_certificates: AtomicBool,
    pub other_ingresses: AtomicBool,
}

impl CacheSync {
    pub fn all(&self) -> bool {
        [
            &self.appservices,
            &self.deployments,
            &self.services,
            &self.budgets,
            &self.autoscalers,
            &self.routes,
            &self.grants,
            &self.certificates,
            &self.ingresses,
            &self.gateway,
            &self.other_deployments,
            &self.other_services,
            &self.other_budgets,
            &self.other_autoscalers,
            &self.other_routes,
            &self.other_grants,
            &self.other_certificates,
            &self.other_ingresses,
        ]
        .iter()
        .all(|f| f.load(Ordering::Relaxed))
    }
}

/// The watch caches reconcile reads from, and whether their initial lists are in.
pub struct Caches {
    /// Our children (labelled `managed-by=appservice-operator`), as views.
    pub deployments: Store<DeploymentView>,
    pub services: Store<ServiceView>,
    pub budgets: Store<BudgetView>,
    pub autoscalers: Store<AutoscalerView>,
    /// Empty when no Gateway is configured (`--expose-gateway`).
    pub routes: Store<RouteView>,
    pub grants: Store<GrantView>,
    /// Empty unless cert-manager is enabled (`--expose-cert-manager`).
    pub certificates: Store<CertificateView>,
    /// Empty unless the controller exposes through Ingresses (`--expose-ingress-class`).
    pub ingresses: Store<IngressView>,
    /// The configured Gateway (one object), for the listeners of `spec.expose.tls`.
    pub gateway: Store<crate::gateway_api::GatewayView>,
    /// The names of the objects of those kinds without that label.
    pub other_deployments: Store<PartialObjectMeta<Deployment>>,
    pub other_services: Store<PartialObjectMeta<Service>>,
    pub other_budgets: Store<PartialObjectMeta<PodDisruptionBudget>>,
    pub other_autoscalers: Store<PartialObjectMeta<HorizontalPodAutoscaler>>,
    pub other_routes: Store<PartialObjectMeta<HttpRoute>>,
    pub other_grants: Store<PartialObjectMeta<ReferenceGrant>>,
    pub other_certificates: Store<PartialObjectMeta<crate::cert_manager::Certificate>>,
    pub other_ingresses: Store<PartialObjectMeta<k8s_openapi::api::networking::v1::Ingress>>,
    /// Every AppService this controller serves (the one the Controller reconciles from):
    /// who holds a host name is decided over them ([`crate::exposure`]).
    pub appservices: Store<AppService>,
    /// Which caches have completed their initial list.
    pub synced: Arc<CacheSync>,
}

/// A child of `kind` (`"Deployment"`, `"Service"`) of an AppService. Children are named
/// after their AppService, so the AppService's reference names both.
pub type ChildKey = (&'static str, ObjectRef<AppService>);

pub struct Context {
    client: Client,
    config: Config,
    recorder: Recorder,
    clock: Box<dyn Clock>,
    metrics: Arc<Metrics>,
    /// External resources behind the finalizer.
    external: Arc<dyn External>,
    /// Image verification, when enabled.
    images: Option<Arc<dyn crate::image_gate::ImageGate>>,
    caches: Caches,
    /// True while this replica may reconcile: it leads, or (with sharding) it is a live
    /// member of the ring.
    leading: watch::Receiver<bool>,
    /// True while this replica holds the leader Lease (the same flag without sharding):
    /// what runs once per cluster (the orphan scan) follows it.
    leader: watch::Receiver<bool>,
    backoff_policy: BackoffPolicy,
    /// Consecutive failures per object; cleared by a successful reconcile.
    failures: Mutex<HashMap<ObjectRef<AppService>, u32>>,
    /// What this controller wrote that its caches may not show yet.
    own: OwnWrites,
    /// With sharding: what this member serves.
    share: Option<Arc<dyn crate::share::Share>>,
    /// The digests of the ConfigMaps and Secrets the Pods read, until their next event.
    digests: Arc<crate::config_revision::Digests>,
    /// AppServices a pass wakes besides its own (those waiting for a host name it
    /// releases); the controller reconciles what comes through.
    wake: Option<futures::channel::mpsc::UnboundedSender<ObjectRef<AppService>>>,
}

/// A poisoned lock is recovered: every map here stays consistent between statements, so
/// a reconcile that panicked cannot have left one half-updated.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Context {
    pub fn new(
        client: Client,
        config: Config,
        recorder: Recorder,
        hooks: Hooks,
        caches: Caches,
        leading: watch::Receiver<bool>,
    ) -> Self {
        Context {
            client,
            config,
            recorder,
            clock: hooks.clock,
            metrics: hooks.metrics,
            external: hooks.external,
            images: hooks.images,
            caches,
            leader: leading.clone(),
            leading,
            backoff_policy: BackoffPolicy::default(),
            failures: Mutex::default(),
            own: OwnWrites::default(),
            share: None,
            digests: Arc::default(),
            wake: None,
        }
    }

    /// The digests of the configuration the Pods read ([`crate::config_revision`]).
    pub fn digests(&self) -> &Arc<crate::config_revision::Digests> {
        &self.digests
    }

    /// With sharding: what this member serves gates its passes.
    pub fn with_share(mut self, share: Option<Arc<dyn crate::share::Share>>) -> Self {
        self.share = share;
        self
    }

    pub fn with_wake(
        mut self,
        wake: futures::channel::mpsc::UnboundedSender<ObjectRef<AppService>>,
    ) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Has the controller reconcile `keys` (a closed channel, at shutdown, is ignored).
    pub fn wake(&self, keys: Vec<ObjectRef<AppService>>) {
        if let Some(wake) = &self.wake {
            for key in keys {
                let _ = wake.unbounded_send(key);
            }
        }
    }

    pub fn share(&self) -> Option<&Arc<dyn crate::share::Share>> {
        self.share.as_ref()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn external(&self) -> &dyn External {
        self.external.as_ref()
    }

    /// Image verification, when enabled.
    pub fn images(&self) -> Option<&dyn crate::image_gate::ImageGate> {
        self.images.as_deref()
    }

    /// The external step's periodic work, if it has any (see [`External::background`]).
    pub fn external_background(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        self.external.clone().background(self.leader.clone())
    }

    /// With sharding, the leader Lease's flag, apart from the membership that gates
    /// reconciles.
    /// True while this replica holds the leader Lease: what runs once per cluster.
    pub fn ring_leader(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    pub fn with_ring_leader(mut self, leader: watch::Receiver<bool>) -> Self {
        self.leader = leader;
        self
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    pub fn backoff_policy(&self) -> &BackoffPolicy {
        &self.backoff_policy
    }

    /// The leadership flag, to wait on its changes.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Every cache has completed its initial list (what `/readyz` reports).
    pub fn is_ready(&self) -> bool {
        self.caches.synced.all()
    }

    /// Records a failure of `key`; returns how many failures preceded it.
    pub fn record_failure(&self, key: &ObjectRef<AppService>) -> u32 {
        let mut map = lock(&self.failures);
        let n = map.entry(key.clone()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// Forgets the failures of `key` (after a success, or when it is gone).
    pub fn reset_failures(&self, key: &ObjectRef<AppService>) {
        lock(&self.failures).remove(key);
    }

    /// The status we last wrote for `key`, if the cached object (at `resource_version`)
    /// is still the one that write replaced, i.e. the cache has not caught up yet.
    pub fn status_written_over(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) -> Option<AppServiceStatus> {
        self.own.status_over(key, resource_version, Instant::now())
    }

    /// Forgets the status we wrote for `key` if the cached object (at
    /// `resource_version`) has moved past the one that write replaced: the live status
    /// is authoritative again.
    pub fn drop_stale_status_write(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) {
        self.own
            .drop_stale_status(key, resource_version, Instant::now());
    }

    /// Records that `status` was written over the object at `resource_version`.
    pub fn remember_status_write(
        &self,
        key: ObjectRef<AppService>,
        resource_version: String,
        status: AppServiceStatus,
    ) {
        self.own
            .wrote_status(&key, resource_version, status, Instant::now());
    }

    /// Records that we released our finalizer from `key` at `resource_version`.
    pub fn remember_release(&self, key: ObjectRef<AppService>, resource_version: String) {
        self.own.released(&key, resource_version, Instant::now());
    }

    /// Whether the cached `key` at `resource_version` is the object we released our
    /// finalizer from: a cache that has not heard of the release yet, whose pass must not
    /// clean up a second time.
    pub fn released_from(
        &self,
        key: &ObjectRef<AppService>,
        resource_version: Option<&str>,
    ) -> bool {
        self.own
            .released_from(key, resource_version, Instant::now())
    }

    /// Records that the external cleanup of the deleting AppService `key`, the object
    /// of `uid`, succeeded: a deletion is never undone and no pass of a deleting object
    /// creates external state, so a later pass (after the finalizer's removal failed,
    /// say on a conflict) only has the finalizer left to remove.
    pub fn remember_cleanup(&self, key: &ObjectRef<AppService>, uid: String) {
        self.own.cleaned(key, uid, Instant::now());
    }

    /// Whether the external cleanup of `key`, the object of `uid`, succeeded already.
    pub fn cleaned_up(&self, key: &ObjectRef<AppService>, uid: &str) -> bool {
        self.own.cleaned_up(key, uid, Instant::now())
    }

    /// Forgets everything about `key` (it is gone) but its release and cleanup.
    pub fn forget(&self, key: &ObjectRef<AppService>) {
        self.reset_failures(key);
        self.own.forget(key);
    }

    /// Records that we created `child`: until the cache shows it, a miss in the cache
    /// means "not seen yet", not "absent" (creating it again would fail with 409).
    pub fn created(&self, (slot, owner): ChildKey) {
        self.own.created(&owner, slot, Instant::now());
    }

    /// Whether we created `child` and the cache has not shown it yet.
    pub fn awaiting(&self, (slot, owner): &ChildKey) -> bool {
        self.own.awaiting(owner, slot, Instant::now())
    }

    /// The cache shows `child` (or the API server says it is gone): stop awaiting it.
    pub fn seen(&self, (slot, owner): &ChildKey) {
        self.own.seen(owner, slot);
    }

    /// What we last wrote to `child`, if the cached object (at `resource_version`) is
    /// still the one that write replaced: the cache has not caught up, and deciding on
    /// it would write the same change again. Once the cache has moved on, it is
    /// authoritative again and the memory is dropped.
    pub fn child_written_over<V: Clone + 'static>(
        &self,
        (slot, owner): &ChildKey,
        resource_version: Option<&str>,
    ) -> Option<V> {
        self.own
            .child_over(owner, slot, resource_version, Instant::now())
    }

    /// Records that a write of `child` replaced the object at `replaced` with `written`.
    pub fn remember_child_write<V: Send + Sync + 'static>(
        &self,
        (slot, owner): ChildKey,
        replaced: String,
        written: V,
    ) {
        self.own
            .wrote_child(&owner, slot, replaced, written, Instant::now());
    }
}
