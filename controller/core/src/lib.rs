//! The core of the AppService controller: turns each AppService into a Deployment and a
//! Service, keeps them converged, and reports status users can trust.
//!
//! [`run`] wires it together; the `appservice-controller` binary (`controller/src/main.rs`)
//! only parses flags, builds the client and its providers, and waits for a signal, so
//! tests can run controllers in-process. A provider of external resources (the database
//! step, the crate `controller_database`) implements [`external::External`] and depends
//! on this crate, never the reverse.
//!
//! | module | holds |
//! | --- | --- |
//! | [`reconcile`] | one pass over an AppService: its steps, the status it writes once at the end, and the error policy |
//! | [`children`] | converging one child: look it up, create, apply or repair it |
//! | [`report`] | writing what a pass observed: status and Events |
//! | [`status_writer`] | the one writer of a status the controller owns (AppService, DatabaseClass, ImagePolicy): apply it once its caller found it changed |
//! | `finalizer` | the finalizer: on before side effects, released after external cleanup |
//! | `watches` | the caches: a reflector per watch, trimmed, with its backoff and sync flag |
//! | `owners` | which AppService a watched object wakes |
//! | [`desired`] | pure builders of the children |
//! | [`drift`] | whether a live child is what we want, and the patch that repairs it |
//! | [`status`] | pure status and condition computation, and the rollout assessment |
//! | [`view`] | what the caches keep of a child |
//! | [`external`] | the providers' contract: external resources behind the finalizer, and what a provider adds to the Pods |
//! | [`image_gate`] | the seam of image verification (the crate `controller_images`): the step that may hold an image back |
//! | [`image_verdict`] | what that step reports to a pass: pins, a hold, the images' status |
//! | [`error`](mod@error) | the error type, its retry classification, backoff |
//! | [`leader`] | Lease leader election |
//! | [`share`] | the seam of sharding (the crate `controller_sharding`): what this replica serves, asked by the gate, the write check and the watches |
//! | [`ring`] | what a share runs beside: its membership Lease, following its ring |
//! | [`following`] | the watches that follow a share's scope |
//! | [`fence`] | the check before every write of a member: its Lease is current |
//! | [`metrics`], [`ops`] | Prometheus metrics, `/healthz` `/readyz` `/metrics` |
//! | [`queue`] | the work queue's metrics, observed around kube-runtime's scheduler |
//! | [`client`] | the rate-limited client |
//! | [`config`] | flags |
//! | [`context`] | the one `Arc<Context>` shared by reconcile and the ops server |
//! | [`own_writes`] | the memory of the controller's own writes its caches may not show yet, with its bound |

pub mod cert_manager;
pub mod children;
pub mod client;
pub mod config;
pub mod config_revision;
pub mod context;
pub mod desired;
pub mod drift;
pub mod error;
pub mod exposure;
pub mod external;
pub mod fence;
mod finalizer;
pub mod following;
pub mod gateway_api;
pub mod image_gate;
pub mod image_verdict;
pub mod leader;
pub mod listeners;
pub mod metrics;
pub mod migrate;
pub mod ops;
pub mod optional_child;
mod outcome;
pub mod own_writes;
mod owners;
pub mod pod_trouble;
pub mod queue;
pub mod reconcile;
pub mod report;
pub mod ring;
pub mod share;
pub mod status;
pub mod status_writer;
pub mod subject;
pub mod view;
mod watches;

use std::sync::Arc;

use cert_manager::Certificate;
use common::AppService;
use common::names::{LABEL_MANAGED_BY, MANAGED_BY};
use futures::{FutureExt, StreamExt};
use gateway_api::{HttpRoute, ReferenceGrant};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

pub use config::{Config, RateLimit};
pub use context::{CacheSync, Context};
pub use status::{Clock, SystemClock};
use watches::{Watch, YieldBackoff, name_only};

/// Runs the controller until `shutdown` completes, then lets in-flight reconciles finish
/// (within the grace period) and releases the leader lease.
///
/// Returns an error if the leader-election task dies, or the ops server cannot start.
pub async fn run(
    config: Config,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    run_with(config, client, Hooks::default(), shutdown).await
}

/// Why [`run`] stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("leader election task died{}", panicked(.0))]
    LeaderElection(Option<tokio::task::JoinError>),
    #[error("ops server stopped")]
    OpsStopped,
    #[error("ops server failed: {0}")]
    Ops(std::io::Error),
    #[error("ops server task failed: {0}")]
    OpsTask(tokio::task::JoinError),
    #[error("controller stopped unexpectedly{}", panicked(.0))]
    Stopped(Option<tokio::task::JoinError>),
    #[error(
        "shard identity {0:?} is not a label value (at most 63 letters, digits, '-', '_', '.')"
    )]
    ShardIdentity(String),
    #[error("--namespace-selector needs --sharding: a ring owns the selected namespaces")]
    SelectorWithoutSharding,
    #[error("--sharded-watch needs --sharding")]
    ShardedWatchWithoutSharding,
    #[error(
        "this shard's membership Lease lapsed (not renewed within the renew deadline); restart to rejoin the ring"
    )]
    ShardLapsed,
    #[error("--sharding needs the sharding crate's share in the hooks (Hooks::share)")]
    NoShare,
}

/// `": <why>"` for a task that panicked or was cancelled; nothing for one that returned.
fn panicked(e: &Option<tokio::task::JoinError>) -> String {
    e.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
}

/// What a caller may inject into [`run_with`]: the clock, the metrics (so an in-process
/// test can read the counters), and the external resources behind the finalizer.
pub struct Hooks {
    pub clock: Box<dyn Clock>,
    pub metrics: Arc<metrics::Metrics>,
    pub external: Arc<dyn external::External>,
    /// With sharding: the fence every write passes ([`fence`]); give the same one to
    /// any other client that writes for this controller (the databases' Secrets).
    pub fence: fence::Fence,
    /// With sharding (required then): what this replica serves ([`share::Share`]); bound
    /// any other client that writes for this controller with it too.
    pub share: Option<Arc<dyn ring::Ringed>>,
    /// Image verification (`ImagePolicy`); none: images run as written.
    pub images: Option<Arc<dyn image_gate::ImageGate>>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            clock: Box::new(SystemClock),
            metrics: Arc::new(metrics::Metrics::default()),
            external: Arc::new(external::NoExternal),
            fence: fence::Fence::default(),
            share: None,
            images: None,
        }
    }
}

/// [`run`] with injected [`Hooks`].
pub async fn run_with(
    config: Config,
    client: Client,
    hooks: Hooks,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let mut config = config;
    let identity = config.identity();
    // With sharding the identity is a label value and the same for the whole run.
    config.identity = Some(identity.clone());
    if config.sharding && !common::namespace_selector::is_label_value(&identity) {
        return Err(RunError::ShardIdentity(identity));
    }
    if config.namespace_selector.is_some() && !config.sharding {
        return Err(RunError::SelectorWithoutSharding);
    }
    if config.sharded_watch && !config.sharding {
        return Err(RunError::ShardedWatchWithoutSharding);
    }
    let (leading_tx, leading_rx) = watch::channel(!config.leader_election);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Without sharding, reconciles follow leadership; with it, this shard's membership.
    let (member_tx, member_rx) = watch::channel(false);
    let gate_rx = if config.sharding {
        member_rx.clone()
    } else {
        leading_rx.clone()
    };
    // With sharding every write but a Lease's passes the fence (the Leases' own client
    // stays unfenced: they keep the fence open).
    let lease_client = client.clone();
    let client = if config.sharding {
        fence::fenced(client, hooks.fence.clone())
    } else {
        client
    };
    // With sharding, every write also stays within what this member serves.
    let ringed = match (config.sharding, &hooks.share) {
        (true, Some(share)) => Some(share.clone()),
        (true, None) => return Err(RunError::NoShare),
        (false, _) => None,
    };
    let share = ringed.clone().map(|r| r as Arc<dyn share::Share>);
    let client = match &share {
        Some(share) => share.clone().bound(client, &config.lease_namespace),
        None => client,
    };
    // Caches of our children (only objects with our managed-by label), as views: only
    // what reconcile reads. Touched, not applied: a deleted child must wake its owner.
    // With sharding, only this shard's.
    let child_config = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
        .any_semantic();
    let synced = Arc::new(CacheSync::default());
    let watch = Watch::new(&client, &config, &synced).following(share.clone());
    // Objects named like ours without our label: following the share alike.
    let watch_others = Watch::new(&client, &config, &synced).following(share.clone());
    let (deployments, deployment_stream) =
        watch.cached::<view::DeploymentView, _>(child_config.clone(), |_| {}, |s| &s.deployments);
    let (services, service_stream) =
        watch.cached::<view::ServiceView, _>(child_config.clone(), |_| {}, |s| &s.services);
    let (budgets, budget_stream) =
        watch.cached::<view::BudgetView, _>(child_config.clone(), |_| {}, |s| &s.budgets);
    let (autoscalers, autoscaler_stream) =
        watch.cached::<view::AutoscalerView, _>(child_config.clone(), |_| {}, |s| &s.autoscalers);
    // HTTPRoutes, ours and the names of others', only with a Gateway to attach them to:
    // without one the Gateway API need not be served, and these caches stay empty.
    let exposing = config.expose_gateway.is_some();
    let (routes, route_stream) = if exposing {
        let (store, stream) =
            watch.cached::<view::RouteView, _>(child_config.clone(), |_| {}, |s| &s.routes);
        (store, stream.boxed())
    } else {
        synced
            .routes
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let (grants, grant_stream) = if exposing {
        let (store, stream) =
            watch.cached::<view::GrantView, _>(child_config.clone(), |_| {}, |s| &s.grants);
        (store, stream.boxed())
    } else {
        synced
            .grants
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    // Ingresses instead of routes when no Gateway is named and an IngressClass is.
    let ingressing = !exposing && config.expose_ingress_class.is_some();
    let (ingresses, ingress_stream) = if ingressing {
        let (store, stream) =
            watch.cached::<view::IngressView, _>(child_config.clone(), |_| {}, |s| &s.ingresses);
        (store, stream.boxed())
    } else {
        synced
            .ingresses
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let certifying = (exposing || ingressing) && config.expose_cert_manager;
    let (certificates, certificate_stream) = if certifying {
        let (store, stream) = watch.cached::<view::CertificateView, _>(
            child_config.clone(),
            |_| {},
            |s| &s.certificates,
        );
        (store, stream.boxed())
    } else {
        synced
            .certificates
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    // The configured Gateway itself, one object (every member of a ring needs it): its
    // listeners are where `spec.expose.tls` adds HTTPS.
    let (gateway, gateway_stream) = match &config.expose_gateway {
        Some(gateway) => {
            let (store, stream) = watches::gateway(&client, gateway, &synced);
            (store, stream.boxed())
        }
        None => {
            synced
                .gateway
                .store(true, std::sync::atomic::Ordering::Relaxed);
            (reflector::store().0, futures::stream::pending().boxed())
        }
    };
    let (apps, app_stream) = watch.cached::<AppService, _>(
        watcher::Config::default().any_semantic(),
        view::slim_app,
        |s| &s.appservices,
    );
    let (deployment_stream, service_stream, budget_stream, autoscaler_stream, app_stream) = (
        deployment_stream.touched_objects(),
        service_stream.touched_objects(),
        budget_stream.touched_objects(),
        autoscaler_stream.touched_objects(),
        app_stream.applied_objects(),
    );

    // Deployments and Services without our label, metadata only, and of those only the
    // names (cluster-wide even with sharding: names are small): one named like an AppService is either a foreign object blocking it (its
    // deletion frees the name) or our own child whose label someone removed. Either way,
    // look again. Knowing every taken name also lets reconcile skip asking the API server
    // about a name nobody holds.
    let others_config = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}!={MANAGED_BY}"))
        .any_semantic();
    let (other_deployments, other_deployment_stream) = watch_others
        .cached::<PartialObjectMeta<Deployment>, _>(others_config.clone(), name_only, |s| {
            &s.other_deployments
        });
    let (other_services, other_service_stream) = watch_others
        .cached::<PartialObjectMeta<Service>, _>(others_config.clone(), name_only, |s| {
            &s.other_services
        });
    let (other_budgets, other_budget_stream) = watch_others
        .cached::<PartialObjectMeta<PodDisruptionBudget>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_budgets,
        );
    let (other_autoscalers, other_autoscaler_stream) =
        watch_others.cached::<PartialObjectMeta<HorizontalPodAutoscaler>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_autoscalers,
        );
    let (other_routes, other_route_stream) = if exposing {
        let (store, stream) = watch_others.cached::<PartialObjectMeta<HttpRoute>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_routes,
        );
        (store, stream.boxed())
    } else {
        synced
            .other_routes
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let (other_grants, other_grant_stream) = if exposing {
        let (store, stream) = watch_others.cached::<PartialObjectMeta<ReferenceGrant>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_grants,
        );
        (store, stream.boxed())
    } else {
        synced
            .other_grants
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let (other_certificates, other_certificate_stream) = if certifying {
        let (store, stream) = watch_others.cached::<PartialObjectMeta<Certificate>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_certificates,
        );
        (store, stream.boxed())
    } else {
        synced
            .other_certificates
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let (other_ingresses, other_ingress_stream) = if ingressing {
        let (store, stream) = watch_others.cached::<PartialObjectMeta<Ingress>, _>(
            others_config.clone(),
            name_only,
            |s| &s.other_ingresses,
        );
        (store, stream.boxed())
    } else {
        synced
            .other_ingresses
            .store(true, std::sync::atomic::Ordering::Relaxed);
        (reflector::store().0, futures::stream::pending().boxed())
    };
    let (ingress_stream, other_ingress_stream) = (
        ingress_stream.touched_objects(),
        other_ingress_stream.touched_objects(),
    );
    let (certificate_stream, other_certificate_stream) = (
        certificate_stream.touched_objects(),
        other_certificate_stream.touched_objects(),
    );
    let (route_stream, other_route_stream, grant_stream, other_grant_stream, gateway_stream) = (
        route_stream.touched_objects(),
        other_route_stream.touched_objects(),
        grant_stream.touched_objects(),
        other_grant_stream.touched_objects(),
        gateway_stream.touched_objects(),
    );
    let (
        other_deployment_stream,
        other_service_stream,
        other_budget_stream,
        other_autoscaler_stream,
    ) = (
        other_deployment_stream.touched_objects(),
        other_service_stream.touched_objects(),
        other_budget_stream.touched_objects(),
        other_autoscaler_stream.touched_objects(),
    );

    // The `<name>-database` Secrets: ours (labelled) and others named like them. Nothing
    // reads them from a cache (the database step reads the one Secret it needs), so
    // these are triggers only: metadata, no store, and never a Secret's data in memory.
    // Any change of ours (deleted, a key edited, its owner reference or a label changed)
    // or of a foreign one blocking the name wakes the AppService.
    let secret_stream = watch.triggers::<Secret>(child_config);
    let other_secret_stream = watch_others.triggers::<Secret>(others_config);
    // ConfigMaps: the Pods may read any of their namespace (`spec.config`, `env`). Metadata
    // only, as triggers: an event forgets the digest of its data and wakes the
    // AppServices that read it (`config_revision`). The Secrets' events above do the same.
    let config_map_stream =
        watch_others.triggers::<ConfigMap>(watcher::Config::default().any_semantic());

    // The work queue is observed around the Controller: each trigger stream counts.
    let queue = hooks.metrics.queue().clone();
    queue.set_max_concurrent(config.concurrency);
    let app_stream = queue::observe_apps(app_stream, queue.clone());

    // What a pass wakes besides itself (the AppServices waiting for a host name it frees).
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let reporter = Reporter {
        controller: common::names::FIELD_MANAGER.to_owned(),
        instance: Some(identity.clone()),
    };
    let fence = hooks.fence.clone();
    let verifier = hooks.images.clone();
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            config.clone(),
            Recorder::new(client.clone(), reporter),
            hooks,
            context::Caches {
                deployments: deployments.clone(),
                services: services.clone(),
                budgets: budgets.clone(),
                autoscalers: autoscalers.clone(),
                routes: routes.clone(),
                grants: grants.clone(),
                certificates: certificates.clone(),
                ingresses: ingresses.clone(),
                gateway,
                other_deployments,
                other_services,
                other_budgets,
                other_autoscalers,
                other_routes,
                other_grants,
                other_certificates,
                other_ingresses,
                appservices: apps.clone(),
                synced,
            },
            gate_rx.clone(),
        )
        .with_ring_leader(leading_rx.clone())
        .with_share(share.clone())
        .with_wake(wake_tx),
    );
    ctx.metrics().set_leader(*leading_rx.borrow());

    // Each event of a child, or of an object named like one, wakes the AppService it
    // belongs to (`owners::owner_of`: by group, kind and uid, whatever version the owner
    // reference names).
    let wakes = |apps: &reflector::Store<AppService>| {
        let apps = apps.clone();
        queue::observe_mapper(queue.clone(), move |meta: kube::api::ObjectMeta| {
            owners::owner_of(&apps, &meta)
        })
    };
    let (deployment_owner, service_owner, budget_owner, autoscaler_owner) =
        (wakes(&apps), wakes(&apps), wakes(&apps), wakes(&apps));
    let (other_deployment_owner, other_service_owner, other_budget_owner, other_autoscaler_owner) =
        (wakes(&apps), wakes(&apps), wakes(&apps), wakes(&apps));
    let (other_route_owner, grant_owner, other_grant_owner) =
        (wakes(&apps), wakes(&apps), wakes(&apps));
    let (certificate_owner, other_certificate_owner) = (wakes(&apps), wakes(&apps));
    let other_ingress_owner = wakes(&apps);
    // An event of our Ingress wakes its AppService and those waiting for one of its host
    // names, as a route's does.
    let ingress_owners = {
        let apps = apps.clone();
        queue::observe_mapper_all(queue.clone(), move |ingress: view::IngressView| {
            let owner = owners::owner_of(&apps, &ingress.metadata);
            let mut woken = exposure::waiting_for(
                &apps,
                &exposure::ingress_hostnames(&ingress),
                owner.as_ref(),
            );
            woken.extend(owner);
            woken
        })
    };
    // An event of the Gateway wakes the AppServices with listeners on it (at most 64, the
    // Gateway's own bound): theirs may have been edited, removed or (not) programmed.
    let gateway_readers = {
        let apps = apps.clone();
        queue::observe_mapper_all(queue.clone(), move |_: gateway_api::GatewayView| {
            listeners::with_tls(&apps)
        })
    };
    // An event of our route wakes its AppService and those waiting for one of its host
    // names (deleted with its AppService, or its host names changed, it may free one).
    let route_owners = {
        let apps = apps.clone();
        queue::observe_mapper_all(queue.clone(), move |route: view::RouteView| {
            let owner = owners::owner_of(&apps, &route.metadata);
            let mut woken =
                exposure::waiting_for(&apps, &exposure::route_hostnames(&route), owner.as_ref());
            woken.extend(owner);
            woken
        })
    };
    // An event of a ConfigMap or Secret: its digest is stale, and the AppServices that
    // read it (and, for a Secret, the one it belongs to or is named after) look again.
    let readers = |kind: common::ConfigKind| {
        let apps = apps.clone();
        let digests = ctx.digests().clone();
        let owned = kind == common::ConfigKind::Secret;
        queue::observe_mapper_all(queue.clone(), move |meta: kube::api::ObjectMeta| {
            let (Some(namespace), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref())
            else {
                return Vec::new();
            };
            digests.changed(kind, namespace, name);
            let mut woken = config_revision::readers(&apps, kind, namespace, name);
            if owned
                && let Some(key) = owners::owner_of(&apps, &meta)
                && !woken.contains(&key)
            {
                woken.push(key);
            }
            woken
        })
    };
    let (secret_owner, other_secret_owner, config_map_readers) = (
        readers(common::ConfigKind::Secret),
        readers(common::ConfigKind::Secret),
        readers(common::ConfigKind::ConfigMap),
    );
    let apps_for_queue = apps.clone();
    let apps_for_images = apps.clone();
    let apps_for_shard = apps.clone();

    let controller = Controller::for_stream(app_stream, apps)
        .with_config(controller::Config::default().concurrency(config.concurrency))
        // The controller backs off its merged trigger streams once more, by default up to
        // 30 s that are forgotten only after two quiet minutes. After an API server
        // restart every watch gets one "too old resource version" in turn, and each paused
        // all of them: caches stayed stale for many seconds. Each watch above backs off on
        // its own, so the merged stream only yields.
        .trigger_backoff(YieldBackoff)
        .watches_stream(deployment_stream, move |d: view::DeploymentView| {
            deployment_owner(d.metadata)
        })
        .watches_stream(service_stream, move |s: view::ServiceView| {
            service_owner(s.metadata)
        })
        .watches_stream(budget_stream, move |b: view::BudgetView| {
            budget_owner(b.metadata)
        })
        .watches_stream(autoscaler_stream, move |a: view::AutoscalerView| {
            autoscaler_owner(a.metadata)
        })
        .watches_stream(route_stream, route_owners)
        .watches_stream(grant_stream, move |g: view::GrantView| {
            grant_owner(g.metadata)
        })
        .watches_stream(
            other_grant_stream,
            move |g: PartialObjectMeta<ReferenceGrant>| other_grant_owner(g.metadata),
        )
        .watches_stream(gateway_stream, gateway_readers)
        .watches_stream(ingress_stream, ingress_owners)
        .watches_stream(
            other_ingress_stream,
            move |i: PartialObjectMeta<Ingress>| other_ingress_owner(i.metadata),
        )
        .watches_stream(certificate_stream, move |c: view::CertificateView| {
            certificate_owner(c.metadata)
        })
        .watches_stream(
            other_certificate_stream,
            move |c: PartialObjectMeta<Certificate>| other_certificate_owner(c.metadata),
        )
        .reconcile_on(wake_rx)
        .watches_stream(
            other_route_stream,
            move |r: PartialObjectMeta<HttpRoute>| other_route_owner(r.metadata),
        )
        .watches_stream(secret_stream, move |s: PartialObjectMeta<Secret>| {
            secret_owner(s.metadata)
        })
        .watches_stream(
            other_deployment_stream,
            move |d: PartialObjectMeta<Deployment>| other_deployment_owner(d.metadata),
        )
        .watches_stream(
            other_service_stream,
            move |s: PartialObjectMeta<Service>| other_service_owner(s.metadata),
        )
        .watches_stream(
            other_autoscaler_stream,
            move |a: PartialObjectMeta<HorizontalPodAutoscaler>| other_autoscaler_owner(a.metadata),
        )
        .watches_stream(
            other_budget_stream,
            move |b: PartialObjectMeta<PodDisruptionBudget>| other_budget_owner(b.metadata),
        )
        .watches_stream(other_secret_stream, move |s: PartialObjectMeta<Secret>| {
            other_secret_owner(s.metadata)
        })
        .watches_stream(config_map_stream, move |c: PartialObjectMeta<ConfigMap>| {
            config_map_readers(c.metadata)
        })
        // On gaining the lease, look at everything again: the previous leader may have died
        // half-way, and as a standby we skipped every event. (With sharding: on joining.)
        .reconcile_all_on(queue::observe_reconcile_all(
            leadership_gained(gate_rx.clone()),
            apps_for_queue,
            queue.clone(),
        ));
    // With sharding: buckets become usable once every cache has listed them, and
    // namespaces once the rings admit them; their AppServices (and, cheaply, the rest)
    // get a pass then.
    let controller = match &share {
        Some(share) => controller.reconcile_all_on(queue::observe_reconcile_all(
            share.gained(),
            apps_for_shard.clone(),
            queue.clone(),
        )),
        None => controller,
    };
    // Image verification: a policy's change reconciles every AppService, a Namespace's
    // label change those in it.
    let controller = match &verifier {
        Some(verifier) => {
            let (policy_changes, namespace_changes) =
                verifier.clone().watch(&client, apps_for_images.clone());
            controller
                .reconcile_all_on(queue::observe_reconcile_all(
                    policy_changes,
                    apps_for_images,
                    queue.clone(),
                ))
                .reconcile_on(namespace_changes)
        }
        None => {
            drop(apps_for_images);
            controller
        }
    };

    // The external step's periodic work (the orphan scan), stopped with the controller.
    let background = ctx.external_background().map(tokio::spawn);
    if let Some(verifier) = verifier {
        tokio::spawn(verifier.background(leading_rx.clone(), stop_rx.clone()));
    }

    follow_leadership_in_the_gauge(ctx.clone(), leading_rx.clone());
    let ops = start_ops_server(&config, ctx.clone(), stop_rx.clone());
    let (elector_stop_tx, elector_stop_rx) = watch::channel(false);
    let elector = start_election(
        &config,
        &lease_client,
        &identity,
        leading_tx,
        elector_stop_rx.clone(),
    );
    let (membership, claims_task) = match ringed {
        Some(ringed) => {
            let following = ringed.start(ring::Ring {
                ctx: ctx.clone(),
                lease_client: lease_client.clone(),
                identity: identity.clone(),
                apps: apps_for_shard,
                fence,
                member: member_tx,
                membership_stop: elector_stop_rx,
                stop: stop_rx.clone(),
            });
            (Some(following.membership), Some(following.ring))
        }
        None => {
            drop((member_tx, fence, apps_for_shard));
            (None, None)
        }
    };
    let lapsed = Box::pin(share::lapsed(member_rx));

    let controller_task = spawn_controller(controller, ctx.clone(), queue, stop_rx.clone());
    let mut tasks = Tasks {
        controller: controller_task,
        background,
        claims: claims_task,
        membership,
        lapsed,
        elector,
        elector_stop: elector_stop_tx,
        ops,
    };
    let failure = tasks.until_stopped(shutdown).await;
    tasks.stop(&stop_tx, &config).await;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs the controller's reconciles until `stop` turns true (in-flight ones finish).
fn spawn_controller(
    controller: Controller<AppService>,
    ctx: Arc<Context>,
    queue: Arc<queue::Queue>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let gone_ctx = ctx.clone();
    tokio::spawn(
        controller
            .graceful_shutdown_on(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .run(
                queue::observe_reconcile(reconcile::reconcile),
                queue::observe_error_policy(reconcile::error_policy),
                ctx,
            )
            .for_each(move |result| {
                // The object went away between event and reconcile: fine, and no longer queued.
                if let Err(controller::Error::ObjectNotFound(obj)) = &result
                    && let Some(namespace) = &obj.namespace
                {
                    let key = reflector::ObjectRef::new(&obj.name).within(namespace);
                    queue.forget(&key);
                    // Gone with our finalizer removed by someone else: held no more.
                    gone_ctx.metrics().set_held(&key, None);
                }
                async move {
                    match result {
                        Ok(_) => {}
                        Err(controller::Error::ObjectNotFound(_)) => {}
                        Err(controller::Error::ReconcilerFailed(..)) => {}
                        Err(e) => warn!(error = %e, "controller stream error"),
                    }
                }
            }),
    )
}

/// The tasks of a running controller.
struct Tasks {
    controller: tokio::task::JoinHandle<()>,
    /// The external step's periodic work (the orphan scan).
    background: Option<tokio::task::JoinHandle<()>>,
    /// With sharding: the claims task, the membership Lease, and what completes once
    /// that membership lapsed.
    claims: Option<tokio::task::JoinHandle<()>>,
    membership: Option<tokio::task::JoinHandle<()>>,
    lapsed: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    elector: Option<tokio::task::JoinHandle<()>>,
    elector_stop: watch::Sender<bool>,
    ops: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Tasks {
    /// Until `shutdown` completes (`None`) or a task stops that must not (its error).
    async fn until_stopped(
        &mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Option<RunError> {
        let shutdown = shutdown.fuse();
        tokio::pin!(shutdown);
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutting down");
                None
            }
            r = async { match self.elector.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                // Returned, not logged here: the caller reports it once.
                Some(RunError::LeaderElection(r.err()))
            }
            r = async { match self.ops.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                self.ops = None;
                Some(match r {
                    Ok(Ok(())) => RunError::OpsStopped,
                    Ok(Err(e)) => RunError::Ops(e),
                    Err(e) => RunError::OpsTask(e),
                })
            }
            r = &mut self.controller => Some(RunError::Stopped(r.err())),
            _ = &mut self.lapsed => Some(RunError::ShardLapsed),
        }
    }

    /// Stops reconciling first (in-flight reconciles get the grace period), then the
    /// background work and the claims task, then releases the Leases, so the next leader never overlaps with
    /// us; the ops server last.
    async fn stop(mut self, stop: &watch::Sender<bool>, config: &Config) {
        let _ = stop.send(true);
        if !self.controller.is_finished()
            && tokio::time::timeout(config.shutdown_grace, &mut self.controller)
                .await
                .is_err()
        {
            warn!("in-flight reconciles did not finish within the grace period; aborting them");
            self.controller.abort();
        }
        if let Some(handle) = self.background {
            handle.abort();
        }
        if let Some(handle) = self.claims {
            let _ = handle.await;
        }
        let _ = self.elector_stop.send(true);
        if let Some(handle) = self.membership
            && !handle.is_finished()
        {
            let _ = tokio::time::timeout(config.renew_deadline, handle).await;
        }
        if let Some(handle) = self.elector
            && !handle.is_finished()
        {
            let _ = tokio::time::timeout(config.renew_deadline, handle).await;
        }
        if let Some(handle) = self.ops {
            let _ = handle.await;
        }
    }
}

/// Keeps the leader gauge on what the election says.
fn follow_leadership_in_the_gauge(ctx: Arc<Context>, mut leading: watch::Receiver<bool>) {
    tokio::spawn(async move {
        while leading.changed().await.is_ok() {
            let now = *leading.borrow_and_update();
            ctx.metrics().set_leader(now);
        }
    });
}

/// The ops server (`/healthz`, `/readyz`, `/metrics`), when configured; it stops when
/// `stop` turns true.
fn start_ops_server(
    config: &Config,
    ctx: Arc<Context>,
    mut stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<std::io::Result<()>>> {
    let addr = config.ops_addr?;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    Some(tokio::spawn(ops::serve(addr, ctx, shutdown)))
}

/// The leader election on the Lease, when enabled; it says who leads through `leading`
/// and releases the lease when `stop` turns true. Without it this replica leads, and
/// `leading` is kept open (a dropped sender would read as "leadership changed").
fn start_election(
    config: &Config,
    client: &Client,
    identity: &str,
    leading: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !config.leader_election {
        drop(stop);
        tokio::spawn(async move {
            leading.closed().await;
        });
        return None;
    }
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &config.lease_namespace);
    let elector = leader::Elector::new(
        lease_api,
        leader::ElectionConfig {
            lease_name: config.lease_name.clone(),
            identity: identity.to_owned(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
        },
    );
    info!(identity = %identity, lease = %config.lease_name, namespace = %config.lease_namespace, "leader election enabled");
    Some(tokio::spawn(elector.run(leading, stop)))
}

/// A stream that yields each time `leading` turns true.
fn leadership_gained(leading: watch::Receiver<bool>) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(leading, |mut rx| async move {
        loop {
            if rx.changed().await.is_err() {
                return None;
            }
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}
